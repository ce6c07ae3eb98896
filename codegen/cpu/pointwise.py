"""Family `pointwise`, forward and data gradient: a packed GEMM over channels (1x1 kernels, with any
strides and padding; for the forward also non-overlapping patches, kernel = stride, whose reduced
values are (input channel, tap) pairs). A candidate where it fits, chosen over blocked or lanes by
`over`. Its weight gradient (dot products over pixels): pointwise_wgrad.py. The gemm weight
gradient (gemm.py) shares its register tile and blocking (`gemm_tile`, `row_blocks`, `gemm_cols`).

Tiling: a register tile of MR channels x POINTWISE_VECTORS vectors of pixels; weights packed once
per call in panels of MR channels; per work item a block of channels x a run of pixels, whose
values are packed in chunks (half the L1).
"""

from __future__ import annotations

import math

from ..ir import DType, Layout
from ..plan import Geometry, KOp, Plan, Tiling
from ..target import Target
from . import lanes
from .family import Family
from .work import MIN_ITEMS, bf16_pairs, vector_lanes

NAME = "pointwise"
WHY = "a packed GEMM over channels (1x1 kernel), register tiles of channels x pixels"
TEMPLATES = {KOp.FWD: "cpu/pointwise.cpp.j2", KOp.DGRAD: "cpu/pointwise.cpp.j2"}

# The GEMM's register tile: MR channels x this many vectors of pixels, and at most this many
# pixels per work item (the kernel takes fewer when the batch gives too few items).
POINTWISE_VECTORS = 2
POINTWISE_MAX_COLS = 128

# --- pointwise over blocked or lanes (over)
# The GEMM packs what it reduces over once per item and chunk, which pays off from this many
# reduced channels. (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", POINTWISE_MIN_REDUCED)
POINTWISE_MIN_REDUCED = 64
# A strided 1x1 data gradient (its columns the grad_output pixels, the rest of the input gradient
# zeroed) from this many output channels, which it reduces over.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", POINTWISE_MIN_STRIDED_DGRAD)
POINTWISE_MIN_STRIDED_DGRAD = 512
# Forward patches: 2-D patches of fewer than PATCH_POINTWISE_TAPS taps go to lanes from
# PATCH_LANES_MIN_IN input channels (its broadcasts serve whole channel vectors where a patch is
# small), others to pointwise from PATCH_MIN_REDUCED (channel, tap) values reduced.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", PATCH_POINTWISE_TAPS)
PATCH_POINTWISE_TAPS = 16
PATCH_LANES_MIN_IN = 32
PATCH_MIN_REDUCED = 32
# Below AVX-512, forward patches into channels last of at most this many taps take lanes (2x2 to 8x8;
# pointwise kept ViT's 16x16). (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules",
# PATCH_CL_LANES_MAX_TAPS)
PATCH_CL_LANES_MAX_TAPS = 64
# On AVX-512 (tiles of 14 channels x 2 vectors of 16 pixels), NCHW: fewer reduced channels than
# this go to blocked or lanes by their scores, and images of at most PLANE_POINTWISE_WASTES pixels
# (7x7), which leave the pixel vectors a quarter empty, to lanes where its channel blocks are whole;
# at unit stride, and strided forwards too (a stride-2 shortcut 1x1, measured on Zen 4).
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", POINTWISE_WIDE_MIN_REDUCED)
POINTWISE_WIDE_MIN_REDUCED = 256
PLANE_POINTWISE_WASTES = 64
# In channels last on AVX-512 lanes reads each pixel's channels as whole vectors and beat pointwise
# on 1x1 kernels, with groups or without, but for a reduction longer than this into a channel block
# its tile leaves partly empty, and strided data gradients. (figures: BENCHMARKS.md, "Figures behind
# codegen's CPU rules", CL_LANES_MAX_REDUCED)
CL_LANES_MAX_REDUCED = 512
# Below AVX-512 (AVX2's 16 registers), channels-last 1x1 kernels reducing at most this many channels
# take lanes too. (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", CL_LANES_MAX_REDUCED_AVX2)
CL_LANES_MAX_REDUCED_AVX2 = 144
WIDE_LANES_BLOCK = 64   # channels of lanes' AVX-512 tile (4 vectors of 16)
# A channels-last 1x1 forward from at most EXPAND_MAX_IN channels to EXPAND_RATIO times as many
# writes far more than it reads: lanes writes each pixel's channels as whole vectors (past the
# caches when large), where the pointwise tile writes 6 channels of 16 pixels, 24 bytes per pixel.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", EXPAND_MAX_IN)
EXPAND_MAX_IN, EXPAND_RATIO = 128, 4


