"""What the GPU plans of a call launch, for tests that count simulated launches (so that a silent
fallback, or the wrong GPU algorithm, cannot pass): the algorithm the `algorithm` pass chooses for
a problem on a simulated vendor, and the kernel launches its plan entry makes; and where a fused
weight gradient's workspace keeps its bias partials."""

from __future__ import annotations

import torch

from convgen.codegen.gpu.normal import Normal
from convgen.codegen.ir import ConvProblem
from convgen.codegen.pipeline import lower
from convgen.codegen.plan import KOp
from convgen.codegen.target import parse_target
from convgen.api.ops import call_problems


def algorithm_of(problem: ConvProblem, vendor: str) -> str:
    return lower(problem, parse_target(vendor)).algorithm


def launches_of(problem: ConvProblem, vendor: str) -> int:
    """Launches of one non-empty problem's plan entry: direct launches one kernel per pass; igemm and
    depthwise one per stride phase for a data gradient; igemm, depthwise and stem two (partials,
    ordered sum) for a weight gradient, its bias gradient fused into them (no launch of its own);
    and one before them where the layout pass converts operands to channels-last (igemm's staging:
    one launch converts them all)."""
    plan = lower(problem, parse_target(vendor))
    if plan.algorithm == "empty":
        return 0
    conversions = 1 if plan.conversions else 0
    if plan.kop is KOp.DGRAD:   # igemm and depthwise: a launch per stride phase
        return conversions + (len(Normal.of(problem).phases()) if plan.algorithm in ("igemm", "depthwise") else 1)
    if plan.kop is KOp.WGRAD:   # igemm, depthwise, stem: split-K partials, then their ordered sum
        return conversions + (1 if plan.algorithm == "direct" else 2)
    return conversions + 1


def call_launches(ops, case, vendor: str, masks) -> tuple[int, set[str]]:
    """Launches of a case's forward and its backward over `masks` (as tests/support/cases.py's
    check_case makes them), and the GPU algorithms chosen for them."""
    total, algorithms = 0, set()
    for i, mask in enumerate(masks):
        problems = call_problems(ops.x, ops.w, ops.b, *case.args(), output_mask=mask, grad_output=ops.gy)
        for p in problems[(0 if i == 0 else 1):]:   # the forward once
            total += launches_of(p, vendor)
            algorithms.add(algorithm_of(p, vendor))
    return total, algorithms


def bias_partials_at(weight_partial_bytes: int) -> int:
    """The byte where a fused weight gradient's bias partials start in its workspace: after the
    weights' partials (`weight_partial_bytes` of them), from an 8-byte boundary (they are doubles:
    the GPU kernels sum bias gradients in double)."""
    return -(-weight_partial_bytes // 8) * 8


def bias_partials(workspace: torch.Tensor, weight_partial_bytes: int, split: int, k: int) -> torch.Tensor:
    """The (split, k) float64 bias partials of a fused weight gradient's workspace (any dtype's view)."""
    at = bias_partials_at(weight_partial_bytes)
    return workspace.view(torch.uint8)[at:at + split * k * 8].view(torch.float64).view(split, k)
