"""Pass `layout`: the internal memory layout of each kernel operand (like ATen's memory-format choice).

The direct kernels address every operand through compile-time strides, so they read and write
either layout in place; converting a tensor costs a full pass over it, which these kernels
never win back. So each operand stays in the layout the caller holds it in, and no conversion
is added. The GPU implicit-GEMM kernel is the exception: its forward and data gradient copy their
operands 16 bytes at a time only from channels-last, so this pass weighs converting NCHW operands
(the cost of the transpose against the gathers it saves, codegen/gpu/staging.py) and records the
internal layout; the emitter launches the conversion into the entry's workspace.
"""

from __future__ import annotations

from ..gpu.staging import staging
from ..ir import Layout
from . import Pass
from ..plan import KOp, Plan


def run(plan: Plan) -> Plan:
    if plan.algorithm == "empty":
        return plan.decide("layout", "no kernel: layouts are the caller's", layouts=())
    layouts: dict[str, Layout] = {}
    for operand in plan.operands:
        if operand.kind == "B":
            continue
        layouts.setdefault(operand.kind, operand.layout)
    described = ", ".join(f"{kind}={lay.value}" for kind, lay in sorted(layouts.items()))
    if plan.target.gpu is not None and plan.algorithm == "igemm":
        staged = staging(plan.problem, plan.target)
        # the data gradient's weight copy has filters innermost, a layout of its own (its internal
        # layout stays the caller's name); every other staged operand is channels-last
        filters_last = plan.kop is KOp.DGRAD
        internal = {kind: Layout.CHANNELS_LAST if kind in staged.kinds and not (kind == "W" and filters_last) else lay
                    for kind, lay in layouts.items()}
        conversions = tuple(f"{kind}: {layouts[kind].value} -> "
                            f"{'filters innermost' if kind == 'W' and filters_last else 'channels_last'} "
                            f"(a transpose kernel into the workspace)" for kind in staged.kinds if kind in layouts)
        return plan.decide("layout", f"the caller holds {described} (the kernel reads any layout through "
                                     f"compile-time strides); {staged.reason}",
                           layouts=tuple(sorted(internal.items())), conversions=conversions, staged=staged.kinds)
    if plan.target.gpu is not None:
        return plan.decide("layout", f"operands in the caller's layouts ({described}): the GPU kernel addresses "
                                     f"each through its own compile-time strides, so no conversion kernel is launched",
                           layouts=tuple(sorted(layouts.items())), conversions=())
    return plan.decide("layout", f"operands in the caller's layouts ({described}): strided addressing "
                                 f"reads them in place, so no conversion is added",
                       layouts=tuple(sorted(layouts.items())), conversions=())


PASS = Pass("layout", run, requires=("algorithm",), provides=("layout",), doc=__doc__)
