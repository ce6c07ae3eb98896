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

from .errors import ConvSpecError
from .gpu_depthwise import SCALARS, THREADS, check_common, choose_tile, pow2_at_least, split_ways, three
from .gpu_wrappers import vendor_wrappers
from .ir import ConvProblem, DType, Layout
from .target import Target
from .version import generator_version

MAX_CHANNELS_PER_GROUP = 4
MAX_OWNED = 16     # (filter, channel, tap) sums one thread keeps in registers
MAX_FILTERS = 64   # filters per block tile
TILE_PIXELS = 128  # output pixels per staged tile
BIAS_WHY = ("bias gradient fused into the weight gradient's two launches: each of a block's last KT threads also "
            "sums one filter's staged grad_output tiles in pixel order into partials after the weight's in the "
            "workspace, added in split order by the second kernel and rounded once")


@dataclasses.dataclass(frozen=True)
class StemContext:
    version: str
    problem_name: str
    problem_key: str
    target: str
    vendor: str
    wrappers: str          # the vendor's wrapper header, inline (the file is self-contained)
    prefix: str
    scalar: str
    acc: str
    half: bool
    channels: int
    filters: int
    groups: int
    in_size: tuple[int, int, int]
    out_size: tuple[int, int, int]
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    pad: tuple[int, int, int]
    dilation: tuple[int, int, int]
    layouts: tuple[str, str, str]
    x_strides: tuple[int, ...]
    y_strides: tuple[int, ...]
    w_strides: tuple[int, ...]
    x_channels_fast: bool
    y_channels_fast: bool
    threads: int
    kt: int
    tile: tuple[int, int]
    split: int
    why: tuple[str, ...]


def stem_context(problem: ConvProblem, target: Target, prefix: str) -> StemContext:
    """The template context for few-channel `problem` on GPU `target`; entries are named
    `prefix`_bwd_weight (+ _bwd_weight_workspace_bytes) and _bwd_bias. ConvSpecError for what this
    kernel does not take."""
    name = "stem weight-gradient GPU kernel"
    check_common(problem, target, prefix, name)
    cg = problem.c // problem.groups
    if not 1 <= cg <= MAX_CHANNELS_PER_GROUP:
        raise ConvSpecError(f"channels={problem.c}, groups={problem.groups}: the {name} takes 1 to "
                            f"{MAX_CHANNELS_PER_GROUP} input channels per group (has {cg})")
    taps = math.prod(problem.kernel)
    if cg * taps > MAX_OWNED * THREADS:
        raise ConvSpecError(f"kernel {problem.kernel}: the {name} keeps channels x taps <= {MAX_OWNED * THREADS} "
                            f"sums per filter in one block's registers (has {cg * taps})")
    from .emit import operand_strides

    scalar, acc = SCALARS[problem.dtype]
    acc_bytes = 8 if acc == "double" else 4
    kg = problem.k // problem.groups
    kt = 1   # filters per block: as many as keep every thread's sums within MAX_OWNED
    while kt * 2 <= min(MAX_FILTERS, pow2_at_least(kg)) and -(-2 * kt * cg * taps // THREADS) <= MAX_OWNED:
        kt *= 2
    in_size, out_size = three(problem.in_size, 1), three(problem.out_size, 1)
    kernel, stride = three(problem.kernel, 1), three(problem.stride, 1)
    pad, dilation = three([low for low, _ in problem.padding], 0), three(problem.dilation, 1)

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
    layouts = (problem.input_layout, problem.weight_layout, problem.output_layout)
    return StemContext(
        version=generator_version(), problem_name=problem.name(), problem_key=problem.kernel_key(),
        target=target.name(), vendor=target.kind.value, wrappers=vendor_wrappers(target.kind.value),
        prefix=prefix, scalar=scalar, acc=acc,
        half=problem.dtype in (DType.BF16, DType.F16), channels=problem.c, filters=problem.k, groups=problem.groups,
        in_size=in_size, out_size=out_size, kernel=kernel, stride=stride, pad=pad, dilation=dilation,
        layouts=tuple(layout.value for layout in layouts),
        x_strides=operand_strides(problem.input_layout, problem.c, in_size),
        y_strides=operand_strides(problem.output_layout, problem.k, out_size),
        w_strides=operand_strides(problem.weight_layout, cg, kernel),
        x_channels_fast=problem.input_layout is Layout.CHANNELS_LAST,
        y_channels_fast=problem.output_layout is Layout.CHANNELS_LAST,
        threads=THREADS, kt=kt, tile=(th, tw), split=split, why=why)


def render_stem(problem: ConvProblem, target: Target, prefix: str = "conv") -> str:
    """CUDA or HIP source (by `target`) of the stem weight-gradient kernels for `problem`, with their entries."""
    from .emit import environment

    return environment().get_template("gpu/stem_wgrad.cu.j2").render(c=stem_context(problem, target, prefix))
