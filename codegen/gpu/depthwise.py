"""The depthwise GPU kernels: forward, data gradient and weight gradient of convolutions whose
every group holds one input channel (groups == channels), or a few (grouped convolutions of at most
MAX_GROUP channels and filters a group, as ResNeXt's 32 groups of 4), rendered for CUDA or HIP from
`templates/gpu/depthwise.cu.j2`.

Taken: groups == C, K == C x multiplier (multiplier 1 is the usual depthwise; multiplier > 1,
as in CASES 7, is taken too: output channel k reads input channel k / multiplier); or groups > 1
with C / groups and K / groups both at most MAX_GROUP (an implicit GEMM's tiles, 64 filters and
more, would hold a group's few filters: output channel k reads input channels k / (K/G) * (C/G) + cl);
normal (not
transposed) problems, rank 1-3 (as 3-D with unit axes in front), stride, dilation, asymmetric
padding, each of input, weight and output contiguous or channels-last (every access through its
strides), f32/f64/bf16/f16 with f32 accumulation (f64 for f64) and one rounding at the end.

- forward: a block owns a tile of 1 x TH x TW output pixels of CT channels (CT = 1 when every
  tensor is contiguous; a run of channels when one is channels-last, so that consecutive threads
  read consecutive channels), stages the input window of the tile and the channels' taps in shared
  memory (zeros where the window overhangs the padding) and each thread computes a few outputs;
  with several channels a group, one input channel of each filter's group at a time.
- data gradient: by stride phases (normal.py): a launch per residue per axis, a block owns a tile
  of that phase's grad_input positions, stages the grad_output rows they gather from, and each
  position sums exactly the taps that reach it (no zero-insertion; residues with no taps are
  written as zeros by the same launch).
- weight gradient: per (filter, channel of its group, tap), a reduction over batch x output pixels,
  split SPLIT ways over blocks; a block walks its share tile by tile (the forward's tile), each
  thread summing the products of its taps over a fixed subset of the tile's pixels, then a shuffle
  reduction across the LANES threads that share a (channel, tap). Where a thread can keep every
  (channel, tap) sum (MAX_SUMS), every thread takes every tap and the SLOTS tap slots take the pixels
  in turn instead (taps dealt to slots left most of them idle: 9 taps on 8 slots, a 1x1 kernel's
  one), the slots' sums added in slot order through shared memory when the block is done. Partials
  (f32, f64 for f64) go to a workspace and a second kernel sums them in split order and rounds once: no atomics, the same bits in any
  order. `<prefix>_bwd_weight_workspace_bytes(batch)` says how many bytes `<prefix>_bwd_weight(
  grad_output, input, grad_weight, workspace, batch, stream)` needs; `<prefix>_bwd_bias` has the
  direct kernel's signature (one block per filter, a fixed-order reduction), for the bias gradient
  asked alone; asked with the weight gradient it is fused into it (BIAS_WHY,
  `<prefix>_bwd_weight_bias(grad_output, input, grad_weight, grad_bias, workspace, batch, stream)`).
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import ConvSpecError
from ..ir import ConvProblem, Layout
from ..plan import GpuTiling, Plan
from ..render import render
from ..target import Target
from .context import ENTRIES, file_fields, tensor_fields
from .family import Family
from .normal import Normal, Phase
from .windows import (THREADS, WindowContext, acc_bytes, check_common, choose_tile, fixed_block_context,
                      fixed_block_tiling, pow2_at_least, refusal_of, split_ways, window_fields)

TEMPLATE = "gpu/depthwise.cu.j2"
NAME = "depthwise GPU kernel"
OUTPUTS_PER_THREAD = 2   # the forward's and data gradient's tile: THREADS x this many results
# ... of a block of several channels (channels-last): 2 gave CT = 32 channels 4x4 pixels, whose 6x6 windows
# (3x3 taps) read each input 2.25 times, and a weight-gradient item of 32 products a thread between barriers
OUTPUTS_PER_THREAD_CHANNELS = 8
MAX_TAPS = 256           # weight gradient: a thread keeps ceil(taps / SLOTS) sums in registers
MAX_GROUP = 4            # grouped: at most this many channels and filters a group (more: the implicit GEMM, whose
                         # tiles of 64 filters and more waste less there; where the line lies is not measured yet)
MAX_SUMS = 32            # weight gradient: a thread's sums, (channels a group) x ceil(taps / SLOTS)
REDUCE_GROUP = 32        # CT x LANES: the threads of one (tap) sum lie in an aligned group of 32 lanes
SLOTS = THREADS // REDUCE_GROUP   # the weight gradient's tap slots, CT x LANES threads each
WHY = ("depthwise (groups == channels) or a few channels a group: a block stages shared-memory windows of its "
       "channels' pixels, the data gradient by stride phases, the weight gradient split over blocks with partials "
       "summed in order; every dtype")
BIAS_WHY = ("bias gradient fused into the weight gradient's two launches: the threads of tap slot 0 (of every slot, "
            "over its pixels, where the slots split the pixels) also sum their channel's staged grad_output tiles "
            "(the same lanes, shuffle tree and slot order) into partials after the weight's in the workspace, added "
            "in split order by the second kernel and rounded once")


@dataclasses.dataclass(frozen=True)
class DepthwiseTiles:
    """The kernels' tiles: CT channels a block, LANES threads per (channel, tap) sum, the forward's
    (and weight gradient's) and the data gradient's tiles, the grad_output window a data tile
    gathers from, the weight gradient's split, and why."""

    ct: int
    ct_pad: int                    # a pixel's channels in shared memory lie CT_PAD apart (CT, or odd)
    pixel_split: bool              # weight gradient: every thread every tap, the tap slots splitting pixels
    lanes: int
    tile: tuple[int, int]          # forward and weight gradient: TH x TW output pixels
    data_tile: tuple[int, int]     # data gradient: TH x TW positions of one phase
    data_window: tuple[int, int, int]   # grad_output planes, rows, columns a data tile gathers from
    split: int
    phases: tuple[Phase, ...]
    why: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class DepthwiseContext(WindowContext):
    ct: int
    ct_pad: int
    pixel_split: bool
    tile: tuple[int, int]
    data_tile: tuple[int, int]
    data_window: tuple[int, int, int]
    lanes: int
    phases: tuple[Phase, ...]


def check(problem: ConvProblem, target: Target, prefix: str) -> DepthwiseTiles:
    """The tiles of `problem`, entries named `prefix`_<entry>; ConvSpecError for what the depthwise
    kernels do not take."""
    check_common(problem, target, prefix, NAME)
    if problem.c == 0:
        raise ConvSpecError(f"channels=0: the {NAME} needs at least one channel")
    cg, kg = problem.c // problem.groups, problem.k // problem.groups
    if problem.c % problem.groups or problem.k % problem.groups or not (
            cg == 1 or (problem.groups > 1 and cg <= MAX_GROUP and kg <= MAX_GROUP)):
        raise ConvSpecError(f"groups={problem.groups}, channels={problem.c}, filters={problem.k}: the {NAME} takes "
                            f"one input channel per group (groups == channels), or groups of at most {MAX_GROUP} "
                            f"channels and {MAX_GROUP} filters")
    taps = math.prod(problem.kernel)
    if taps > MAX_TAPS:
        raise ConvSpecError(f"kernel {problem.kernel}: the {NAME} takes at most {MAX_TAPS} taps (has {taps})")
    if cg * -(-taps // SLOTS) > MAX_SUMS:
        raise ConvSpecError(f"kernel {problem.kernel}, {cg} channels a group: the {NAME}'s weight gradient keeps "
                            f"{cg} x ceil({taps} taps / {SLOTS}) sums a thread (at most {MAX_SUMS})")
    return choose_tiles(problem, target)


def choose_tiles(problem: ConvProblem, target: Target) -> DepthwiseTiles:
    """The tiles of a problem the other checks take: the fewest staged elements per useful pixel within the
    shared-memory budget (ConvSpecError when not even one pixel fits)."""
    normal = Normal.of(problem)
    kernel, stride, dilation, out_size = normal.kernel, normal.stride, normal.dilation, normal.out_size
    taps = math.prod(problem.kernel)
    cg = problem.c // problem.groups
    acc = acc_bytes(problem)
    channels_last = Layout.CHANNELS_LAST in (problem.input_layout, problem.weight_layout, problem.output_layout)
    ct = min(REDUCE_GROUP, pow2_at_least(problem.k)) if channels_last else 1
    # Lanes take consecutive channels where a tensor is channels-last and consecutive pixels where it is not:
    # with both kinds, a pixel's channels lie an odd number of words apart, so that neither meets a bank twice.
    all_last = problem.input_layout is Layout.CHANNELS_LAST and problem.output_layout is Layout.CHANNELS_LAST
    ct_pad = ct if ct == 1 or all_last else ct | 1
    lanes = REDUCE_GROUP // ct
    pixels = THREADS * (OUTPUTS_PER_THREAD_CHANNELS if ct > 1 else OUTPUTS_PER_THREAD) // ct

    # weight gradient: where a thread can keep every (channel of the group, tap) sum, the tap slots split
    # the pixels instead of the taps (balanced whatever the taps), their sums added through shared memory
    pixel_split = cg * taps <= MAX_SUMS
    totals = cg * taps if pixel_split else 0

    def fwd_bytes(th, tw):   # input window of every depth tap + (taps for the forward, or the grad_output tile)
        wh = (th - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1
        ww = (tw - 1) * stride[2] + (kernel[2] - 1) * dilation[2] + 1
        return acc * ct_pad * (kernel[0] * wh * ww + max(cg * taps, th * tw) + totals) + 8 * ct * pixel_split

    what = f"kernel {problem.kernel}, dilation {problem.dilation}"
    min_cols = 1 if channels_last else 32   # contiguous rows: a warp's worth of consecutive pixels
    th, tw = choose_tile(out_size[1], out_size[2], pixels, min_cols, fwd_bytes, what)

    per_axis = normal.axis_phases()
    phases = normal.phases()
    reach = [max([0] + [(a.taps - 1) * a.out_step for a in axis]) for axis in per_axis]   # 0: no taps at all
    planes = max((a.taps for a in per_axis[0]), default=0) or 1   # grad_output depth planes a position gathers

    def data_bytes(dth, dtw):
        return acc * ct_pad * (planes * (dth + reach[1]) * (dtw + reach[2]) + taps)

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
           (f"every thread every tap ({cg * taps} sums), {SLOTS} slots taking the tile's pixels in turn, their "
            "sums added in slot order through shared memory" if pixel_split else
            f"{SLOTS} tap slots, {cg * -(-taps // SLOTS)} sums per thread"),
           split_why)
    return DepthwiseTiles(ct, ct_pad, pixel_split, lanes, (th, tw), (dth, dtw),
                          (planes, dth + reach[1], dtw + reach[2]), split, phases, why)


def depthwise_context(problem: ConvProblem, target: Target, prefix: str) -> DepthwiseContext:
    """The template context for depthwise `problem` on GPU `target`; entries are named
    `prefix`_fwd, _bwd_data, _bwd_weight (+ _bwd_weight_workspace_bytes) and _bwd_bias.
    ConvSpecError for what this kernel does not take."""
    tiles = check(problem, target, prefix)
    normal = Normal.of(problem)
    return DepthwiseContext(
        **file_fields(problem, target, prefix, normal), **tensor_fields(normal), **window_fields(problem),
        ct=tiles.ct, ct_pad=tiles.ct_pad, pixel_split=tiles.pixel_split, tile=tiles.tile, data_tile=tiles.data_tile,
        data_window=tiles.data_window, lanes=tiles.lanes, split=tiles.split, phases=tiles.phases, why=tiles.why)


def render_depthwise(problem: ConvProblem, target: Target, prefix: str = "conv") -> str:
    """CUDA or HIP source (by `target`) of the depthwise kernels for `problem`, with their entries."""
    return render(TEMPLATE, c=depthwise_context(problem, target, prefix))


def _refusal(plan: Plan) -> str | None:
    return refusal_of(check, plan)


def _tiling(plan: Plan) -> tuple[GpuTiling, str]:
    return fixed_block_tiling(plan, "a block per tile of channels x output pixels (or a stride phase's positions)",
                              choose_tiles(plan.problem, plan.target).why, BIAS_WHY)


FAMILY = Family("depthwise", _refusal, lambda plan: WHY, _tiling, fixed_block_context(depthwise_context, ENTRIES),
                TEMPLATE, lambda context: ("bwd_weight", "bwd_weight_bias"))
