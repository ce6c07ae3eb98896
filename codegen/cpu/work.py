"""The floor under the CPU kernel families: how a parallel loop's work is handed out, how a weight
gradient's reduction is cut into fixed parts, the register budget a register tile counts with, and
the geometry tests several families share. A function of problem and target only."""

from __future__ import annotations

from ..ir import DType
from ..plan import Geometry, Plan

# Work items a parallel loop should offer at least, when the problem allows (a few per thread).
MIN_ITEMS = 16
# The weight-gradient reduction may be cut into at most this many parts, whose partial sums (at
# most PARTIAL_BYTES) are added in a fixed order.
MAX_SPLITS = 8
PARTIAL_BYTES = 16 << 20
# Register tiles leave this many vector registers free (addresses, broadcasts: no spills), and
# count as FMA-bound from this ratio of FMAs to loads on (see blocked.register_tile).
SPARE_REGISTERS = 3
FMA_PER_LOAD = 1.4
VECTOR_LOAD_COST = 1.5   # an unaligned vector load, in broadcasts
# FMAs per load from which a tile stepped in assembly counts as FMA-bound (see lanes.lanes_tile).
ASM_FMA_PER_LOAD = 12 / 7
# Results of at least this many L2s per call are written with non-temporal stores where a family
# streams them (lanes' forward, grouplanes): a cached store first reads the line it writes, so an
# output far larger than the L2 costs its size twice in memory traffic.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", STREAM_L2S)
STREAM_L2S = 4


def vector_lanes(plan: Plan) -> int:
    """Lanes of the target's vectors in the plan's accumulator type (at least one)."""
    return max(1, plan.target.vector_bytes // plan.problem.dtype.accumulator.itemsize)


def bf16_pairs(plan: Plan) -> bool:
    """Whether lanes tiles reduce this problem in bf16 pairs on vdpbf16ps (see Target.bf16_dot)."""
    return plan.problem.dtype is DType.BF16 and plan.target.bf16_dot


def asm_tile_registers(nv: int, pb: int) -> int:
    """Vector registers a CPU register tile of NV x PB accumulators stepped in assembly holds
    (templates/cpu/fma_tile.j2): the accumulators, the smaller side held, and one register that
    streams the other side."""
    return nv * pb + min(nv, pb) + 1


def reduction_splits(items: int, partial_bytes: int, chunks: int | None = None) -> int:
    """Fixed parts a weight-gradient reduction is cut into (their partial sums added in order):
    doubled while the work items are too few for the threads, up to MAX_SPLITS and PARTIAL_BYTES
    of partial sums, and (given `chunks`, the chunks of the reduction in one image) past four items
    only while every part keeps a whole chunk for a batch of one: parts of a few hundred pixels spent
    more on their own sums than they shared out, but fewer than four items left a thread idle.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", work.reduction_splits)"""
    splits = 1
    while (items * splits < MIN_ITEMS and splits < MAX_SPLITS and (splits * 2) * partial_bytes <= PARTIAL_BYTES
           and (chunks is None or items * splits < 4 or splits * 2 <= chunks)):
        splits *= 2
    return splits


def windows_inside(g: Geometry) -> bool:
    """Whether every output pixel's window lies inside the input (no padding to read): then the
    lanes and gemm kernels read the input in place instead of a zero-padded copy."""
    return not any(g.pad_lo) and all((y - 1) * s + (k - 1) * d + 1 <= x for x, y, k, s, d in
                                     zip(g.x_size, g.y_size, g.kernel, g.stride, g.dilation))

