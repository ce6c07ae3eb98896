"""What the depthwise and stem kernels share: a fixed block of THREADS threads that stages windows of
the input (and tiles of grad_output) in shared memory, a tile search over output rows and columns
under a shared-memory budget, the weight gradient's reduction split over blocks with partials
summed in split order, their common refusals and their context's extra fields.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from ..errors import ConvSpecError
from ..ir import ConvProblem, DType, Layout
from ..arch.gpu import GPU_ARCHS
from ..plan import GpuTiling, KOp, Plan
from ..target import Target, TargetKind
from .context import TensorContext, check_entries, check_prefix

# dtype -> (storage type, accumulator type); 16-bit storage converts through the wrappers
SCALARS = {DType.F32: ("float", "float"), DType.F64: ("double", "double"),
           DType.BF16: ("convgen_bf16", "float"), DType.F16: ("convgen_f16", "float")}
THREADS = 256            # 8 warps or 4 waves; every tile loop of both templates is written for this many
SHARED_BUDGET = 32 * 1024   # static shared memory per block: under the 48 KiB limit, two blocks per SM
MAX_SPLIT = 256   # a weight gradient's partials per weight: two blocks an SM even where a single block owns every output


@dataclasses.dataclass(frozen=True)
class WindowContext(TensorContext):
    half: bool
    x_channels_fast: bool
    y_channels_fast: bool
    threads: int


def acc_bytes(problem: ConvProblem) -> int:
    """Bytes of `problem`'s accumulator type (SCALARS): 8 for f64, else 4."""
    return 8 if SCALARS[problem.dtype][1] == "double" else 4


def window_fields(problem: ConvProblem) -> dict:
    """WindowContext's own fields (and the scalar types) for `problem`."""
    scalar, acc = SCALARS[problem.dtype]
    return dict(scalar=scalar, acc=acc, half=problem.dtype in (DType.BF16, DType.F16),
                x_channels_fast=problem.input_layout is Layout.CHANNELS_LAST,
                y_channels_fast=problem.output_layout is Layout.CHANNELS_LAST, threads=THREADS)


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
    """What every GPU kernel of these families refuses, by name."""
    if target.kind is TargetKind.CPU:
        raise ConvSpecError(f"target {target.name()}: the {kernel_name} needs a cuda or hip target")
    if problem.transposed:
        raise ConvSpecError(f"transposed=True: the {kernel_name} takes normal convolutions "
                            "(a transposed one is the data gradient of a normal one)")
    check_prefix(prefix)
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
    units = (target.gpu or GPU_ARCHS[target.isa]).sm_count
    by_units = -(-2 * units // blocks)
    split = max(1, min(MAX_SPLIT, by_units, 4 * items_per_image))
    unit = "SM" if target.kind is TargetKind.CUDA else "CU"
    return split, (f"weight gradient: {blocks} blocks of outputs; the reduction over batch x {items_per_image} "
                   f"tiles per image split {split} ways (about two blocks per {unit} of {units}, at most 4 x one "
                   f"image's tiles), partials summed in split order")


def refusal_of(check: Callable[[ConvProblem, Target, str], object], plan: Plan) -> str | None:
    """The family's own ConvSpecError for the plan's problem (`check` tests every limit), or None."""
    try:
        check(plan.problem, plan.target, "p")
    except ConvSpecError as e:
        return str(e)
    return None


def fixed_block_context(context: Callable, entries_taken: tuple[str, ...]) -> Callable:
    """Family.context for kernels whose block is THREADS and that render all their entries: checks
    `threads` and `entries` against them (nothing is staged)."""
    def context_for(problem, target, prefix, *, threads, entries, staged=()):
        if threads != THREADS:
            raise ConvSpecError(f"threads={threads}: this kernel's block is {THREADS} threads")
        check_entries(entries, entries_taken)
        return context(problem, target, prefix)
    return context_for


def fixed_block_tiling(plan: Plan, what: str, why: tuple[str, ...], bias_why: str) -> tuple[GpuTiling, str]:
    """The fixed block's tiling: its tiles and split in the family's own words (`why`), and how a
    weight gradient's fused bias gradient is computed."""
    bias = plan.kop is KOp.WGRAD and plan.problem.bias
    gpu = plan.target.gpu
    unit = "warps" if gpu.warp_size == 32 else "waves"
    tiling = GpuTiling(threads_per_block=THREADS, warps_per_block=THREADS // gpu.warp_size,
                       per_thread=what, threads_hint=f"{THREADS} threads per block; {what}")
    return tiling, (f"{THREADS} threads per block ({THREADS // gpu.warp_size} {unit} of {gpu.warp_size}); "
                    + "; ".join(why + ((bias_why,) if bias else ())))
