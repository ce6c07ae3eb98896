"""Pass `validate`: the shape and parameter rules (codegen/ir/rules.py) — nothing past it sees a bad problem."""

from . import Pass
from ..plan import Plan


def run(plan: Plan) -> Plan:
    plan.problem.validate()
    return plan.decide("validate", f"valid {plan.problem.rank}-D problem: output size "
                                   f"{list(plan.problem.out_size)}, {plan.problem.with_batch(1).macs} multiply-adds per image")


PASS = Pass("validate", run, requires=(), provides=("valid",), doc=__doc__)
