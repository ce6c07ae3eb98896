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
from ..keys import sha256_text
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
    layer: "Layer | None" = None   # a layer's kernel: its constants (None: every size at run time)
    g: None = None    # no compile-time geometry (templates/cpu/common.h.j2 leaves out its constants)
    t: None = None    # no plan tiling


# The words of the size array a layer's kernel has as compile-time constants: groups and channels,
# taps, strides, padding, dilation, the weight's strides and the bias source (not the spatial sizes
# nor the activations' strides, which change with them).
LAYER_WORDS = (0, 1, 2, *range(9, 21), *range(31, 36), 41)


@dataclasses.dataclass(frozen=True)
class Layer:
    """A layer's constants, read from one of its plans' size arrays (LAYER_WORDS)."""
    g: int
    cin_g: int
    cout_g: int
    k: tuple[int, ...]
    s: tuple[int, ...]
    p: tuple[int, ...]
    d: tuple[int, ...]
    ws: tuple[int, ...]
    bias_from: int
    words: tuple[int, ...]    # the constants in LAYER_WORDS order, and their places in the size array
    at: tuple[int, ...] = LAYER_WORDS

    @classmethod
    def of(cls, plan: Plan) -> "Layer":
        w = sizes(plan)
        return cls(g=w[0], cin_g=w[1], cout_g=w[2], k=w[9:12], s=w[12:15], p=w[15:18], d=w[18:21], ws=w[31:36],
                   bias_from=w[41], words=tuple(w[i] for i in LAYER_WORDS))


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


def sizes(plan: Plan) -> tuple[int, ...]:
    """The generic kernel's size array for `plan` (SIZE_FIELDS): its geometry, the element strides of
    its operands in the caller's layouts (the generic kernel reads the caller's tensors, whatever
    internal layout the specialised kernel converts them to), and the bias gradient's source."""
    g, layouts = plan.geometry, plan.caller_layouts()
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
