"""Family `gemm`: the weight gradient as a packed GEMM, gW[k][c, tap] = output channels x columns
(input channels; for kernels larger than 1x1, im2col rows: input channel x tap), reduced over
pixels in a fixed order. A candidate for every weight gradient, chosen over lanes by `over`.

Tiling: the pointwise GEMMs' register tile of MR output channels x two vectors of columns and their
blocking (pointwise.gemm_tile, row_blocks, gemm_cols); grad_output packed once per call, input
values per item and chunk; the reduction in fixed parts where items are few.
"""

from __future__ import annotations

import math

from ..ir import DType, Layout
from ..plan import KOp, Plan, Tiling
from .family import Family
from .lanes_wgrad import NAME as LANES
from .pointwise import gemm_cols, gemm_tile, row_blocks
from .work import bf16_pairs, reduction_splits, vector_lanes, windows_inside

NAME = "gemm"
WHY = ("a packed GEMM over output channels x (input channel, tap) columns, register tiles of 6 output "
       "channels x 2 vectors of columns, reduced over pixels in a fixed order")
TEMPLATES = {KOp.WGRAD: "cpu/gemm_wgrad.cpp.j2"}

# --- gemm over lanes (over)
# The packed GEMM against lanes (its register tile stepped in assembly): gemm from GEMM_WGRAD_MIN_OUT
# output channels for 1x1 kernels of GEMM_WGRAD_MIN_IN input channels or more, 1-D problems, strided
# windows over images of GEMM_WGRAD_MIN_PLANE output pixels, dilated windows of
# GEMM_WGRAD_MIN_DILATED_OUT output channels, and fewer than GEMM_WGRAD_MAX_FEW_ROWS (input channel,
# tap) rows, which leave lanes' per-pixel addressing unamortised. Lanes wins with unit strides and
# many rows, few pixels per image, few output channels per group.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", GEMM_WGRAD_MIN_OUT)
GEMM_WGRAD_MIN_OUT = 64
GEMM_WGRAD_MIN_IN = 256          # 1x1: input channels
# ... and, in f32 on the AVX-512 shape, this many output channels a group: narrower 1x1 gradients (960
# -> 160 at 7x7, 512 -> 128) ran faster on lanes, in both layouts (Zen 3's AVX2 figures keep gemm).
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", GEMM_WGRAD_1X1_MIN_OUT)
GEMM_WGRAD_1X1_MIN_OUT = 256
GEMM_WGRAD_MIN_PLANE = 512       # strided: output pixels per image
GEMM_WGRAD_MIN_DILATED_OUT = 256
GEMM_WGRAD_MAX_FEW_ROWS = 32     # below this many (input channel, tap) rows
# Strided windows of this many taps or more over few output pixels (ViT's 16x16 patch embedding).
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", GEMM_WGRAD_MIN_STRIDED_TAPS)
GEMM_WGRAD_MIN_STRIDED_TAPS = 16
# Where lanes' weight-gradient tile takes 32 registers (Target.evex_tiles: AVX2 code with AVX512-VL,
# i.e. AVX512-BF16 hosts), f32, the boundaries move: overlapping strided and dilated windows go to
# lanes; non-overlapping strided windows, strided windows of GEMM_WGRAD_MIN_STRIDED_TAPS taps or
# more over smaller images, fewer than GEMM_WGRAD_EVEX_FEW_ROWS rows and images of fewer than
# GEMM_WGRAD_EVEX_MAX_PLANE output pixels stay with gemm. On AVX-512 1-D windows of unit stride go
# to lanes and the few-rows bound is AVX2's.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", GEMM_WGRAD_EVEX_MAX_PLANE)
GEMM_WGRAD_EVEX_MAX_PLANE = 64
GEMM_WGRAD_EVEX_FEW_ROWS = 64


# On the AVX-512 shape lanes' weight gradient (32-register tiles) measured ahead of gemm (Xeon, f32, 2
# threads, kernel alone, ms, lanes / gemm, channels last and NCHW) on unit-stride 1x1 kernels that widen
# (256 -> 1024 at 14x14: 3.15 / 3.77, 2.54 / 3.49; 512 -> 2048 at 7x7: 2.82 / 2.96, 2.65 / 2.83) or
# run over images of WIDE_1X1_LANES_PLANE output pixels or more (256 -> 64 at 56x56: 2.95 / 4.25, 3.33 /
# 4.75), and on every few-row problem (fewer than GEMM_WGRAD_MAX_FEW_ROWS (input channel, tap) rows:
# 3 -> 64 3x3 at 224x224 1.84 / 7.30, 3.24 / 5.72; stride 2 1.96 / 7.29, 3.38 / 6.10; 3 -> 128 at 56x56
# 1.51 / 3.39, 1.64 / 1.94; 1 -> 64 5x5 0.57 / 2.33, 0.94 / 1.55); gemm keeps the narrowing 1x1 kernels
# over smaller images (1024 -> 256 at 14x14: 3.46 / 2.52, 2.74 / 2.51; 2048 -> 512 at 7x7 3.83 / 2.30,
# 2.76 / 2.28). (figures: BENCHMARKS.md, "2026-12-03", gemm.over on AVX-512)
WIDE_1X1_LANES_PLANE = 2048


