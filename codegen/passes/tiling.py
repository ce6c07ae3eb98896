"""Pass `tiling`: tile and block sizes from the target description, by target family.

- CPU targets: the plan's kernel family decides (codegen/cpu/, looked up in cpu/families.py):
  register tiles, cache blocking and the OpenMP loop's work items.
- GPU targets (tiling_gpu.py): threads per block and what each thread computes.
A function of problem and target only.
"""

from __future__ import annotations

from ..cpu.families import find
from ..errors import ConvgenError
from ..plan import Plan
from ..target import TargetKind
from . import Pass
from .tiling_gpu import run_gpu


def run_cpu(plan: Plan) -> Plan:
    """The tiling of `plan` for a CPU target: its family's tile choice."""
    if plan.algorithm == "empty":
        return plan.decide("tiling", "no tiling", tiling=None)
    family = find(plan.kop, plan.algorithm)
    if family is None:
        raise ConvgenError(f"tiling: no CPU kernel family computes kernel op {plan.kop.value} with algorithm "
                           f"{plan.algorithm}")
    return family.tile(plan)


def run(plan: Plan) -> Plan:
    return run_cpu(plan) if plan.target.kind is TargetKind.CPU else run_gpu(plan)


PASS = Pass("tiling", run, requires=("layout", "groups"), provides=("tiling",), doc=__doc__)
