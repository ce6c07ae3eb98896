"""Family `depthwise`: one (image, channel) plane or channel per work item.

- Forward and data gradient (the "planes" kernel, depthwise_planes.cpp.j2): one channel per group
  on both sides, unit strides, at most two spatial axes (`fits`); each plane copied into a
  zero-padded buffer whose rows share one pitch, each tap one flat run of vectors. The default
  where it fits and grouplanes does not.
- Weight gradient: one input channel per group (`wgrad_fits`; the default where the problem is
  depthwise): per-tap vector partial sums over rows, or over whole planes where those pay.

`plane_layout` (the planes of one row pitch) is shared with the planes weight gradient (planes.py).
"""

from __future__ import annotations

import math

from ..ir import DType, Layout
from ..plan import Geometry, KOp, Plan, Tiling
from .family import Family
from .work import SPARE_REGISTERS, vector_lanes

NAME = "depthwise"
WHY = ("one (image, channel) plane or channel per item: forward and data gradient over a zero-padded copy "
       "of the plane, each tap a flat run; weight gradient per-tap vector partial sums over rows or "
       "planes")
TEMPLATES = {KOp.FWD: "cpu/depthwise_planes.cpp.j2", KOp.DGRAD: "cpu/depthwise_planes.cpp.j2",
             KOp.WGRAD: "cpu/depthwise_wgrad.cpp.j2"}
# Why the planes kernel is the default for a forward or data gradient where it fits (and grouplanes
# does not). (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", PLANES_WHY)
PLANES_WHY = ("one (image, channel) plane per item, copied into a zero-padded buffer whose rows share one pitch: "
              "each tap one flat run of vectors, no per-row work")

# --- forward and data gradient over planes
# Output vectors the planes kernel accumulates at once (each tap's weight broadcast once for all).
PLANES_VECTORS = 8
# The planes kernel steps its taps in assembly (fma_tile) for 2-D kernels of more than 9 taps on
# planes of at least this many vectors, where GCC's vector code spills; elsewhere the C step ran
# faster. (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", PLANES_ASM_VECTORS)
PLANES_ASM_VECTORS = 64
# On AVX-512 (32 vector registers) the planes kernel takes column tiles instead of flat runs where
# the kernel has more than one row: this many output rows x one vector of columns, the row pitch
# rounded up to whole vectors, so that each input row the tile reaches is loaded once per tap column
# for every output row it serves (a flat run loads for every FMA, most loads split across cache
# lines). The AVX2 shape keeps the flat runs: a tile's accumulators and 9 weights outgrow its 16
# registers. (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", PLANES_COLUMN_ROWS)
# Where an output row fits in half a vector (7x7 and 8x8 planes, at most 8 columns) the column tiles
# take half vectors (8 lanes: ymm, still with AVX-512's 32 registers and masked tails): a 16-lane
# vector over a 7-wide row computed 9 dropped columns for 7 kept. (figures: BENCHMARKS.md, "Figures
# behind codegen's CPU rules", PLANES_COLUMN_ROWS: half vectors)
PLANES_COLUMN_ROWS = 8

# --- weight gradient: over whole planes or rows
# Whole planes as one flat run (unit strides) where the output rows are narrower than this: per-row
# work and each row's vector padding then cost more than copying the planes.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", PLANES_BELOW_WIDTH)
PLANES_BELOW_WIDTH = 32
# Wider rows take the planes too where both plane buffers fit in PLANES_L1_SHARE of the L1 and a row
# is at most PLANES_ROW_VECTORS vectors (or the problem is 1-D: a plane is one row): the rows kernel
# pays per row (each row's edge vectors read back from the copy just written, a store-forwarding
# stall per load; the taps' sums added in memory), which few vectors per row do not amortize.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", PLANES_L1_SHARE)
PLANES_L1_SHARE = 0.85
PLANES_ROW_VECTORS = 5
# Types stored narrower than their accumulator (bf16) cannot read grad_output rows in place: the
# rows kernel copies every row and reads it back at once (a store-forwarding stall per vector), so
# they take the planes wherever both buffers fit this share of the L2.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", PLANES_NARROW_L2_SHARE)
PLANES_NARROW_L2_SHARE = 0.5
# Taps per pass over the planes: at most the template's `#pragma GCC unroll` of its tap loop (past
# it the partial sums went to memory).
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", PLANES_MAX_TAPS_PER_PASS)
PLANES_MAX_TAPS_PER_PASS = 16


def fits(plan: Plan) -> bool:
    """Whether the depthwise planes kernel computes this forward or data gradient: one channel per
    group on both sides, unit strides, at most two spatial axes."""
    g = plan.geometry
    return (plan.kop in (KOp.FWD, KOp.DGRAD) and g.groups > 1 and g.cin_g == 1 and g.cout_g == 1 and
            g.stride == (1, 1, 1) and g.kernel[0] == 1 and g.x_size[0] == 1 and g.y_size[0] == 1)


