"""The few-channel (stem) weight-gradient GPU kernel, rendered for CUDA or HIP from
`templates/gpu/stem_wgrad.cu.j2`: for convolutions with at most four input channels per group,
such as ResNet's 7x7 stride-2 stem (3 channels, 64 filters).

There the weight gradient gW[k][c][tap] is small (64 x 3 x 49) while its reduction, batch x output
pixels, is long; a GEMM tiling starves (a reduction dimension of thousands against output tiles of
a few hundred). So the reduction is split over many blocks: a block owns KT filters of one group
and walks its share of (image, tile of output pixels), staging the grad_output tile of its filters
and the input window of the group's channels in shared memory; each thread accumulates a fixed set
of (filter, channel, tap) sums over every pixel of the tile, so no reduction across threads is
needed. Each split's partials (f32, f64 for f64) go to a workspace and a second kernel adds them in
split order and rounds once: the same bits in any order. The workspace contract and entries are
those of the other GPU kernels: `<prefix>_bwd_weight_workspace_bytes(batch)`,
`<prefix>_bwd_weight(grad_output, input, grad_weight, workspace, batch, stream)` and
`<prefix>_bwd_bias(grad_output, grad_bias, batch, stream)`; with the bias gradient fused (BIAS_WHY),
`<prefix>_bwd_weight_bias(grad_output, input, grad_weight, grad_bias, workspace, batch, stream)`.
Rank 1-3, stride, dilation, asymmetric padding, groups, each tensor contiguous or channels-last,
f32/f64/bf16/f16.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import ConvSpecError
from ..ir import ConvProblem, Layout
from ..plan import GpuTiling, KOp, Plan
from ..render import render
from ..target import Target
from .context import file_fields, tensor_fields
from .family import Family
from .normal import Normal
from .windows import (THREADS, WindowContext, acc_bytes, check_common, choose_tile, fixed_block_context,
                      fixed_block_tiling, pow2_at_least, refusal_of, split_ways, window_fields)

TEMPLATE = "gpu/stem_wgrad.cu.j2"
NAME = "stem weight-gradient GPU kernel"
ENTRIES = ("bwd_weight", "bwd_weight_bias", "bwd_bias")
MAX_CHANNELS_PER_GROUP = 4
MAX_SUMS = {4: 32, 8: 16}   # (filter, channel, tap) sums one thread keeps in registers, by accumulator bytes
MAX_FILTERS = 64   # filters per block tile
# a thread's sums in register tiles of FT filters x TT taps (of one channel): per pixel one vector of FT
# grad_output values and TT input values for FT x TT multiply-adds; the first shape that fits, in order
REGISTER_TILES = ((4, 4), (2, 4), (1, 4), (1, 2), (1, 1))
TILE_PIXELS = 128  # output pixels per staged tile
WHY = ("few-channel weight gradient (at most 4 input channels per group): a thread keeps its (filter, channel, "
       "tap) sums in registers, in tiles of filters x taps that share their shared-memory loads, over staged "
       "tiles, the batch x pixels reduction split over blocks, partials summed in order")
BIAS_WHY = ("bias gradient fused into the weight gradient's two launches: each of a block's last KT threads also "
            "sums one filter's staged grad_output tiles in pixel order into partials after the weight's in the "
            "workspace, added in split order by the second kernel and rounded once")


@dataclasses.dataclass(frozen=True)
class StemTiles:
    """KT filters a block, register tiles of FT filters x TT taps, tiles of TH x TW output pixels, the
    reduction's split, and why."""

    kt: int
    ft: int
    tt: int
    tile: tuple[int, int]
    split: int
    why: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class StemContext(WindowContext):
    kt: int
    ft: int
    tt: int
    tile: tuple[int, int]


def check(problem: ConvProblem, target: Target, prefix: str) -> StemTiles:
    """The tiles of few-channel `problem`, entries named `prefix`_<entry>; ConvSpecError for what
    this kernel does not take."""
    check_common(problem, target, prefix, NAME)
    cg = problem.c // problem.groups
    if not 1 <= cg <= MAX_CHANNELS_PER_GROUP:
        raise ConvSpecError(f"channels={problem.c}, groups={problem.groups}: the {NAME} takes 1 to "
                            f"{MAX_CHANNELS_PER_GROUP} input channels per group (has {cg})")
    if register_tile(problem) is None:
        raise ConvSpecError(f"kernel {problem.kernel}: the {NAME} keeps a filter's channels x taps sums in one "
                            f"block's registers, at most {MAX_SUMS[acc_bytes(problem)]} a thread of {THREADS} "
                            f"(has {cg} x {math.prod(problem.kernel)})")
    return choose_tiles(problem, target)


