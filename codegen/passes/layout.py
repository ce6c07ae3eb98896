"""Pass `layout`: the internal memory layout of each kernel operand (like ATen's memory-format choice).

CPU: the direct kernels address every operand through compile-time strides, so they read and write
either layout in place, and the families that vectorise along an axis that is not the contiguous
one pack or copy what they read. This pass weighs, per internal layout of the activations (the
caller's, NCHW, channels last), the kernel the heuristic picks there plus converting the caller's
operands into it and the result back (codegen/cpu/layout_cost.py), and takes the cheapest; a
conversion is done by the kernel's entry itself, in its own scratch (templates/cpu/convert_layouts.j2),
so every caller (dispatch, AOT bundles, the eager launcher) passes its tensors as they are. Weights
stay in the caller's layout; outputs are returned in it. `lower(..., layout=)` forces an internal
layout (tests, the tuner).

GPU: the implicit-GEMM kernel's forward and data gradient copy their operands 16 bytes at a time
only from channels-last, so this pass weighs converting NCHW operands (the cost of the transpose
against the gathers it saves, codegen/gpu/staging.py) and records the internal layout; the emitter
launches the conversion into the entry's workspace. The GPU's other kernels read the caller's layouts.
"""

from __future__ import annotations

from ..cpu import layout_cost
from ..errors import ConvgenError
from ..gpu.normal import Normal
from ..gpu.padding import padding_words
from ..gpu.staging import staging
from ..ir import Layout
from . import Pass
from ..plan import KOp, Plan
from .algorithm import choose_for


def run(plan: Plan) -> Plan:
    if plan.algorithm == "empty":
        return plan.decide("layout", "no kernel: layouts are the caller's", layouts=())
    layouts = plan.caller_layouts()
    described = ", ".join(f"{kind}={lay.value}" for kind, lay in sorted(layouts.items()))
    if plan.target.gpu is not None and plan.algorithm == "igemm":
        staged = staging(plan.problem, plan.target)
        # the data gradient's weight copy has filters innermost, a layout of its own (its internal
        # layout stays the caller's name); every other staged operand is channels-last
        filters_last = plan.kop is KOp.DGRAD
        internal = {kind: Layout.CHANNELS_LAST if kind in staged.kinds and not (kind == "W" and filters_last) else lay
                    for kind, lay in layouts.items()}
        # (the forward's input and weight copies padded with zero channels to whole 16-byte copies: padding.py)
        pad = padding_words(Normal.of(plan.problem), staged.kinds, plan.problem.dtype.itemsize)
        conversions = tuple(f"{kind}: {layouts[kind].value} -> "
                            f"{'filters innermost' if kind == 'W' and filters_last else 'channels_last' + pad} "
                            f"(a {'transpose' if layouts[kind] is not Layout.CHANNELS_LAST else 'padding'} kernel into "
                            f"the workspace)" for kind in staged.kinds if kind in layouts)
        return plan.decide("layout", f"the caller holds {described} (the kernel reads any layout through "
                                     f"compile-time strides); {staged.reason}",
                           layouts=tuple(sorted(internal.items())), conversions=conversions, staged=staged.kinds)
    if plan.target.gpu is not None:
        return plan.decide("layout", f"operands in the caller's layouts ({described}): the GPU kernel addresses "
                                     f"each through its own compile-time strides, so no conversion kernel is launched",
                           layouts=tuple(sorted(layouts.items())), conversions=())
    return _cpu(plan, layouts, described)


def _cpu(plan: Plan, caller: dict[str, Layout], described: str) -> Plan:
    """The CPU's choice among internal layouts by the cost model (or the one requested); `caller`: the
    caller's layout of each operand kind."""
    if plan.kop is KOp.BIAS or plan.problem.rank < 2:
        return plan.decide("layout", f"operands in the caller's layouts ({described}): "
                                     f"{'a reduction' if plan.kop is KOp.BIAS else 'one layout in 1-D'} reads them "
                                     f"in place", layouts=tuple(sorted(caller.items())), conversions=())
    requested = plan.requested_algorithm
    found = layout_cost.options(plan, choose_for, prune=requested is None and plan.requested_layout is None)
    if plan.requested_layout is not None:
        wanted = {k: (plan.requested_layout if k in ("X", "Y") else v) for k, v in caller.items()}
        best = next(o for o in found if dict(o.layouts) == wanted)
        how = f"requested {plan.requested_layout.value}"
    elif requested is not None:
        best = layout_cost.for_algorithm(found, requested, requested in plan.candidates)
        if best is None:
            raise ConvgenError(f"algorithm {requested!r} is not a candidate for a {plan.kop.value} kernel in any "
                               f"layout; candidates: {sorted({a for o in found for a in o.candidates})}")
        how = f"the layout requested {requested} runs in"
    else:
        best = layout_cost.cheapest(found)
        how = (f"the cheapest estimate by at least {1 - layout_cost.CONVERT_GAIN:.0%}" if best is not found[0] else
               f"no conversion estimated to save {1 - layout_cost.CONVERT_GAIN:.0%}")
    figures = "; ".join(o.describe() for o in found)
    if best is found[0]:
        return plan.decide("layout", f"operands in the caller's layouts ({described}), read in place ({how}; "
                                     f"estimates: {figures})",
                           layouts=best.layouts, conversions=(), layout_options=tuple(found))
    conversions = tuple(f"{kind}: {caller[kind].value} -> {dict(best.layouts)[kind].value} (in the kernel's "
                        f"scratch{', converted back' if _written(plan, kind) else ''})" for kind in best.converted)
    algorithm, why, candidates = (requested, "requested", best.candidates) if requested is not None else \
        (best.algorithm, best.why, best.candidates)
    if algorithm not in candidates:
        raise ConvgenError(f"algorithm {algorithm!r} is not a candidate for a {plan.kop.value} kernel reading "
                           f"{', '.join(f'{k}={v.value}' for k, v in best.layouts)}; candidates: {list(candidates)}")
    return plan.decide("layout", f"the caller holds {described}; the kernel reads "
                                 f"{', '.join(f'{k}={v.value}' for k, v in best.layouts if k != 'W')} ({how}; "
                                 f"estimates: {figures}); there: {algorithm} ({why})",
                       layouts=best.layouts, conversions=conversions, algorithm=algorithm, candidates=candidates,
                       layout_options=tuple(found))


def _written(plan: Plan, kind: str) -> bool:
    return any(op.writes for op in plan.operands if op.kind == kind)


PASS = Pass("layout", run, requires=("algorithm",), provides=("layout",), doc=__doc__)