def fits(plan: Plan) -> bool:
    """Whether the pointwise kernels compute this kernel op: a 1x1 kernel, with any strides and
    padding, or for the forward non-overlapping patches (kernel = stride, no dilation or padding:
    ViT's and ConvNeXt's patch embeddings and downsampling), whose reduced values are (input
    channel, tap) pairs. The forward and data gradient are a packed GEMM reduced over channels (a
    strided data gradient's columns are the grad_output pixels, each written where it reaches, the
    rest zeroed), the weight gradient dot products over pixels."""
    g = plan.geometry
    return g.kernel == (1, 1, 1) or (plan.kop is KOp.FWD and _patches(g))


def _patches(g: Geometry) -> bool:
    """Whether the windows tile the input without overlap: kernel = stride, no dilation or padding."""
    return g.kernel == g.stride and g.dilation == (1, 1, 1) and g.pad_lo == (0, 0, 0)


def _widening_channels_last_dgrad(plan: Plan) -> bool:
    """The data gradient of a channels-last 1x1 that narrows (the input gradient has EXPAND_RATIO
    times the channels it reduces over), which stays with lanes on AVX512-BF16 hosts.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", pointwise._widening_channels_last_dgrad)"""
    g = plan.geometry
    return (plan.target.evex_tiles and plan.kop is KOp.DGRAD and g.stride == (1, 1, 1)
            and plan.layout_of("X") is Layout.CHANNELS_LAST
            and g.cin_g >= EXPAND_RATIO * g.cout_g)


def _expanding_channels_last(plan: Plan) -> bool:
    """A channels-last 1x1 forward that widens few channels to many (EXPAND_MAX_IN, EXPAND_RATIO)."""
    g = plan.geometry
    written_cl = plan.layout_of("Y") is Layout.CHANNELS_LAST
    return (plan.kop is KOp.FWD and written_cl and g.stride == (1, 1, 1)
            and g.cin_g <= EXPAND_MAX_IN and g.cout_g >= EXPAND_RATIO * g.cin_g)


def _over_patches(plan: Plan, choice: str, why: str, reduced: int) -> tuple[str, str]:
    """Forward patches (PATCH_POINTWISE_TAPS, PATCH_LANES_MIN_IN, PATCH_MIN_REDUCED, PATCH_CL_LANES_MAX_TAPS); on AVX-512
    pointwise's tile of 14 channels x 2 vectors of pixels lost the patch embeddings measured to lanes
    in channels last, and in NCHW to blocked or lanes by their scores (`choice`); where output rows are
    shorter than a vector (ViT's 16x16 patches: 14 columns) lanes stays, but for bf16 on AMX hosts
    (their pointwise measured ahead), and blocked keeps the rules below.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", PATCH_POINTWISE_TAPS)"""
    g = plan.geometry
    written_cl = plan.layout_of("Y") is Layout.CHANNELS_LAST
    if plan.target.isa == "avx512":
        if written_cl:
            return lanes.NAME, f"{lanes.WHY}; not pointwise: non-overlapping patches into channels last on AVX-512"
        if g.y_size[2] >= vector_lanes(plan):
            return choice, f"{why}; not pointwise: non-overlapping patches on AVX-512"
        if choice == lanes.NAME and not (plan.problem.dtype is DType.BF16 and plan.target.amx_bf16):
            return choice, (f"{why}; not pointwise: non-overlapping patches on AVX-512, output rows of "
                            f"{g.y_size[2]} pixels")
    elif written_cl and math.prod(g.kernel) <= PATCH_CL_LANES_MAX_TAPS:
        return lanes.NAME, (f"{lanes.WHY}; not pointwise: non-overlapping patches of {math.prod(g.kernel)} taps "
                            f"into channels last")
    if plan.problem.rank > 1 and math.prod(g.kernel) < PATCH_POINTWISE_TAPS:
        if g.cin_g >= PATCH_LANES_MIN_IN:
            return lanes.NAME, f"{lanes.WHY}; non-overlapping {'x'.join(map(str, g.kernel[-2:]))} patches"
        return choice, why
    if reduced >= PATCH_MIN_REDUCED:
        return NAME, f"{WHY}; non-overlapping patches, {reduced} (channel, tap) values reduced"
    return choice, why


