"""Family `grouplanes`: depthwise or small groups in channels last, the groups' channels in the
vector lanes (every pixel's channels one contiguous load). Where it fits (`fits`) it is the
default, first among the candidates, for every kernel op.

- Forward and data gradient: a register tile of NB vectors of channels x PB pixels; small groups
  (M = 2, 4 or 8 channels on both sides) spread each input vector's channel m of every group across
  the group's lanes (a shuffle) against per-lane weights. Large results stored past the caches.
- Weight gradient: each group's grad_output channels spread across its lanes once per pixel, for
  every tap; the output rows cut into MIN_ITEMS fixed parts whose sums are added in order.
"""

from __future__ import annotations

import math

from ..ir import Layout
from ..plan import KOp, Plan, Tiling
from ..target import TargetKind
from .family import Family
from .work import MIN_ITEMS, SPARE_REGISTERS, STREAM_L2S, bf16_pairs, vector_lanes

NAME = "grouplanes"
WHY = ("depthwise or small groups in channels last: the groups' channels in the vector lanes, a register "
       "tile of channel vectors x pixels, every pixel's channels one contiguous load")
TEMPLATES = {KOp.FWD: "cpu/grouplanes_fwd.cpp.j2", KOp.DGRAD: "cpu/grouplanes_dgrad.cpp.j2",
             KOp.WGRAD: "cpu/grouplanes_wgrad.cpp.j2"}

# Register tile of the forward and data gradient: at most this many vectors of channels x this many
# pixels.
GROUPLANES_VECTORS = 2
GROUPLANES_PIXELS = 4


def fits(plan: Plan) -> bool:
    """Whether the grouplanes kernels compute this kernel op: one channel per group on both sides
    (depthwise, multiplier 1), or small groups (M = 2, 4 or 8 channels on both sides, whole groups
    per vector), with channels the contiguous axis of input and output, so that one vector load
    takes a run of groups. Where they fit they are the default: they ran faster than every other
    candidate. (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", grouplanes.fits)"""
    g = plan.geometry
    lanes = vector_lanes(plan)
    small = g.cin_g == g.cout_g and g.cin_g > 1 and lanes % g.cin_g == 0
    return (g.groups > 1 and (g.cin_g == 1 and g.cout_g == 1 or small) and few_channels(plan) is None and
            all(plan.layout_of(kind) is Layout.CHANNELS_LAST for kind in ("X", "Y")))


def few_channels(plan: Plan) -> str | None:
    """Why a pixel's channels would leave most of a vector's lanes idle (fewer than half of them:
    an RGB image's 3 in 16), or None. Such problems go to the kernels with pixels in the lanes
    (depthwise planes, blocked), even though channels are the contiguous axis: they ran several
    times faster. (figures: BENCHMARKS.md, 2026-12-02 (second session), "few channels in channels last")"""
    g = plan.geometry
    lanes = vector_lanes(plan)
    channels = g.groups * g.cin_g
    if 2 * channels >= lanes:
        return None
    return f"{channels} channels a pixel fill {channels} of {lanes} lanes"


def _stream(plan: Plan) -> int:
    """The result bytes per call from which the forward and data gradient store past the caches
    (0: never): x86 targets, pixels of whole 64-byte lines (every store of a channel vector then
    fills whole lines with the tile's others). Unlike the lanes data gradient's, both gain: these
    kernels do little arithmetic per value, and a cached store first reads the line.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", grouplanes._stream)"""
    g, t, p = plan.geometry, plan.target, plan.problem
    if t.kind is not TargetKind.CPU or t.isa not in ("avx2", "avx512"):
        return 0
    if (g.groups * g.cin_g * p.dtype.itemsize) % 64:
        return 0
    return STREAM_L2S * t.l2_bytes


