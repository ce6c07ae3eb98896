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
from .windows import (SCALARS, THREADS, WindowContext, check_common, choose_tile, fixed_block_context,
                      fixed_block_tiling, pow2_at_least, refusal_of, split_ways, window_fields)

TEMPLATE = "gpu/stem_wgrad.cu.j2"
NAME = "stem weight-gradient GPU kernel"
ENTRIES = ("bwd_weight", "bwd_weight_bias", "bwd_bias")
MAX_CHANNELS_PER_GROUP = 4
MAX_OWNED = 16     # (filter, channel, tap) sums one thread keeps in registers
MAX_FILTERS = 64   # filters per block tile
TILE_PIXELS = 128  # output pixels per staged tile
WHY = ("few-channel weight gradient (at most 4 input channels per group): a thread keeps its (filter, channel, "
       "tap) sums in registers over staged tiles, the batch x pixels reduction split over blocks, partials "
       "summed in order")
BIAS_WHY = ("bias gradient fused into the weight gradient's two launches: each of a block's last KT threads also "
            "sums one filter's staged grad_output tiles in pixel order into partials after the weight's in the "
            "workspace, added in split order by the second kernel and rounded once")


@dataclasses.dataclass(frozen=True)
class StemTiles:
    """KT filters a block, tiles of TH x TW output pixels, the reduction's split, and why."""

    kt: int
    tile: tuple[int, int]
    split: int
    why: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class StemContext(WindowContext):
    kt: int
    tile: tuple[int, int]


def check(problem: ConvProblem, target: Target, prefix: str) -> StemTiles:
    """The tiles of few-channel `problem`, entries named `prefix`_<entry>; ConvSpecError for what
    this kernel does not take."""
    check_common(problem, target, prefix, NAME)
    cg = problem.c // problem.groups
    if not 1 <= cg <= MAX_CHANNELS_PER_GROUP:
        raise ConvSpecError(f"channels={problem.c}, groups={problem.groups}: the {NAME} takes 1 to "
                            f"{MAX_CHANNELS_PER_GROUP} input channels per group (has {cg})")
    taps = math.prod(problem.kernel)
    if cg * taps > MAX_OWNED * THREADS:
        raise ConvSpecError(f"kernel {problem.kernel}: the {NAME} keeps channels x taps <= {MAX_OWNED * THREADS} "
                            f"sums per filter in one block's registers (has {cg * taps})")
    return choose_tiles(problem, target)


def choose_tiles(problem: ConvProblem, target: Target) -> StemTiles:
    """As many filters a block as keep every thread's sums within MAX_OWNED, and the pixel tile that
    stages the fewest elements per useful pixel within the shared-memory budget."""
    normal = Normal.of(problem)
    kernel, stride, dilation, out_size = normal.kernel, normal.stride, normal.dilation, normal.out_size
    cg, taps = problem.c // problem.groups, math.prod(problem.kernel)
    acc_bytes = 8 if SCALARS[problem.dtype][1] == "double" else 4
    kg = problem.k // problem.groups
    kt = 1
    while kt * 2 <= min(MAX_FILTERS, pow2_at_least(kg)) and -(-2 * kt * cg * taps // THREADS) <= MAX_OWNED:
        kt *= 2

    def shared_bytes(th, tw):   # input window of the group's channels + grad_output tile of the block's filters
        wh = (th - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1
        ww = (tw - 1) * stride[2] + (kernel[2] - 1) * dilation[2] + 1
        return acc_bytes * (cg * kernel[0] * wh * ww + kt * th * tw)

    min_cols = 1 if problem.input_layout is Layout.CHANNELS_LAST else 16   # contiguous rows: 64-byte runs at least
    th, tw = choose_tile(out_size[1], out_size[2], TILE_PIXELS, min_cols, shared_bytes,
                         f"kernel {problem.kernel}, dilation {problem.dilation}")
    blocks = problem.groups * -(-kg // kt)
    tiles_per_image = out_size[0] * -(-out_size[1] // th) * -(-out_size[2] // tw)
    split, split_why = split_ways(blocks, tiles_per_image, target)
    owned = -(-kt * cg * taps // THREADS)
    why = (f"{cg} channel(s) x {taps} taps x {kg} filters per group: a block owns {kt} filters, {THREADS} threads "
           f"keep {owned} (filter, channel, tap) sums each over tiles of {th}x{tw} output pixels "
           f"({shared_bytes(th, tw)} bytes of shared memory)", split_why)
    return StemTiles(kt, (th, tw), split, why)


def stem_context(problem: ConvProblem, target: Target, prefix: str) -> StemContext:
    """The template context for few-channel `problem` on GPU `target`; entries are named
    `prefix`_bwd_weight (+ _bwd_weight_workspace_bytes) and _bwd_bias. ConvSpecError for what this
    kernel does not take."""
    tiles = check(problem, target, prefix)
    normal = Normal.of(problem)
    return StemContext(**file_fields(problem, target, prefix, normal), **tensor_fields(normal),
                       **window_fields(problem), kt=tiles.kt, tile=tiles.tile, split=tiles.split, why=tiles.why)


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
