"""The shape-generic tier: one kernel per (kernel op, dtype, CPU target) that takes every size of the
problem at run time (templates/cpu/generic.cpp.j2), built once and then serving any problem of
that kernel op at once, while the kernel specialised for the problem is built (runtime/dispatch/tiers.py).

Every pass is an implicit GEMM with run-time sizes (the way library kernels such as oneDNN's, cuDNN's or
CUTLASS's take their sizes), on a register tile fixed at compile time by the target's vectors. The
caller gives the plan it would have built (the problem lowered as usual: its kernel op, normal
geometry and internal layouts), and `sizes(plan)` (codegen/sizes.py, the GPU's generic tier's too)
turns it into the kernel's size array.
"""

from __future__ import annotations

import dataclasses

from ..ir import DType
from ..keys import sha256_text
from ..plan import KOp, Plan
from ..render import render
from ..sizes import LAYER_WORDS, SIZE_FIELDS, SIZE_WORDS, Layer, kinds, sizes  # noqa: F401 (the tier's names)
from ..source import KernelSource
from ..target import Target, TargetKind
from ..version import generator_version
from .context import ACCUMULATOR, STORAGE

NAME = "generic"
TEMPLATE = "cpu/generic.cpp.j2"
KOPS = (KOp.FWD, KOp.DGRAD, KOp.WGRAD, KOp.BIAS)
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
    layer: "Layer | None" = None   # a layer's kernel: its constants (None: every size at run time)
    g: None = None    # no compile-time geometry (templates/cpu/common.h.j2 leaves out its constants)
    t: None = None    # no plan tiling


def tile_rows(target: Target) -> int:
    """MR: 2 * MR accumulators, two vectors of the B panel and a broadcast fit the target's vector
    registers (12 rows with 32 registers, 6 with 16)."""
    return 12 if target.vector_registers >= 32 else 6


def serves(plan: Plan) -> bool:
    """Whether the generic tier computes `plan` (a CPU plan with a kernel)."""
    return plan.target.kind is TargetKind.CPU and plan.kop in KOPS and plan.algorithm not in (None, "empty")


def layer_serves(plan: Plan) -> bool:
    """Whether a layer of `plan`'s problem gets a layer's kernel once dynamic: every problem the generic
    tier serves (on a GPU, codegen/gpu/generic.py's rule)."""
    return serves(plan)


def source(kop: KOp, dtype: DType, target: Target, layer: Plan | None = None) -> KernelSource:
    """The generic kernel of `kop` for `dtype` on the CPU `target`; given `layer` (a plan of the
    layer), that layer's kernel: the generic kernel with the layer's constants compiled in (Layer),
    serving every spatial size of the layer."""
    constants = Layer.of(layer) if layer is not None else None
    if constants is None:
        name = f"generic_{kop.value}_{dtype.value}_{target.isa}"
        what, key = f"every {kop.value} problem in {dtype.value}", "(sizes at run time)"
        why = "shape-generic: sizes, strides, padding, dilation and groups are run-time arguments"
    else:
        key = sha256_text(",".join(map(str, constants.words)))[:16]
        name = f"layer_{kop.value}_{dtype.value}_{target.isa}_{key[:10]}"
        what = f"every spatial size of one {kop.value} layer in {dtype.value} ({layer.problem.name()} and its sizes)"
        why = ("a layer's kernel: its groups, channels, taps, strides, padding, dilation and weight strides "
               "compile-time constants, spatial sizes and the activations' strides run-time arguments")
    entry = f"cg_{name}"
    lanes = max(1, target.vector_bytes // dtype.accumulator.itemsize)
    header = {"version": generator_version(), "problem_name": what, "problem_key": key, "target": target.name(),
              "kernel": kop.value, "algorithm": NAME, "entry": entry, "reasons": (("tier", why),)}
    context = GenericContext(entry=entry, kop=kop.value, dtype=dtype.value, storage=STORAGE[dtype],
                             acc=ACCUMULATOR[dtype], lanes=lanes, vector_bytes=lanes * dtype.accumulator.itemsize,
                             rows=tile_rows(target), layer=constants)
    return KernelSource(name=name, text=render(TEMPLATE, h=header, c=context), entry=entry, signature=SIGNATURE,
                        target=target)