def grouplanes_tile(vectors: int, registers: int) -> tuple[int, int]:
    """(NB, PB) of the grouplanes forward and data gradient: NB vectors of channels x PB pixels,
    with NB weight vectors and one input vector in registers, SPARE_REGISTERS left free."""
    nb = max(1, min(GROUPLANES_VECTORS, vectors))
    pb = max(1, min(GROUPLANES_PIXELS, (registers - SPARE_REGISTERS - nb - 1) // nb))
    return nb, pb


# The weight gradient's parts of the reduction take at least this many output pixels of the batch each
# (up to MIN_ITEMS parts): each part's sums are zeroed and added to the others' (as many values as a
# pixel's products), which for a small batch of small images cost more than the products.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", GROUPLANES_PART_PIXELS)
GROUPLANES_PART_PIXELS = 64


def _wgrad(plan: Plan, lanes: int) -> Plan:
    g = plan.geometry
    splits, m = MIN_ITEMS, g.cin_g
    per = (f"{g.kernel[2]} vectors of partial sums (one per kernel column)" if m == 1 else
           f"{m} x {g.kernel[2]} vectors of partial sums (one per group channel of grad_output, spread across "
           f"the group's lanes once per pixel, and kernel column)")
    tiling = Tiling(vector_lanes=lanes, splits=splits, part_pixels=GROUPLANES_PART_PIXELS, rows_at_once=True,
                    threads_hint=f"parallel over up to {splits} fixed parts of the output rows (one per "
                                 f"{GROUPLANES_PART_PIXELS} output pixels of the batch); each part keeps its "
                                 f"own sums, added in order at the end, so results do not depend on the thread "
                                 f"count")
    return plan.decide("tiling", f"{math.ceil(g.groups * m / lanes)} vectors of {lanes} channels; per output "
                                 f"row, channel vector and input row, {per} in registers, added to the part's "
                                 f"sums in double (the row's input rows in one walk of its pixels where their sums "
                                 f"fit three quarters of the vector registers: grad_output loaded once a pixel, "
                                 f"and at unit stride and dilation each input pixel once a row, by a sliding "
                                 f"window); {tiling.threads_hint}",
                       tiling=tiling)


def tile(plan: Plan) -> Plan:
    """Depthwise in channels last: the groups in the vector lanes."""
    g, t = plan.geometry, plan.target
    lanes = vector_lanes(plan)
    if plan.kop is KOp.WGRAD:
        return _wgrad(plan, lanes)
    vectors = math.ceil(g.groups * g.cin_g / lanes)   # channel vectors (groups of M channels: M per group)
    nb, pb = grouplanes_tile(vectors, t.vector_registers)
    rows = math.prod(g.y_size[:2]) if plan.kop is KOp.FWD else math.prod(g.x_size[:2])
    # rows of one image x channel chunks: at least MIN_ITEMS items per image when the channels allow
    chunks = max(1, min(math.ceil(vectors / nb), math.ceil(MIN_ITEMS / rows)))
    cch = math.ceil(math.ceil(vectors / chunks) / nb) * nb
    what = "output" if plan.kop is KOp.FWD else "input-gradient"
    stream = _stream(plan)
    edges = _edge_tiles(plan, pb)
    pairs = in_pairs(plan)
    tiling = Tiling(vector_lanes=lanes, kb=pb, nv=nb, ksb=cch, stream_bytes=stream, edge_tiles=edges, pairs=pairs,
                    threads_hint=f"parallel over (batch, {what} row, chunk of {cch} channel vectors)")
    slide = ("; one channel per group: the tile slides along the row, each column it reads loaded once for "
             "every pixel and tap it serves" if g.cin_g == 1 else "")
    streamed = (f"; results of {stream >> 20} MB or more per call written with non-temporal stores (a cached "
                f"store first reads each line)" if stream else "")
    pixels = "output pixels" if plan.kop is KOp.FWD else "input-gradient columns of one stride phase"
    slide += ("; the columns meeting the padding at each end of a row in one tile a side" if edges else "")
    slide += (f"; bf16 in pairs of the group's channels on vdpbf16ps (one word shuffle and one step for two "
              f"channels, {g.cin_g // 2} steps a group)" if pairs else "")
    return plan.decide("tiling", f"register tile {nb} vectors of {lanes} channels x {pb} {pixels} "
                                 f"({nb * pb} of {t.vector_registers} registers accumulate){slide}; input and output "
                                 f"read and written in place{streamed}; {tiling.threads_hint}", tiling=tiling)


def in_pairs(plan: Plan) -> bool:
    """Whether the forward or data gradient of small groups (an even M) reduces bf16 in pairs of the
    group's channels on vdpbf16ps (bf16_pairs' targets): each step one shuffle of 32-bit words (two
    stored channels) and one vdpbf16ps, where unpaired each channel took a widening load, a shuffle
    and an FMA. Zen 4, channels last, kernel alone, 2 threads, ms, unpaired / pairs: regnet_g8 (8
    groups of 8 at 56x56) forward 1.86 / 0.64, data gradient 1.83 / 0.70; rnx_g32_256 (32 groups of
    8 at 28x28) 1.94 / 0.74, 1.93 / 0.75.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", grouplanes.in_pairs)"""
    g = plan.geometry
    return bf16_pairs(plan) and g.cin_g > 1 and g.cin_g % 2 == 0 and plan.kop in (KOp.FWD, KOp.DGRAD)


def _edge_columns(plan: Plan) -> tuple[int, int]:
    """The forward's output columns at the start and at the end of a row whose window meets the
    padding (OW_LO and YW - OW_HI of templates/cpu/grouplanes.j2)."""
    g = plan.geometry
    (x, y), (s, p, k, d) = (g.x_size[2], g.y_size[2]), (g.stride[2], g.pad_lo[2], g.kernel[2], g.dilation[2])
    lo = min(y, max(-((kw * d - p) // s) for kw in range(k)))
    hi = max(lo, min(y, min((x - 1 + p - kw * d) // s + 1 for kw in range(k))))
    return lo, y - hi


def _edge_tiles(plan: Plan, pb: int) -> bool:
    """Whether the depthwise forward takes the columns meeting the padding at each end of a row in one
    tile a side (each tap tested per pixel) rather than a tile per column: where a side has 2 to PB
    of them (5x5 taps and wider with unit strides). One column at a time, each tile loaded every tap's
    weights for one pixel. Zen 4, channels last, kernel alone, 2 threads, edge tiles / a tile a
    column: eff_dw5_1152_7 (5x5 at 7x7) f32 0.78, bf16 0.82; eff_dw5_240 (5x5 at 28x28) 0.89, 0.94;
    3x3 taps (one column a side) 0.94-1.03, and small groups (M = 8) 1.08-1.15: neither takes them.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", grouplanes._edge_tiles)"""
    if plan.kop is not KOp.FWD or plan.geometry.cin_g != 1:
        return False
    sides = _edge_columns(plan)
    return max(sides) >= 2 and max(sides) <= pb


def join(plan: Plan, candidates: tuple[str, ...]) -> tuple[str, ...]:
    """First, where it fits."""
    return (NAME,) + candidates if fits(plan) else candidates


# The weight gradient of small groups (M > 1 channels a group) spreads each grad_output vector across
# the group's lanes for every tap: with many taps or few pixels a group it lost to the other kernels
# (Xeon, f32, channels last, 8 images, kernel alone, grouplanes / lanes: M=8 at 7x7 pixels 3x3 taps 6.2x
# slower, 14x14 1.7x, 28x28 0.60; M=4 at 7x7 1.23, 14x14 0.40; 5x7 or 7x7 taps 2.8-22x slower for M 4
# and 8 at every size measured; depthwise, M=1, won everywhere: 0.04-0.57). So small groups take it only
# from SMALL_WGRAD_PIXELS output pixels a channel of the group and at most SMALL_WGRAD_TAPS taps.
# (figures: BENCHMARKS.md, "2026-12-03", grouplanes.rule)
SMALL_WGRAD_PIXELS = 49
SMALL_WGRAD_TAPS = 9


def _small_wgrad_loses(plan: Plan) -> bool:
    g = plan.geometry
    return (plan.kop is KOp.WGRAD and g.cin_g > 1 and
            (math.prod(g.kernel) > SMALL_WGRAD_TAPS or math.prod(g.y_size) < SMALL_WGRAD_PIXELS * g.cin_g))


def rule(plan: Plan, candidates: tuple[str, ...], choice: str, why: str) -> tuple[str, str]:
    """Its kernel ops wherever it fits, but the weight gradients of small groups with many taps or few
    pixels (_small_wgrad_loses)."""
    if NAME not in candidates:
        return choice, why
    if _small_wgrad_loses(plan) and "lanes" in candidates:
        g = plan.geometry
        return "lanes", (f"channels in the vector lanes, input values broadcast; not grouplanes: a weight "
                         f"gradient of {g.cin_g}-channel groups over {math.prod(g.kernel)} taps and "
                         f"{math.prod(g.y_size)} output pixels")
    return NAME, WHY


FAMILY = Family(NAME, WHY, TEMPLATES, tile, join=join, rule=rule)
