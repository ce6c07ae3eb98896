"""The shape-generic tier: one kernel per (kernel op, dtype, CPU target) that takes every size of the
problem at run time (templates/cpu/generic.cpp.j2), built once and then serving any problem of
that kernel op at once, while the kernel specialised for the problem is built (runtime/dispatch/tiers.py).

Every pass is an implicit GEMM with run-time sizes (the way library kernels such as oneDNN's, cuDNN's or
CUTLASS's take their sizes), on a register tile fixed at compile time by the target's vectors. The
caller gives the plan it would have built (the problem lowered as usual: its kernel op, normal
geometry and internal layouts), and `sizes(plan)` turns it into the kernel's size array.
"""

from __future__ import annotations

import dataclasses

from ..ir import DType
from ..plan import KOp, Plan
from ..render import operand_strides, render
from ..source import KernelSource
from ..target import Target, TargetKind
from ..version import generator_version
from .context import ACCUMULATOR, STORAGE

NAME = "generic"
TEMPLATE = "cpu/generic.cpp.j2"
KOPS = (KOp.FWD, KOp.DGRAD, KOp.WGRAD, KOp.BIAS)
# the kernel's size array, in the order of the template's `Geo`
SIZE_FIELDS = ("groups", "cin_g", "cout_g", "x_size[3]", "y_size[3]", "kernel[3]", "stride[3]", "pad_lo[3]",
               "dilation[3]", "X strides[5]", "Y strides[5]", "W strides[5]", "bias source strides[5]",
               "bias source (0 none, 1 Y, 2 X)")
SIZE_WORDS = 42
# the entry's parameters: the normal convolution's operands by kind, the size array, batch, threads
SIGNATURE = (("ptr", "X"), ("ptr", "W"), ("ptr", "Y"), ("ptr", "B"), ("ptr", "sizes"), ("i64", "n"),
             ("i32", "nthreads"))


@dataclasses.dataclass(frozen=True)
class GenericContext:
    entry: str
    kop: str
    dtype: str
    storage: str
    acc: str
    lanes: int
    vector_bytes: int
    rows: int         # rows of the register tile (MR): two vectors wide, as many rows as the registers hold
    g: None = None    # no compile-time geometry (templates/cpu/common.h.j2 leaves out its constants)
    t: None = None    # no plan tiling


def tile_rows(target: Target) -> int:
    """MR: 2 * MR accumulators, two vectors of the B panel and a broadcast fit the target's vector
    registers (12 rows with 32 registers, 6 with 16)."""
    return 12 if target.vector_registers >= 32 else 6


def serves(plan: Plan) -> bool:
    """Whether the generic tier computes `plan` (a CPU plan with a kernel)."""
    return plan.target.kind is TargetKind.CPU and plan.kop in KOPS and plan.algorithm not in (None, "empty")


def source(kop: KOp, dtype: DType, target: Target) -> KernelSource:
    """The generic kernel of `kop` for `dtype` on the CPU `target`."""
    name = f"generic_{kop.value}_{dtype.value}_{target.isa}"
    entry = f"cg_{name}"
    lanes = max(1, target.vector_bytes // dtype.accumulator.itemsize)
    header = {"version": generator_version(), "problem_name": f"every {kop.value} problem in {dtype.value}",
              "problem_key": "(sizes at run time)", "target": target.name(), "kernel": kop.value,
              "algorithm": NAME, "entry": entry,
              "reasons": (("tier", "shape-generic: sizes, strides, padding, dilation and groups are run-time "
                                   "arguments"),)}
    context = GenericContext(entry=entry, kop=kop.value, dtype=dtype.value, storage=STORAGE[dtype],
                             acc=ACCUMULATOR[dtype], lanes=lanes, vector_bytes=lanes * dtype.accumulator.itemsize,
                             rows=tile_rows(target))
    return KernelSource(name=name, text=render(TEMPLATE, h=header, c=context), entry=entry, signature=SIGNATURE,
                        target=target)


def sizes(plan: Plan) -> tuple[int, ...]:
    """The generic kernel's size array for `plan` (SIZE_FIELDS): its geometry, the element strides of
    its operands in the plan's internal layouts, and the bias gradient's source."""
    g, layouts = plan.geometry, dict(plan.layouts)
    words = [g.groups, g.cin_g, g.cout_g, *g.x_size, *g.y_size, *g.kernel, *g.stride, *g.pad_lo, *g.dilation]
    shapes = {"X": (g.cin, g.x_size), "Y": (g.cout, g.y_size), "W": (g.cin_g, g.kernel)}
    for kind in ("X", "Y", "W"):
        words += operand_strides(layouts[kind], *shapes[kind]) if kind in layouts else (0,) * 5
    source = plan.bias_from or (("Y" if "Y" in layouts else "X") if plan.kop is KOp.BIAS else None)
    words += operand_strides(layouts[source], *shapes[source]) if source else (0,) * 5
    words.append({None: 0, "Y": 1, "X": 2}[source])
    assert len(words) == SIZE_WORDS
    return tuple(words)


def kinds(plan: Plan) -> dict[str, str]:
    """The caller's role of each kernel operand kind of `plan` (X, W, Y, B)."""
    return {op.kind: op.role for op in plan.operands}
