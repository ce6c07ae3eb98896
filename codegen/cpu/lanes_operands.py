"""How the lanes forward and data gradient read and write their operands: the operand they reduce over
read in place or copied (channels innermost for channel planes: `x_inner`; bf16 pairs in place:
`pairs_in_place`), and a channels-last output stored past the caches (`stream_bytes`, with the
forward tile widths that allow it: `line_step`). lanes.py's tile choice asks them.
"""

from __future__ import annotations

import math

from ..ir import Layout
from ..plan import KOp, Plan
from ..target import TargetKind
from .work import STREAM_L2S, bf16_pairs

# A channel-plane (NCHW) input the forward copies (zero-padded) is copied channels innermost, as a
# channels-last one is, where it has at least this many channels a group, unit strides, a window of
# several taps and no depth window (`x_inner`).
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", X_INNER_MIN_CHANNELS)
X_INNER_MIN_CHANNELS = 128


def pairs_in_place(plan: Plan, pairs: bool) -> bool:
    """Whether bf16 pairs read the operand they reduce over (the forward's input, the data gradient's
    grad_output) in place, as f32 does: channels last with an even number of channels a group, so that
    each 32-bit word of it is already a pair (pair_of's layout: the even channel in the low half).
    Elsewhere its copy interleaves the pairs. Zen 4, bf16 channels last, kernel alone, 2 threads, in
    place against copied: forwards 0.94-1.28x faster (shuffle_g3 1.74x, r50_1x1_256_64 1.28x), data
    gradients 0.97-1.20x (mb_pw_16_96 1.49x).
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_operands.pairs_in_place)"""
    g = plan.geometry
    fwd = plan.kop is KOp.FWD
    reduced = g.cin_g if fwd else g.cout_g
    return pairs and plan.layout_of("X" if fwd else "Y") is Layout.CHANNELS_LAST and reduced % 2 == 0


def x_inner(plan: Plan) -> bool:
    """Whether the forward's copy of a channel-plane (NCHW) input holds each pixel's channels together
    (channels innermost, as a channels-last input's copy does) rather than in planes: with at least
    X_INNER_MIN_CHANNELS channels a group, unit strides, several taps and no depth window, where it
    measured faster (up to 1.65x on the AVX2 shape; why planes run slower there is not established:
    a chunk's tiles then read CC x KH streams of lines, channels innermost KH). Strided windows
    (which skip the copy's pixels), depth windows, 1x1 kernels and fewer channels measured no gain
    or a loss.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", X_INNER_MIN_CHANNELS)"""
    g = plan.geometry
    return (plan.layout_of("X") is Layout.CONTIGUOUS and g.cin_g >= X_INNER_MIN_CHANNELS
            and all(s == 1 for s in g.stride) and g.kernel[0] == 1 and math.prod(g.kernel) > 1)


def stream_bytes(plan: Plan, nvv: int) -> int:
    """The result bytes per call from which the lanes forward and data gradient store past the caches
    (0: never): x86 targets, a channels-last result (the output; the data gradient's grad_input) whose
    every tile store covers whole 64-byte lines (channel blocks of whole vectors, a line-multiple block
    and pixel stride). Channel planes keep cached stores (STREAM_L2S).
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_operands.stream_bytes)"""
    g, t, p = plan.geometry, plan.target, plan.problem
    item = p.dtype.itemsize
    kind, channels = ("Y", g.cout_g) if plan.kop is KOp.FWD else ("X", g.cin_g)
    if (t.kind is not TargetKind.CPU or t.isa not in ("avx2", "avx512")
            or plan.layout_of(kind) is not Layout.CHANNELS_LAST):
        return 0
    if channels % nvv or (nvv * item) % 64 or (channels * g.groups * item) % 64:
        return 0
    return STREAM_L2S * t.l2_bytes


def line_step(plan: Plan, lanes: int) -> int:
    """The forward's tile widths (in vectors) whose channel blocks are whole 64-byte lines of a
    channels-last output, where the tile's own best may not be: bf16 results reduced in pairs on the
    AVX-512 shape (a vector's 16 values are half a line), so that the output may be stored past the
    caches (stream_bytes, whole lines at a time). 1 elsewhere (AVX2's bf16 unmeasured). Zen 4, bf16
    channels last, kernel alone, 2 threads, ms: a 1x1 from 16 to 96 channels at 112x112, batch 8 (19 MB
    of output), 3 x 9 cached 1.35, 6 x 4 streamed 1.09 (2 x 12 streamed 1.28-1.35).
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_operands.line_step)"""
    item = plan.problem.dtype.itemsize
    if (plan.kop is not KOp.FWD or plan.layout_of("Y") is not Layout.CHANNELS_LAST or not bf16_pairs(plan)
            or plan.target.isa != "avx512" or (lanes * item) % 64 == 0 or 64 % (lanes * item)):
        return 1
    return 64 // (lanes * item)
