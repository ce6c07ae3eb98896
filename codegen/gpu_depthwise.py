"""The depthwise GPU kernels: forward, data gradient and weight gradient of convolutions whose
every group holds one input channel (groups == channels), rendered for CUDA or HIP from
`templates/gpu/depthwise.cu.j2`.

Taken: groups == C, K == C x multiplier (multiplier 1 is the usual depthwise; multiplier > 1,
as in CASES 7, is taken too: output channel k reads input channel k / multiplier), normal (not
transposed) problems, rank 1-3 (as 3-D with unit axes in front), stride, dilation, asymmetric
padding, each of input, weight and output contiguous or channels-last (every access through its
strides), f32/f64/bf16/f16 with f32 accumulation (f64 for f64) and one rounding at the end.

- forward: a block owns a tile of 1 x TH x TW output pixels of CT channels (CT = 1 when every
  tensor is contiguous; a run of channels when one is channels-last, so that consecutive threads
  read consecutive channels), stages the input window of the tile and the channels' taps in shared
  memory (zeros where the window overhangs the padding) and each thread computes a few outputs.
- data gradient: by stride phases (`gpu_igemm.axis_phases`): a launch per residue per axis, a
  block owns a tile of that phase's grad_input positions, stages the grad_output rows they gather
  from, and each position sums exactly the taps that reach it (no zero-insertion; residues with no
  taps are written as zeros by the same launch).
- weight gradient: per channel and tap, a reduction over batch x output pixels, split SPLIT ways
  over blocks; a block walks its share tile by tile (the forward's tile), each thread summing the
  products of its taps over a fixed subset of the tile's pixels, then a shuffle reduction across
  the LANES threads that share a (channel, tap). Partials (f32, f64 for f64) go to a workspace and
  a second kernel sums them in split order and rounds once: no atomics, the same bits in any
  order. `<prefix>_bwd_weight_workspace_bytes(batch)` says how many bytes `<prefix>_bwd_weight(
  grad_output, input, grad_weight, workspace, batch, stream)` needs; `<prefix>_bwd_bias` has the
  direct kernel's signature (one block per filter, a fixed-order reduction), for the bias gradient
  asked alone; asked with the weight gradient it is fused into it (BIAS_WHY,
  `<prefix>_bwd_weight_bias(grad_output, input, grad_weight, grad_bias, workspace, batch, stream)`).
"""

from __future__ import annotations

import dataclasses
import math

from .errors import ConvSpecError
from .gpu_igemm import Phase, axis_phases
from .gpu_wrappers import vendor_wrappers
from .gpu_target import GPU_ARCHS
from .ir import ConvProblem, DType, Layout
from .target import Target, TargetKind
from .version import generator_version

# dtype -> (storage type, accumulator type); 16-bit storage converts through the wrappers
SCALARS = {DType.F32: ("float", "float"), DType.F64: ("double", "double"),
           DType.BF16: ("convgen_bf16", "float"), DType.F16: ("convgen_f16", "float")}
THREADS = 256            # 8 warps or 4 waves; every tile loop below is written for this many
OUTPUTS_PER_THREAD = 2   # the forward's and data gradient's tile: THREADS x this many results
SHARED_BUDGET = 32 * 1024   # static shared memory per block: under the 48 KiB limit, two blocks per SM
MAX_SPLIT = 64
MAX_TAPS = 256           # weight gradient: a thread keeps ceil(taps / SLOTS) sums in registers
REDUCE_GROUP = 32        # CT x LANES: the threads of one (tap) sum lie in an aligned group of 32 lanes
BIAS_WHY = ("bias gradient fused into the weight gradient's two launches: the threads of tap slot 0 also sum "
            "their channel's staged grad_output tiles (the same lanes and shuffle tree) into partials after the "
            "weight's in the workspace, added in split order by the second kernel and rounded once")


@dataclasses.dataclass(frozen=True)
class DepthwiseContext:
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
    ct: int
    tile: tuple[int, int]          # forward and weight gradient: TH x TW output pixels
    data_tile: tuple[int, int]     # data gradient: TH x TW positions of one phase
    data_window: tuple[int, int, int]   # grad_output planes, rows, columns a data tile gathers from
    lanes: int
    split: int
    phases: tuple[Phase, ...]
    why: tuple[str, ...]


def three(values, fill: int) -> tuple[int, int, int]:
    return (fill,) * (3 - len(values)) + tuple(values)


def pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def shrink_tile(th: int, tw: int, shared_bytes, what: str) -> tuple[int, int]:
    """Halve the tile (rows first) until `shared_bytes(th, tw)` fits SHARED_BUDGET."""
    while shared_bytes(th, tw) > SHARED_BUDGET:
        if th > 1:
            th //= 2
        elif tw > 1:
            tw //= 2
        else:
            raise ConvSpecError(f"{what}: even a one-pixel tile needs {shared_bytes(1, 1)} bytes of shared memory "
                                f"(at most {SHARED_BUDGET}); the kernel or dilation is too large for this kernel")
    return th, tw


def choose_tile(rows: int, cols: int, pixels: int, min_cols: int, shared_bytes, what: str) -> tuple[int, int]:
    """A TH x TW tile (powers of two, TH x TW <= pixels) over a rows x cols image that stages the
    fewest shared-memory elements per useful pixel (square-ish tiles where windows overlap), with
    rows of at least `min_cols` (coalesced reads along a contiguous row) where the image is that wide."""
    best, widest = None, min(pixels, pow2_at_least(cols))
    tw = min(min_cols, widest)
    while tw <= widest:
        th, tw_fit = shrink_tile(min(pow2_at_least(rows), max(1, pixels // tw)), tw, shared_bytes, what)
        cost = shared_bytes(th, tw_fit) / (min(th, rows) * min(tw_fit, cols))
        if best is None or cost < best[0]:
            best = (cost, th, tw_fit)
        tw *= 2
    return best[1], best[2]


def check_common(problem: ConvProblem, target: Target, prefix: str, kernel_name: str) -> None:
    """What every GPU kernel of this family refuses, by name."""
    if target.kind is TargetKind.CPU:
        raise ConvSpecError(f"target {target.name()}: the {kernel_name} needs a cuda or hip target")
    if problem.transposed:
        raise ConvSpecError(f"transposed=True: the {kernel_name} takes normal convolutions "
                            "(a transposed one is the data gradient of a normal one)")
    if not prefix.isidentifier():
        raise ConvSpecError(f"prefix {prefix!r}: entry names must be C identifiers")
    if problem.dtype not in SCALARS:
        raise ConvSpecError(f"dtype {problem.dtype.value}: the {kernel_name} takes f32, f64, bf16 or f16")
    too_big = {name: count for name, count in (("an input image", problem.c * math.prod(problem.in_size)),
                                               ("an output image", problem.k * math.prod(problem.out_size)),
                                               ("the weight", math.prod(problem.weight_shape))) if count >= 2**31}
    if too_big:
        raise ConvSpecError(f"size: the {kernel_name} indexes within one image and the weight in 32 bits; "
                            + ", ".join(f"{name} has {count} elements" for name, count in too_big.items())
                            + " (at most 2^31 - 1)")


def split_ways(blocks: int, items_per_image: int, target: Target) -> tuple[int, str]:
    """How many ways to split a weight gradient's batch x tiles reduction, and why."""
    units = target.gpu.sm_count if target.gpu else GPU_ARCHS[target.isa].sm_count
    by_units = -(-2 * units // blocks)
    split = max(1, min(MAX_SPLIT, by_units, 4 * items_per_image))
    unit = "SM" if target.kind is TargetKind.CUDA else "CU"
    return split, (f"weight gradient: {blocks} blocks of outputs; the reduction over batch x {items_per_image} "
                   f"tiles per image split {split} ways (about two blocks per {unit} of {units}, at most 4 x one "
                   f"image's tiles), partials summed in split order")


def depthwise_context(problem: ConvProblem, target: Target, prefix: str) -> DepthwiseContext:
    """The template context for depthwise `problem` on GPU `target`; entries are named
    `prefix`_fwd, _bwd_data, _bwd_weight (+ _bwd_weight_workspace_bytes) and _bwd_bias.
    ConvSpecError for what this kernel does not take."""
    name = "depthwise GPU kernel"
    check_common(problem, target, prefix, name)
    if problem.groups != problem.c or problem.k % problem.c:
        raise ConvSpecError(f"groups={problem.groups}, channels={problem.c}, filters={problem.k}: the {name} takes "
                            "one input channel per group (groups == channels) and filters a multiple of channels")
    if problem.c == 0:
        raise ConvSpecError(f"channels=0: the {name} needs at least one channel")
    taps = math.prod(problem.kernel)
    if taps > MAX_TAPS:
        raise ConvSpecError(f"kernel {problem.kernel}: the {name} takes at most {MAX_TAPS} taps (has {taps})")
    from .emit import operand_strides   # the CPU kernels' strides per layout

    scalar, acc = SCALARS[problem.dtype]
    acc_bytes = 8 if acc == "double" else 4
    in_size, out_size = three(problem.in_size, 1), three(problem.out_size, 1)
    kernel, stride = three(problem.kernel, 1), three(problem.stride, 1)
    pad, dilation = three([low for low, _ in problem.padding], 0), three(problem.dilation, 1)
    layouts = (problem.input_layout, problem.weight_layout, problem.output_layout)
    channels_last = Layout.CHANNELS_LAST in layouts
    ct = min(REDUCE_GROUP, pow2_at_least(problem.k)) if channels_last else 1
    lanes = REDUCE_GROUP // ct
    pixels = THREADS * OUTPUTS_PER_THREAD // ct

    def window(th, tw):   # input rows and columns under a th x tw output tile
        return (th - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1, (tw - 1) * stride[2] + (kernel[2] - 1) * dilation[2] + 1

    def fwd_bytes(th, tw):   # input window of every depth tap + (taps for the forward, or the grad_output tile)
        wh, ww = window(th, tw)
        return acc_bytes * ct * (kernel[0] * wh * ww + max(taps, th * tw))

    what = f"kernel {problem.kernel}, dilation {problem.dilation}"
    min_cols = 1 if channels_last else 32   # contiguous rows: a warp's worth of consecutive pixels
    th, tw = choose_tile(out_size[1], out_size[2], pixels, min_cols, fwd_bytes, what)

    per_axis = [axis_phases(*args) for args in zip(in_size, out_size, kernel, stride, pad, dilation)]
    phases = tuple(Phase((d, h, w)) for d in per_axis[0] for h in per_axis[1] for w in per_axis[2])
    reach = [max([0] + [(a.taps - 1) * a.out_step for a in axis]) for axis in per_axis]   # 0: no taps at all
    planes = max((a.taps for a in per_axis[0]), default=0) or 1   # grad_output depth planes a position gathers

    def data_bytes(dth, dtw):
        return acc_bytes * ct * (planes * (dth + reach[1]) * (dtw + reach[2]) + taps)

    counts = [max((a.count for a in axis), default=1) for axis in per_axis]
    dth, dtw = choose_tile(counts[1], counts[2], pixels, min_cols, data_bytes, what)

    tiles_per_image = out_size[0] * -(-out_size[1] // th) * -(-out_size[2] // tw)
    split, split_why = split_ways(-(-problem.k // ct), tiles_per_image, target)
    order = "a run of channels x pixels (channels-last: consecutive threads read consecutive channels)" \
        if channels_last else "pixels of one channel (consecutive threads read consecutive pixels)"
    why = (f"forward and weight gradient: {THREADS} threads own {ct} channel(s) x {th}x{tw} output pixels, "
           f"{order}; input window {fwd_bytes(th, tw)} bytes of shared memory",
           f"data gradient: {len(phases)} stride phases, tiles of {ct} channel(s) x {dth}x{dtw} positions, "
           f"each gathering only its phase's taps from {data_bytes(dth, dtw)} bytes of staged grad_output",
           f"weight gradient: {lanes} thread(s) per (channel, tap) over a tile's pixels"
           + (", reduced by shuffles; " if lanes > 1 else "; ") +
           f"{THREADS // (ct * lanes)} tap slots, {-(-taps // (THREADS // (ct * lanes)))} sums per thread",
           split_why)
    return DepthwiseContext(
        version=generator_version(), problem_name=problem.name(), problem_key=problem.kernel_key(),
        target=target.name(), vendor=target.kind.value, wrappers=vendor_wrappers(target.kind.value),
        prefix=prefix, scalar=scalar, acc=acc,
        half=problem.dtype in (DType.BF16, DType.F16), channels=problem.c, filters=problem.k,
        groups=problem.groups, in_size=in_size, out_size=out_size, kernel=kernel, stride=stride, pad=pad,
        dilation=dilation, layouts=tuple(layout.value for layout in layouts),
        x_strides=operand_strides(problem.input_layout, problem.c, in_size),
        y_strides=operand_strides(problem.output_layout, problem.k, out_size),
        w_strides=operand_strides(problem.weight_layout, 1, kernel),
        x_channels_fast=problem.input_layout is Layout.CHANNELS_LAST,
        y_channels_fast=problem.output_layout is Layout.CHANNELS_LAST,
        threads=THREADS, ct=ct, tile=(th, tw), data_tile=(dth, dtw),
        data_window=(planes, dth + reach[1], dtw + reach[2]), lanes=lanes, split=split, phases=phases, why=why)


def render_depthwise(problem: ConvProblem, target: Target, prefix: str = "conv") -> str:
    """CUDA or HIP source (by `target`) of the depthwise kernels for `problem`, with their entries."""
    from .emit import environment

    return environment().get_template("gpu/depthwise.cu.j2").render(c=depthwise_context(problem, target, prefix))