def _owned(kt: int, ft: int, tt: int, cg: int, taps: int) -> int:
    """Register tiles a thread keeps: KT/FT filter vectors x CG channels x taps in TT-tap tiles, over THREADS."""
    return -(-(kt // ft) * cg * -(-taps // tt) // THREADS)


def register_tile(problem: ConvProblem) -> tuple[int, int] | None:
    """(FT, TT): the first of REGISTER_TILES (filters no more than a group's, rounded to a power of two;
    taps no more than the kernel's) whose sums fit MAX_SUMS with one vector of filters a block; None if none."""
    cg, taps, kg = problem.c // problem.groups, math.prod(problem.kernel), problem.k // problem.groups
    most = MAX_SUMS[acc_bytes(problem)]
    for ft, tt in REGISTER_TILES:
        ft, tt = min(ft, pow2_at_least(kg)), min(tt, taps)
        if _owned(ft, ft, tt, cg, taps) * ft * tt <= most:
            return ft, tt
    return None


def choose_tiles(problem: ConvProblem, target: Target) -> StemTiles:
    """Register tiles of FT filters x TT taps, as many filters a block (a power of two, at most
    MAX_FILTERS) as keep every thread's sums within MAX_SUMS, and the pixel tile that stages the
    fewest elements per useful pixel within the shared-memory budget."""
    normal = Normal.of(problem)
    kernel, stride, dilation, out_size = normal.kernel, normal.stride, normal.dilation, normal.out_size
    cg, taps = problem.c // problem.groups, math.prod(problem.kernel)
    acc = acc_bytes(problem)
    kg = problem.k // problem.groups
    ft, tt = register_tile(problem)
    kt = ft
    while (kt * 2 <= min(MAX_FILTERS, pow2_at_least(kg))
           and _owned(kt * 2, ft, tt, cg, taps) * ft * tt <= MAX_SUMS[acc]):
        kt *= 2
    padded = kt + (0 if problem.output_layout is Layout.CHANNELS_LAST else ft)   # a vector of padding a pixel

    def shared_bytes(th, tw):   # input window of the group's channels + grad_output tile of the block's filters
        wh = (th - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1
        ww = (tw - 1) * stride[2] + (kernel[2] - 1) * dilation[2] + 1
        return acc * (cg * kernel[0] * wh * ww + padded * th * tw)

    min_cols = 1 if problem.input_layout is Layout.CHANNELS_LAST else 16   # contiguous rows: 64-byte runs at least
    th, tw = choose_tile(out_size[1], out_size[2], TILE_PIXELS, min_cols, shared_bytes,
                         f"kernel {problem.kernel}, dilation {problem.dilation}")
    blocks = problem.groups * -(-kg // kt)
    tiles_per_image = out_size[0] * -(-out_size[1] // th) * -(-out_size[2] // tw)
    split, split_why = split_ways(blocks, tiles_per_image, target)
    owned = _owned(kt, ft, tt, cg, taps)
    why = (f"{cg} channel(s) x {taps} taps x {kg} filters per group: a block owns {kt} filters; {THREADS} threads "
           f"keep {owned} block(s) of {ft} filter(s) x {tt} tap(s) in registers each ({owned * ft * tt} sums, "
           f"{ft} grad_output value(s) in one load and {tt} input value(s) a pixel for {ft * tt} multiply-adds) "
           f"over tiles of {th}x{tw} output pixels ({shared_bytes(th, tw)} bytes of shared memory)", split_why)
    return StemTiles(kt, ft, tt, (th, tw), split, why)


def stem_context(problem: ConvProblem, target: Target, prefix: str) -> StemContext:
    """The template context for few-channel `problem` on GPU `target`; entries are named
    `prefix`_bwd_weight (+ _bwd_weight_workspace_bytes) and _bwd_bias. ConvSpecError for what this
    kernel does not take."""
    tiles = check(problem, target, prefix)
    normal = Normal.of(problem)
    return StemContext(**file_fields(problem, target, prefix, normal), **tensor_fields(normal),
                       **window_fields(problem), kt=tiles.kt, ft=tiles.ft, tt=tiles.tt, tile=tiles.tile,
                       split=tiles.split, why=tiles.why)


def render_stem(problem: ConvProblem, target: Target, prefix: str = "conv") -> str:
    """CUDA or HIP source (by `target`) of the stem weight-gradient kernels for `problem`, with their entries."""
    return render(TEMPLATE, c=stem_context(problem, target, prefix))


def _refusal(plan: Plan) -> str | None:
    if plan.kop is not KOp.WGRAD:
        return f"a {plan.kop.value} kernel: the stem kernel computes weight gradients (and their fused bias gradient)"
    return refusal_of(check, plan)


def _tiling(plan: Plan) -> tuple[GpuTiling, str]:
    return fixed_block_tiling(plan, "(filter, channel, tap) sums kept in registers over staged pixel tiles",
                              choose_tiles(plan.problem, plan.target).why, BIAS_WHY)


FAMILY = Family("stem", _refusal, lambda plan: WHY, _tiling, fixed_block_context(stem_context, ENTRIES), TEMPLATE,
                lambda context: ("bwd_weight", "bwd_weight_bias"))
