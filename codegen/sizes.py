"""The shape-generic tiers' size array (CPU and GPU alike): a plan's geometry and its operands' strides
as the one array of integers a generic kernel takes at run time, and a layer's constants read from it
(the words a layer's kernel compiles in). codegen/cpu/generic.py and codegen/gpu/generic.py render the
kernels that read it; runtime/dispatch/tiers.py makes it per problem.
"""

from __future__ import annotations

import dataclasses

from .plan import KOp, Plan
from .render import operand_strides

# the size array, in the order of the generic templates' `Geo` (templates/cpu/generic.cpp.j2, gpu/direct.cu.j2)
# and `Sizes` (gpu/igemm_generic.cu.j2) read it
SIZE_FIELDS = ("groups", "cin_g", "cout_g", "x_size[3]", "y_size[3]", "kernel[3]", "stride[3]", "pad_lo[3]",
               "dilation[3]", "X strides[5]", "Y strides[5]", "W strides[5]", "bias source strides[5]",
               "bias source (0 none, 1 Y, 2 X)")
SIZE_WORDS = 42
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
