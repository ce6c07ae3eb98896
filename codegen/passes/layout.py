"""Pass `layout`: the internal memory layout of each kernel operand (like ATen's memory-format choice).

The direct kernels address every operand through compile-time strides, so they read and write
either layout in place; converting a tensor costs a full pass over it, which these kernels
never win back. So each operand stays in the layout the caller holds it in, and no conversion
is added. (Faster variants that want one layout will weigh the conversion here.)
"""

from __future__ import annotations

from ..ir import Layout
from ..pipeline import Pass
from ..plan import Plan


def run(plan: Plan) -> Plan:
    if plan.algorithm == "empty":
        return plan.decide("layout", "no kernel: layouts are the caller's", layouts=())
    layouts: dict[str, Layout] = {}
    for operand in plan.operands:
        if operand.kind == "B":
            continue
        layouts.setdefault(operand.kind, operand.layout)
    described = ", ".join(f"{kind}={lay.value}" for kind, lay in sorted(layouts.items()))
    if plan.target.gpu is not None:
        return plan.decide("layout", f"operands in the caller's layouts ({described}): the GPU kernel addresses "
                                     f"each through its own compile-time strides, so no conversion kernel is launched",
                           layouts=tuple(sorted(layouts.items())), conversions=())
    return plan.decide("layout", f"operands in the caller's layouts ({described}): strided addressing "
                                 f"reads them in place, so no conversion is added",
                       layouts=tuple(sorted(layouts.items())), conversions=())


PASS = Pass("layout", run, requires=("algorithm",), provides=("layout",), doc=__doc__)
