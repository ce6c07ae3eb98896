"""The direct GPU kernel: every pass of a convolution, one GPU thread per result element,
rendered for CUDA or HIP from `templates/gpu/direct.cu.j2`.

It is the GPU side's reference kernel (clear, not fast): what the SIMT simulator and the vendor
compilers run first, and what faster GPU kernels are checked against. It takes every problem
convgen validates: rank 1-3 (as 3-D with unit axes in front), groups, stride, dilation,
asymmetric padding, transposed convolutions with output_padding (through the same equivalence as
the CPU passes: a transposed forward is the data gradient of the normal convolution with input
and output swapped, and so on; see codegen/passes/canonicalise.py), each tensor contiguous or
channels-last (compile-time strides per tensor), f32/f64/bf16/f16 (bf16 and f16 stored as their
16-bit patterns, converted by the generator's own round-to-nearest-even functions). Every sum
runs in double and is rounded once to the result's dtype. The batch size is a run-time argument.

Entries, one per user-level pass, with pointers by role (as the CPU entries), the batch and a
stream; each returns 0 when its kernels were launched:

    <prefix>_fwd(input, weight, bias, output, batch, stream)          bias may be null
    <prefix>_bwd_data(grad_output, weight, grad_input, batch, stream)
    <prefix>_bwd_weight(grad_output, input, grad_weight, batch, stream)
    <prefix>_bwd_weight_bias(grad_output, input, grad_weight, grad_bias, batch, stream)
    <prefix>_bwd_bias(grad_output, grad_bias, batch, stream)

The weight gradient with its bias gradient (`bwd_weight_bias`) is one launch: one thread per weight
element as `bwd_weight`, and past them one thread per bias channel summing grad_output over the
batch and that channel's pixels (in double, in a fixed order), as `bwd_bias` does alone.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import ConvSpecError
from ..ir import ConvProblem, DType
from ..plan import GpuTiling, KOp, Plan
from ..render import operand_strides, render
from ..target import Target, TargetKind
from .context import ENTRIES, GpuContext, check_entries, check_prefix, file_fields
from .family import Family
from .normal import Normal

TEMPLATE = "gpu/direct.cu.j2"
THREADS = 256   # threads per block: 8 warps (4 waves), enough for the simulator and any GPU
# Blocks per SM the CUDA kernels ask registers for (__launch_bounds__'s second argument; HIP leaves
# it to hipcc): 4 x 256 threads, 64 registers a thread. Without it ptxas aims at full occupancy,
# 32 registers, and spills the few bytes of a kernel that needs 33-40.
MIN_BLOCKS = 4
STORAGE = {DType.F32: "float", DType.F64: "double", DType.BF16: "unsigned short", DType.F16: "unsigned short"}
INT_LIMIT = 2**31 - 1
WHY = ("one GPU thread per result element, every sum in double and rounded once: the reference GPU kernel, "
       "any shape, layout and dtype")


@dataclasses.dataclass(frozen=True)
class Operand:
    """One activation tensor of the normal convolution (X or Y): channels, 3-D size and the
    element strides (n, c, d, h, w) of its caller's layout."""

    channels: int
    size: tuple[int, int, int]
    strides: tuple[int, int, int, int, int]


@dataclasses.dataclass(frozen=True)
class DirectContext(GpuContext):
    dtype: str             # f32, f64, bf16, f16
    storage: str           # the element type in memory
    transposed: bool
    x: Operand             # the normal convolution's input (a transposed problem's output)
    y: Operand             # its output (a transposed problem's input)
    w_strides: tuple[int, int, int, int, int]   # weight (Y channel, X channel in group, d, h, w)
    threads: int
    min_blocks: int        # blocks per SM the registers are budgeted for (CUDA)
    min_blocks_why: str
    index: str             # the C type of in-image offsets and coordinates: int, or long long when they need it
    index_why: str
    entries: tuple[str, ...]
    kernels: tuple[str, ...]   # the __global__ functions those entries launch (only these are rendered)
    generic: bool = False      # sizes at run time (codegen/gpu/generic.py's context says True)