def _lanes_kept(plan: Plan, choice: str, why: str) -> tuple[str, str] | None:
    """Where lanes (`choice`) stays: bf16 in pairs (lanes reduces them on vdpbf16ps, pointwise on f32
    FMAs), a narrowing channels-last data gradient, a widening channels-last forward. None elsewhere.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", pointwise._lanes_kept)"""
    g = plan.geometry
    if bf16_pairs(plan) and choice == lanes.NAME:
        return choice, f"{why}; not pointwise: bf16 in pairs on vdpbf16ps"
    if choice == lanes.NAME and _widening_channels_last_dgrad(plan):
        return choice, (f"{why}; not pointwise: a channels-last 1x1 data gradient to {g.cin_g} channels from "
                        f"{g.cout_g} (measured on Zen 4)")
    if choice == lanes.NAME and _expanding_channels_last(plan):
        return choice, (f"{why}; not pointwise: a channels-last 1x1 forward to {g.cout_g} channels from "
                        f"{g.cin_g}, whose output stores dominate")
    return None


def _isa_bounds(plan: Plan, choice: str, why: str, reduced: int) -> tuple[str, str] | None:
    """The AVX-512 boundaries (CL_LANES_MAX_REDUCED, PLANE_POINTWISE_WASTES, POINTWISE_WIDE_MIN_REDUCED)
    and the channels-last one below AVX-512 (CL_LANES_MAX_REDUCED_AVX2), or None where they do not decide."""
    g = plan.geometry
    nchw = all(plan.layout_of(kind) is not Layout.CHANNELS_LAST for kind in ("X", "Y"))
    lanes_channels = g.cout_g if plan.kop is KOp.FWD else g.cin_g
    strided_dgrad = plan.kop is KOp.DGRAD and g.stride != (1, 1, 1)
    avx512 = plan.target.isa == "avx512"
    if not nchw and not bf16_pairs(plan) and not strided_dgrad:
        if avx512 and (reduced <= CL_LANES_MAX_REDUCED or lanes.fills_lanes(plan)):
            return lanes.NAME, (f"{lanes.WHY}; not pointwise: channels last on AVX-512, {reduced} channels reduced"
                                f"{f' in each of {g.groups} groups' if g.groups > 1 else ''}")
        if not avx512 and reduced <= CL_LANES_MAX_REDUCED_AVX2:
            return lanes.NAME, f"{lanes.WHY}; not pointwise: channels last, {reduced} channels reduced"
    if avx512 and (g.stride == (1, 1, 1) or plan.kop is KOp.FWD) and nchw:
        plane = math.prod(g.y_size if plan.kop is KOp.FWD else g.x_size)
        if plane <= PLANE_POINTWISE_WASTES and lanes_channels % WIDE_LANES_BLOCK == 0:
            return lanes.NAME, f"{lanes.WHY}; not pointwise: {plane} pixels per image fill few 16-pixel vectors"
        if reduced < POINTWISE_WIDE_MIN_REDUCED:
            return choice, f"{why}; not pointwise: {reduced} channels reduced (AVX-512)"
    return None


def over(plan: Plan, choice: str, why: str) -> tuple[str, str]:
    """pointwise for a forward or data gradient where it measured faster than `choice` (blocked or
    lanes), channels last as well: the choice and why.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", pointwise.over)"""
    g = plan.geometry
    reduced = g.cin_g * math.prod(g.kernel) if plan.kop is KOp.FWD else g.cout_g
    if g.kernel != (1, 1, 1):     # forward patches
        return _over_patches(plan, choice, why, reduced)
    if plan.kop is KOp.DGRAD and g.stride != (1, 1, 1) and reduced < POINTWISE_MIN_STRIDED_DGRAD:
        return choice, why
    decided = _lanes_kept(plan, choice, why) or _isa_bounds(plan, choice, why, reduced)
    if decided:
        return decided
    if reduced >= POINTWISE_MIN_REDUCED:
        return NAME, f"{WHY}; {reduced} channels reduced"
    return choice, why


# ---------------------------------------------------------------------------------- tiling