def _over_1x1(plan: Plan, choice: str, why: str) -> tuple[str, str]:
    """A 1x1 kernel (with unit strides flattened to 1-D rows: not over()'s 1-D case)."""
    g = plan.geometry
    if (plan.target.isa == "avx512" and g.stride == (1, 1, 1) and plan.problem.dtype is DType.F32
            and (g.cout_g > g.cin_g or math.prod(g.y_size) >= WIDE_1X1_LANES_PLANE)):
        return choice, (f"{why}; not gemm: a 1x1 {'widening' if g.cout_g > g.cin_g else 'over large images'} "
                        f"on AVX-512")
    if (plan.target.isa == "avx512" and g.cin_g >= GEMM_WGRAD_MIN_IN and plan.problem.dtype is DType.F32
            and g.cout_g < GEMM_WGRAD_1X1_MIN_OUT):
        return choice, f"{why}; not gemm: a 1x1 of {g.cin_g} input channels to only {g.cout_g} output channels"
    if g.cin_g >= GEMM_WGRAD_MIN_IN:
        return NAME, f"{WHY}; 1x1 with {g.cin_g} input channels"
    if bf16_pairs(plan) and g.stride == (1, 1, 1) and plan.layout_of("X") is Layout.CHANNELS_LAST:
        # lanes' pair copy of a channels-last input is made in vectorised runs; gemm packs grad_output
        # value by value (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", gemm.over:
        # bf16 1x1 channels last)
        return choice, f"{why}; not gemm: a bf16 1x1 from a channels-last input, copied in pairs in runs"
    if bf16_pairs(plan):
        # no im2col to pack, and both sides reduce in pairs
        # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", gemm.over: bf16 1x1)
        return NAME, f"{WHY}; 1x1, bf16 in pairs on vdpbf16ps"
    return choice, why


def _over_evex(plan: Plan, choice: str, why: str, wide: bool) -> tuple[str, str]:
    """The boundaries where lanes' tile takes 32 registers (GEMM_WGRAD_EVEX_MAX_PLANE)."""
    g = plan.geometry
    plane = math.prod(g.y_size)
    if plane < GEMM_WGRAD_EVEX_MAX_PLANE:
        return NAME, f"{WHY}; {plane} output pixels per image (lanes' tile in 32 registers, measured on Zen 4)"
    if any(s > 1 for s in g.stride) and all(k <= s for k, s in zip(g.kernel, g.stride)):
        return NAME, f"{WHY}; strided windows that do not overlap (kernel {list(g.kernel)}, stride {list(g.stride)})"
    # (not on AVX-512, where lanes ran faster: figures: BENCHMARKS.md, "Figures behind codegen's CPU
    # rules", gemm.over: AVX-512 strided taps)
    if (any(s > 1 for s in g.stride) and plane < GEMM_WGRAD_MIN_PLANE
            and math.prod(g.kernel) >= GEMM_WGRAD_MIN_STRIDED_TAPS and not wide):
        return NAME, f"{WHY}; strided windows of {math.prod(g.kernel)} taps over {plane} output pixels"
    return choice, f"{why}; lanes' tile in 32 registers beats gemm on strided and dilated windows (measured on Zen 4)"


def _over_windows(plan: Plan, choice: str, why: str) -> tuple[str, str]:
    """Strided and dilated windows with 16-register tiles (GEMM_WGRAD_MIN_PLANE,
    GEMM_WGRAD_MIN_STRIDED_TAPS, GEMM_WGRAD_MIN_DILATED_OUT)."""
    g = plan.geometry
    if any(s > 1 for s in g.stride) and math.prod(g.y_size) >= GEMM_WGRAD_MIN_PLANE:
        return NAME, f"{WHY}; strided windows, {math.prod(g.y_size)} output pixels per image"
    if any(s > 1 for s in g.stride) and math.prod(g.kernel) >= GEMM_WGRAD_MIN_STRIDED_TAPS:
        return NAME, f"{WHY}; strided windows of {math.prod(g.kernel)} taps"
    if any(d > 1 for d in g.dilation) and g.cout_g >= GEMM_WGRAD_MIN_DILATED_OUT:
        return NAME, f"{WHY}; dilated windows, {g.cout_g} output channels"
    return choice, why