def index_type(problem: ConvProblem, threads: int = THREADS) -> tuple[str, str]:
    """(C type, why) of the direct kernel's offsets within one image and within the weight: 32-bit
    `int` when the largest of them (with a block's overhang past the last thread) fits, else `long
    long`. Only the batch term of an activation offset stays 64-bit: half the registers and
    instructions of 64-bit index arithmetic (with the template's rolled loops, no direct kernel of
    the suites or CASES spills; see templates/gpu/direct.cu.j2)."""
    p = problem
    per_image = max(p.c * math.prod(p.in_size), p.k * math.prod(p.out_size),
                    p.k * (p.c // p.groups if p.groups else 0) * math.prod(p.kernel))
    if per_image + threads <= INT_LIMIT:
        return "int", f"32-bit in-image offsets: at most {per_image} elements per image or weight"
    return "long long", f"64-bit offsets: {per_image} elements per image or weight exceed int"


def min_blocks_reason(threads: int = THREADS) -> str:
    """Why the CUDA kernels ask for MIN_BLOCKS resident blocks, in the plan's and the file's words."""
    return (f"registers for {MIN_BLOCKS} blocks of {threads} threads per SM, {65536 // (MIN_BLOCKS * threads)} "
            f"a thread: without a target ptxas spilled to reach 32 (full occupancy)")


def direct_context(problem: ConvProblem, target: Target, prefix: str, *, threads: int = THREADS,
                   entries: tuple[str, ...] = ENTRIES) -> DirectContext:
    """The template context for `problem` on GPU `target`: entries `prefix`_<entry> for each of
    `entries` (a subset of ENTRIES), `threads` per block. ConvSpecError for a CPU target, a bad
    prefix or entry, or a thread count that is not a multiple of the warp size."""
    if target.kind is TargetKind.CPU or target.gpu is None:
        raise ConvSpecError(f"target {target.name()}: the direct GPU kernel needs a cuda or hip target")
    check_prefix(prefix)
    check_entries(entries)
    warp = target.gpu.warp_size
    if threads <= 0 or threads % warp or threads > target.gpu.max_threads_per_block:
        raise ConvSpecError(f"threads={threads}: threads per block must be a multiple of the warp size {warp} "
                            f"and at most {target.gpu.max_threads_per_block} on {target.name()}")
    p, normal = problem, Normal.of(problem)
    index = index_type(p, threads)
    x = Operand(normal.channels, normal.in_size, operand_strides(normal.layouts[0], normal.channels, normal.in_size))
    y = Operand(normal.filters, normal.out_size, operand_strides(normal.layouts[2], normal.filters, normal.out_size))
    return DirectContext(
        **file_fields(p, target, prefix, normal), dtype=p.dtype.value, storage=STORAGE[p.dtype],
        transposed=p.transposed, x=x, y=y,
        w_strides=operand_strides(p.weight_layout, normal.channels // p.groups if p.groups else 0, normal.kernel),
        threads=threads, min_blocks=MIN_BLOCKS, min_blocks_why=min_blocks_reason(threads), index=index[0],
        index_why=index[1], entries=tuple(entries),
        kernels=tuple(sorted({_launches(e, p.transposed) for e in entries})))


def _launches(entry: str, transposed: bool) -> str:
    """The kernel an entry launches: conv_y computes the normal convolution's output, conv_x its
    data gradient (a transposed convolution swaps the two), conv_w its weight gradient,
    sum_channels a bias gradient (conv_w too, fused, for bwd_weight_bias)."""
    return {"fwd": "conv_x" if transposed else "conv_y", "bwd_data": "conv_y" if transposed else "conv_x",
            "bwd_weight": "conv_w", "bwd_weight_bias": "conv_w", "bwd_bias": "sum_channels"}[entry]


def render_direct(problem: ConvProblem, target: Target, prefix: str = "conv", **options) -> str:
    """CUDA or HIP source (by `target`) of the direct kernels for `problem`, with their entries."""
    return render(TEMPLATE, c=direct_context(problem, target, prefix, **options))


def _results(plan: Plan) -> tuple[str, int, str]:
    """(what one thread computes, results per image or in all, what it sums over)."""
    g = plan.geometry
    taps = math.prod(g.kernel)
    if plan.kop is KOp.FWD:
        return "output element", g.cout * math.prod(g.y_size), f"{g.cin_g * taps} (channel, tap) products"
    if plan.kop is KOp.DGRAD:
        return ("input-gradient element", g.cin * math.prod(g.x_size),
                f"at most {g.cout_g * taps} (channel, tap) products")
    if plan.kop is KOp.WGRAD:
        return ("weight-gradient element", g.cout * g.cin_g * taps, f"batch x {math.prod(g.y_size)} output positions")
    channels = g.cout if plan.operands[0].kind == "Y" else g.cin
    return "bias-gradient channel", channels, "batch x its channel's pixels"


def _tiling(plan: Plan) -> tuple[GpuTiling, str]:
    """Whole warps per block (THREADS, or fewer where the arch allows fewer), one thread per result
    element, rolled loops, 32-bit in-image offsets where they fit."""
    gpu = plan.target.gpu
    threads = min(THREADS, gpu.max_threads_per_block) // gpu.warp_size * gpu.warp_size
    what, count, over = _results(plan)
    per_image = plan.kop in (KOp.FWD, KOp.DGRAD)
    bias = plan.kop is KOp.WGRAD and plan.problem.bias
    biases = (plan.geometry.cin if plan.problem.transposed else plan.geometry.cout) if bias else 0
    blocks = math.ceil((count * (plan.problem.n if per_image else 1) + biases) / threads)
    index, index_why = index_type(plan.problem, threads)
    occupancy = f"; {min_blocks_reason(threads)}" if plan.target.kind is TargetKind.CUDA else ""
    tiling = GpuTiling(threads_per_block=threads, warps_per_block=threads // gpu.warp_size, per_thread=what,
                       threads_hint=f"one thread per {what}, {count} {'per image' if per_image else 'in all'}")
    return tiling, (f"{threads} threads per block ({threads // gpu.warp_size} warps of {gpu.warp_size}); "
                    f"one thread per {what}, summing {over} in double in a fixed order (no atomics, "
                    f"no shared memory); {blocks} block(s) at batch {plan.problem.n}"
                    f"{' (the grid follows the run-time batch)' if per_image else ''}"
                    + ("; the bias gradient fused into the same launch: past the weights, one thread per "
                       "channel sums its batch x pixels in double" if bias else "")
                    + f"; every loop rolled, one load pair and multiply-add a step (unrolled, the "
                      f"compile-time trip counts held loads in flight past any register cap){occupancy}; "
                      f"offsets and coordinates within an image as {index} ({index_why})")


def _context(problem: ConvProblem, target: Target, prefix: str, *, threads: int, entries: tuple[str, ...],
             staged: tuple[str, ...]) -> DirectContext:
    return direct_context(problem, target, prefix, threads=threads, entries=entries)   # nothing is staged


FAMILY = Family("direct", lambda plan: None, lambda plan: WHY, _tiling, _context, TEMPLATE, lambda context: ())