def gemm_tile(t: Target, lanes: int, acc_bytes: int) -> tuple[int, int, int]:
    """(MR, NVP, KC) of the pointwise GEMMs: MR rows x NVP vectors of columns in registers (with
    the B panel's vectors and one broadcast), and chunks of KC reduced values whose B panel
    (KC x NVP vectors) takes half the L1 while the A panels stream from the L2."""
    nvp = POINTWISE_VECTORS
    mr = max(1, min(16, (t.vector_registers - nvp - 1) // nvp))
    return mr, nvp, max(1, (t.l1_bytes // 2) // (nvp * lanes * acc_bytes))


def row_blocks(rows: int, mr: int, kc: int, t: Target, acc_bytes: int) -> int:
    """Rows (a multiple of MR) per work item: an item's A block (rows x KC) takes at most half the
    L2, in blocks of equal size."""
    panels = math.ceil(rows / mr)
    blocks = math.ceil(panels / max(1, (t.l2_bytes // 2) // (kc * acc_bytes * mr)))
    return math.ceil(panels / blocks) * mr


def gemm_cols(nr: int, kc: int, t: Target, acc_bytes: int) -> int:
    """Columns (a multiple of NR) per work item: the item's B block (KC x columns) within a quarter
    of the L2, and at most POINTWISE_MAX_COLS."""
    return max(nr, min(POINTWISE_MAX_COLS, (t.l2_bytes // 4) // (kc * acc_bytes)) // nr * nr)


def item_split(tiling, out_channels: int, groups: int, pixels: int) -> tuple[int, int]:
    """The kernel's split at run time (templates/cpu/pointwise.cpp.j2, the entry): an item's channels
    and pixels for `pixels` columns of the whole batch. Of the splits of a group's `out_channels` into
    blocks of whole MR-channel panels (at most ksb channels), each with its runs of whole strips (at most
    cols pixels, fewer where that leaves fewer than min_items items), the one whose items read the fewest
    values over the reduction (an item reads its channels' packed weights and its pixels' values once),
    where that is at most two thirds of what the fewest blocks read."""
    mr, nr = tiling.kb, tiling.nv * tiling.vector_lanes
    op, strips = math.ceil(out_channels / mr), math.ceil(pixels / nr)
    splits, last = [], 0
    for ob in range(math.ceil(out_channels / tiling.ksb), op + 1):
        np_ = math.ceil(op / ob)
        blocks = math.ceil(op / np_)
        if blocks == last:
            continue
        last = blocks
        want = math.ceil(tiling.min_items / (groups * blocks))
        runs = max(math.ceil(strips * nr / tiling.cols), min(want, strips))
        ns = math.ceil(strips / runs)
        splits.append((math.ceil(strips / ns) * blocks * (np_ * mr + ns * nr), np_ * mr, ns * nr))
    best = splits[0]
    for split in splits[1:]:
        if split[0] < best[0] and 3 * split[0] <= 2 * splits[0][0]:
            best = split
    return best[1], best[2]


def tile(plan: Plan) -> Plan:
    """1x1 forward or data gradient as a packed GEMM: out channels x pixels, reduced over channels."""
    g, t, p = plan.geometry, plan.target, plan.problem
    lanes = vector_lanes(plan)
    acc_bytes = p.dtype.accumulator.itemsize
    fwd = plan.kop is KOp.FWD
    out_ch, reduced = (g.cout_g, g.cin_g * math.prod(g.kernel)) if fwd else (g.cin_g, g.cout_g)
    mr, nvp, kc = gemm_tile(t, lanes, acc_bytes)
    if fwd and g.stride != (1, 1, 1):
        # a strided forward packs each strip from every SW-th input value: half the chunk
        # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", pointwise.tile: strided chunks)
        kc = max(1, kc // 2)
    kc = min(reduced, kc)
    mc = row_blocks(out_ch, mr, kc, t, acc_bytes)
    nc = gemm_cols(nvp * lanes, kc, t, acc_bytes)
    tiling = Tiling(vector_lanes=lanes, kb=mr, nv=nvp, ksb=mc, cols=nc, rb=kc, min_items=MIN_ITEMS,
                    threads_hint=f"parallel over (group, run of pixels, block of {'output' if fwd else 'input'} "
                                 f"channels), handed out as threads come free; runs shrink from {nc} pixels when "
                                 f"the batch gives fewer than {MIN_ITEMS} items")
    return plan.decide("tiling", f"register tile {mr} channels x {nvp} vectors of {lanes} pixels ({mr * nvp} of "
                                 f"{t.vector_registers} registers accumulate); weights packed once per call in "
                                 f"panels of {mr} channels; per item {mc} channels x up to {nc} pixels, whose "
                                 f"values are packed in chunks of {kc} reduced channels (half the L1); "
                                 f"{tiling.threads_hint}", tiling=tiling)


def join(plan: Plan, candidates: tuple[str, ...]) -> tuple[str, ...]:
    """Every kernel op it fits, the weight gradient's dot products (pointwise_wgrad.py) included."""
    return candidates + (NAME,) if fits(plan) else candidates


def rule(plan: Plan, candidates: tuple[str, ...], choice: str, why: str) -> tuple[str, str]:
    """The forward and data gradient (the weight gradient's rule is pointwise_wgrad.py's)."""
    return over(plan, choice, why) if NAME in candidates and plan.kop is not KOp.WGRAD else (choice, why)


FAMILY = Family(NAME, WHY, TEMPLATES, tile, join=join, rule=rule)
