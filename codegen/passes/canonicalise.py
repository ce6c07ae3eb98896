"""Pass `canonicalise`: the user's pass as one kernel op on a normal convolution in 3-D form.

- transposed forward ≡ data gradient of the normal convolution, and vice versa;
- the weight gradient of a transposed convolution swaps the roles of input and grad_output;
- padding is already (low, high) pairs; the kernels need only the low side, the high side is
  implied by the sizes (this also covers output_padding and 'same');
- 1-D and 2-D problems become 3-D problems with leading axes of size 1.
"""

from __future__ import annotations

import dataclasses

from ..ir import Layout, Op
from . import Pass
from ..plan import Geometry, KOp, Operand, Plan


def _pad3(values, fill):
    values = tuple(values)
    return (fill,) * (3 - len(values)) + values


def run(plan: Plan) -> Plan:
    p = plan.problem
    if p.transposed:
        # the normal convolution whose data gradient this transposed convolution is
        x_size, y_size, cin, cout = p.out_size, p.in_size, p.k, p.c
        x_layout, y_layout = p.output_layout, p.input_layout
    else:
        x_size, y_size, cin, cout = p.in_size, p.out_size, p.c, p.k
        x_layout, y_layout = p.input_layout, p.output_layout
    geo = Geometry(
        groups=p.groups, cin_g=cin // p.groups, cout_g=cout // p.groups,
        x_size=_pad3(x_size, 1), y_size=_pad3(y_size, 1), kernel=_pad3(p.kernel, 1),
        stride=_pad3(p.stride, 1), pad_lo=_pad3([lo for lo, _ in p.padding], 0), dilation=_pad3(p.dilation, 1))
    w = Operand("weight", "W", p.weight_layout, writes=False)
    no_bias = Operand("no_bias", "B", Layout.CONTIGUOUS, writes=False, optional=True)  # always null
    bias_from = None
    # (user op, transposed) -> kernel op, operands in entry order, reason
    if p.op is Op.FWD and not p.transposed:
        kop, ops, why = KOp.FWD, (Operand("input", "X", x_layout, False), w,
                                  Operand("bias", "B", Layout.CONTIGUOUS, False, optional=True),
                                  Operand("output", "Y", y_layout, True)), "forward of a normal convolution"
    elif p.op is Op.FWD:
        kop, ops, why = KOp.DGRAD, (Operand("input", "Y", y_layout, False), w,
                                    Operand("bias", "B", Layout.CONTIGUOUS, False, optional=True),
                                    Operand("output", "X", x_layout, True)), \
            "transposed forward = data gradient of the normal convolution with input and output swapped"
    elif p.op is Op.BWD_DATA and not p.transposed:
        kop, ops, why = KOp.DGRAD, (Operand("grad_output", "Y", y_layout, False), w, no_bias,
                                    Operand("grad_input", "X", x_layout, True)), \
            "data gradient of a normal convolution (a transposed convolution of grad_output)"
    elif p.op is Op.BWD_DATA:
        kop, ops, why = KOp.FWD, (Operand("grad_output", "X", x_layout, False), w, no_bias,
                                  Operand("grad_input", "Y", y_layout, True)), \
            "data gradient of a transposed convolution = forward of the normal convolution on grad_output"
    elif p.op is Op.BWD_WEIGHT:
        y_role, x_role = ("input", "grad_output") if p.transposed else ("grad_output", "input")
        ops = (Operand(y_role, "Y", y_layout, False), Operand(x_role, "X", x_layout, False),
               Operand("grad_weight", "W", p.weight_layout, True))
        if p.bias:
            bias_from = "X" if p.transposed else "Y"
            ops += (Operand("grad_bias", "B", Layout.CONTIGUOUS, True),)
        kop = KOp.WGRAD
        why = ("weight gradient: reduction of " + ("input ⊗ grad_output" if p.transposed else "grad_output ⊗ input")
               + " over batch and pixels" + ("; bias gradient fused into the same pass over grad_output" if p.bias else ""))
    else:
        kop, ops, why = KOp.BIAS, (Operand("grad_output", "Y" if not p.transposed else "X",
                                           y_layout if not p.transposed else x_layout, False),
                                   Operand("grad_bias", "B", Layout.CONTIGUOUS, True)), \
            "bias gradient alone: per-channel sum of grad_output over batch and pixels"
    plan = plan.decide("canonicalise", why, kop=kop, geometry=geo, operands=ops, bias_from=bias_from)
    if geo.kernel == (1, 1, 1) and geo.stride == (1, 1, 1) and geo.pad_lo == (0, 0, 0) and geo.x_size == geo.y_size:
        # both layouts keep the spatial axes in (d, h, w) order with one element stride between
        # neighbours, so a pointwise problem may treat them as one long row
        pixels = geo.x_size[0] * geo.x_size[1] * geo.x_size[2]
        flat = dataclasses.replace(geo, x_size=(1, 1, pixels), y_size=(1, 1, pixels))
        return plan.decide("canonicalise", f"pointwise: the {p.rank}-D spatial axes flattened into one row of "
                                           f"{pixels} pixels", geometry=flat)
    if p.rank < 3:
        plan = plan.decide("canonicalise", f"{p.rank}-D problem computed as 3-D with leading axes of size 1")
    if any(lo != hi for lo, hi in p.padding) or any(p.output_padding):
        plan = plan.decide("canonicalise", f"padding {list(p.padding)} and output_padding {list(p.output_padding)} "
                                           f"reduce to low padding {list(geo.pad_lo)} and explicit sizes")
    return plan


PASS = Pass("canonicalise", run, requires=("valid",), provides=("canonical",), doc=__doc__)