def wgrad_fits(plan: Plan) -> bool:
    """Whether the depthwise weight gradient computes this kernel op: one input channel per group."""
    return plan.kop is KOp.WGRAD and plan.geometry.cin_g == 1


def wgrad_first(plan: Plan) -> bool:
    """Whether the depthwise weight gradient is the default (listed first): where the problem is
    depthwise; one input channel without groups (a raw-audio front end) ran far slower on it than
    on lanes. (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", depthwise.wgrad_first)"""
    return plan.geometry.groups > 1


def plane_layout(g: Geometry, lanes: int) -> tuple[int, int, int]:
    """(vectors of a grad_output plane, values of an input plane (of one stride phase), the taps'
    reach) in the zero-padded planes of one row pitch of the weight gradients over planes
    (templates/cpu/planes.j2)."""
    (kd, kh, kw), (dd, dh, dw), (pd, ph, pw) = g.kernel, g.dilation, g.pad_lo
    (xd, xh, xw), (yd, yh, yw), (sd, sh, sw) = g.x_size, g.y_size, g.stride
    qd, qh, qw = (kd - 1) * dd // sd, (kh - 1) * dh // sh, (kw - 1) * dw // sw
    pitch, rh = max(yw + qw, -(-(pw + xw) // sw)), max(yh + qh, -(-(ph + xh) // sh))
    rd = max(yd + qd, -(-(pd + xd) // sd))
    nvec = -(-((yd - 1) * rh * pitch + (yh - 1) * pitch + yw) // lanes)
    reach = qd * rh * pitch + qh * pitch + qw
    return nvec, max(rd * rh * pitch, reach + nvec * lanes), reach


def depthwise_plane_bytes(g: Geometry, lanes: int, acc_bytes: int) -> int:
    """Bytes of the depthwise weight gradient's two plane buffers (as depthwise_wgrad.cpp.j2 sizes them)."""
    nvec, x_plane, _ = plane_layout(g, lanes)
    return (x_plane + nvec * lanes) * acc_bytes


def _planes_why(plan: Plan, lanes: int) -> str | None:
    """Why the weight gradient takes whole planes (PLANES_BELOW_WIDTH, PLANES_NARROW_L2_SHARE,
    PLANES_L1_SHARE with PLANES_ROW_VECTORS), or None where it takes rows."""
    g, p, t = plan.geometry, plan.problem, plan.target
    plane_bytes = depthwise_plane_bytes(g, lanes, p.dtype.accumulator.itemsize)
    narrow = p.dtype.accumulator is not p.dtype
    if not (g.stride == (1, 1, 1) and g.groups > 1):
        return None
    if g.y_size[2] < PLANES_BELOW_WIDTH:
        return f"output rows narrower than {PLANES_BELOW_WIDTH}"
    if narrow and plane_bytes <= PLANES_NARROW_L2_SHARE * t.l2_bytes:
        return (f"{p.dtype.value} rows cannot be read in place and both planes ({plane_bytes >> 10} KB) fit in "
                f"{PLANES_NARROW_L2_SHARE:.0%} of the L2")
    if (plane_bytes <= PLANES_L1_SHARE * t.l1_bytes
            and (math.ceil(g.y_size[2] / lanes) <= PLANES_ROW_VECTORS or g.y_size[:2] == (1, 1))):
        row = "the problem is 1-D" if g.y_size[:2] == (1, 1) else f"a row is at most {PLANES_ROW_VECTORS} vectors"
        return f"both planes ({plane_bytes >> 10} KB) fit in {PLANES_L1_SHARE:.0%} of the L1 and " + row
    return None


def _wgrad_planes(plan: Plan, lanes: int, why: str) -> Plan:
    """The weight gradient over whole planes, `why` it takes them."""
    g, t = plan.geometry, plan.target
    taps = g.kernel[0] * g.kernel[1] * g.kernel[2]
    # taps per pass over the plane: their sums, the grad_output vector and one input vector
    # in registers, SPARE_REGISTERS left free, and no more than the tap loop unrolls
    tb = max(1, min(taps, t.vector_registers - 2 - SPARE_REGISTERS, PLANES_MAX_TAPS_PER_PASS))
    passes = math.ceil(taps / tb)
    tb = math.ceil(taps / passes)
    tiling = Tiling(vector_lanes=lanes, kb=tb, planes=True,
                    threads_hint="parallel over output channels; each item owns its channel's taps and "
                                 "reduces in a fixed order, so results do not depend on the thread count")
    return plan.decide("tiling", f"unit strides, {why}: per image, input and grad_output planes copied into "
                                 f"zero-padded buffers of one row pitch, each tap a flat dot product of "
                                 f"vectors of {lanes}; {tb} taps per pass over the plane ({passes} "
                                 f"pass{'es' if passes > 1 else ''}); {tiling.threads_hint}", tiling=tiling)


def _wgrad(plan: Plan, lanes: int) -> Plan:
    """The weight gradient: over whole planes where they pay (_planes_why), else over rows."""
    why = _planes_why(plan, lanes)
    if why:
        return _wgrad_planes(plan, lanes, why)
    g, p = plan.geometry, plan.problem
    unit = p.dtype.accumulator is p.dtype
    layouts = dict(plan.layouts)
    in_place = []
    if unit and layouts["Y"] is Layout.CONTIGUOUS and g.y_size[2] % lanes == 0:
        in_place.append("Y")
    if unit and layouts["X"] is Layout.CONTIGUOUS and g.stride[2] == 1:
        in_place.append("X-row")   # the interior of each input row is copied with one memcpy
    tiling = Tiling(vector_lanes=lanes, in_place=tuple(in_place),
                    threads_hint="parallel over output channels; each item owns its channel's taps and reduces "
                                 "in a fixed order, so results do not depend on the thread count")
    return plan.decide("tiling", f"rows of {g.y_size[2]} in {math.ceil(g.y_size[2] / lanes)} vectors of {lanes}, "
                                 f"one vector of partial sums per tap; grad_output rows "
                                 f"{'read in place' if 'Y' in in_place else 'copied'}, input rows copied "
                                 f"{'with one memcpy each' if 'X-row' in in_place else 'element by element'}; "
                                 f"{tiling.threads_hint}", tiling=tiling)


def _planes(plan: Plan, lanes: int) -> Plan:
    """Depthwise forward or data gradient (multiplier 1, unit strides) over whole zero-padded planes."""
    g = plan.geometry
    _, out_h, out_w = g.y_size if plan.kop is KOp.FWD else g.x_size      # the plane each item writes
    pitch = out_w + (g.kernel[2] - 1) * g.dilation[2]
    vectors = math.ceil(out_h * pitch / lanes)
    u = max(1, min(PLANES_VECTORS, vectors))
    taps = g.kernel[1] * g.kernel[2]
    if plan.target.isa == "avx512" and g.kernel[1] > 1 and out_h > 1:
        half = plan.problem.dtype in (DType.F32, DType.BF16) and out_w <= lanes // 2   # with masked tails
        lanes = lanes // 2 if half else lanes
        rows = min(PLANES_COLUMN_ROWS, out_h)
        pitch = math.ceil(pitch / lanes) * lanes
        tiling = Tiling(vector_lanes=lanes, kb=1, rb=rows, planes=True,
                        threads_hint="parallel over (image, channel) planes")
        halves = f", half vectors of {lanes} lanes (output rows of {out_w})" if half else ""
        return plan.decide("tiling", f"each plane copied into a zero-padded buffer of row pitch {pitch} (whole "
                                     f"vectors{halves}): tiles of {rows} output rows x one vector of columns, "
                                     f"{math.ceil(out_w / lanes)} across a row, each input row loaded once per tap "
                                     f"column for every output row it serves; {tiling.threads_hint}", tiling=tiling)
    asm = plan.target.fma_asm and out_h > 1 and taps > 9 and vectors >= PLANES_ASM_VECTORS
    tiling = Tiling(vector_lanes=lanes, kb=u, nv=int(asm), planes=True,
                    threads_hint="parallel over (image, channel) planes")
    return plan.decide("tiling", f"each plane copied into a zero-padded buffer of row pitch {pitch}: {vectors} "
                                 f"flat vectors of outputs per plane, {u} at a time in registers over the "
                                 f"{taps} taps{', stepped in assembly' if asm else ''}; {tiling.threads_hint}",
                       tiling=tiling)


def tile(plan: Plan) -> Plan:
    lanes = vector_lanes(plan)
    return _wgrad(plan, lanes) if plan.kop is KOp.WGRAD else _planes(plan, lanes)


def join(plan: Plan, candidates: tuple[str, ...]) -> tuple[str, ...]:
    """A weight gradient of one input channel per group: first where it is depthwise, last for one
    input channel without groups; a forward or data gradient over planes (`fits`): last."""
    if wgrad_fits(plan):
        candidates = (NAME,) + candidates if wgrad_first(plan) else candidates + (NAME,)
    return candidates + (NAME,) if fits(plan) else candidates


def rule(plan: Plan, candidates: tuple[str, ...], choice: str, why: str) -> tuple[str, str]:
    """A forward or data gradient over planes is this family's wherever it fits."""
    if NAME in candidates and plan.kop is not KOp.WGRAD:
        return NAME, PLANES_WHY
    return choice, why


FAMILY = Family(NAME, WHY, TEMPLATES, tile, join=join, rule=rule)