def over(plan: Plan, choice: str, why: str) -> tuple[str, str]:
    """gemm for a weight gradient, where it measured faster than lanes (`choice`)."""
    g = plan.geometry
    if g.cout_g < GEMM_WGRAD_MIN_OUT:
        return choice, why
    if g.kernel == (1, 1, 1):
        return _over_1x1(plan, choice, why)
    if bf16_pairs(plan):
        # in bf16 pairs (vdpbf16ps) lanes halves its steps while gemm's im2col packing stays
        # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", gemm.over: bf16 pairs)
        return choice, f"{why}; bf16 in pairs on vdpbf16ps, where lanes beats gemm's im2col but for wide 1x1"
    wide = plan.target.isa == "avx512"
    if plan.problem.rank == 1 and not (wide and g.stride == (1, 1, 1)):
        return NAME, f"{WHY}; 1-D"
    evex = plan.target.evex_tiles and plan.problem.dtype is DType.F32   # the Zen 4 boundaries
    rows = g.cin_g * math.prod(g.kernel)
    if rows < (GEMM_WGRAD_EVEX_FEW_ROWS if evex and not wide else GEMM_WGRAD_MAX_FEW_ROWS):
        if wide and plan.problem.dtype is DType.F32:   # WIDE_1X1_LANES_PLANE's figures
            return choice, f"{why}; only {rows} (input channel, tap) rows, lanes' on AVX-512"
        return NAME, f"{WHY}; only {rows} (input channel, tap) rows"
    if evex:
        return _over_evex(plan, choice, why, wide)
    return _over_windows(plan, choice, why)


def tile(plan: Plan) -> Plan:
    """Weight gradient as a packed GEMM: out channels x columns (input channels; for kernels larger
    than 1x1, im2col rows: input channel x tap), reduced over pixels."""
    g, t, p = plan.geometry, plan.target, plan.problem
    lanes = vector_lanes(plan)
    acc_bytes = p.dtype.accumulator.itemsize
    taps = g.kernel[0] * g.kernel[1] * g.kernel[2]
    columns = g.cin_g * taps
    mr, nvp, kc = gemm_tile(t, lanes, acc_bytes)
    mc = row_blocks(g.cout_g, mr, kc, t, acc_bytes)
    nr = nvp * lanes
    # column blocks of equal size, each within gemm_cols
    strips = math.ceil(columns / nr)
    blocks = math.ceil(strips / (gemm_cols(nr, kc, t, acc_bytes) // nr))
    nc = math.ceil(strips / blocks) * nr
    items = g.groups * math.ceil(g.cout_g / mc) * math.ceil(columns / nc)
    splits = reduction_splits(items, g.groups * g.cout_g * columns * acc_bytes)
    im2col = taps > 1
    in_place = ("X",) if im2col and windows_inside(g) and p.dtype.accumulator is p.dtype else ()
    pairs = bf16_pairs(plan)
    tiling = Tiling(vector_lanes=lanes, kb=mr, nv=nvp, ksb=mc, cols=nc, rb=kc, splits=splits, in_place=in_place,
                    pairs=pairs,
                    threads_hint="parallel over (group, out-channel block, column block, part of the "
                                 "reduction); each item owns its sums and reduces in a fixed order, so results do "
                                 "not depend on the thread count")
    what = "im2col rows (input channel, tap)" if im2col else "input channels"
    source = (f"; input {'read in place' if in_place else 'copied once, zero-padded'}" if im2col else "")
    return plan.decide("tiling", f"register tile {mr} output channels x {nvp} vectors of {lanes} {what}; "
                                 f"grad_output packed once per call in panels of {mr} channels; per item {mc} x "
                                 f"{nc} columns, {items} items x {splits} parts of the reduction, input values "
                                 f"packed in chunks of {kc} {'pairs of pixels' if pairs else 'pixels'} (half the L1)"
                                 f"{source}; "
                                 + ("bf16 reduced in pairs of consecutive pixels on vdpbf16ps (both operands packed "
                                    "two values to a 32-bit word); " if pairs else "") + tiling.threads_hint,
                       tiling=tiling)


def rule(plan: Plan, candidates: tuple[str, ...], choice: str, why: str) -> tuple[str, str]:
    """A weight gradient lanes was chosen for."""
    return over(plan, choice, why) if plan.kop is KOp.WGRAD and choice == LANES else (choice, why)


FAMILY = Family(NAME, WHY, TEMPLATES, tile, rule=rule)
