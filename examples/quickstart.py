"""convgen in five minutes: a drop-in conv2d, its gradients, and what convgen generated and why.

    python examples/quickstart.py

1. convgen.conv2d against torch.nn.functional.conv2d, forward and backward (autograd);
2. a whole model: torch's own model inside `with convgen.enabled():`, and convgen.convert(model),
   which swaps its conv layers for convgen's;
3. the plan behind the kernel (what `convgen explain` prints) and the first lines of its source
   (what `convgen show` prints).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import convgen
from convgen.dispatch import dispatch
from convgen.api import ops
from convgen.codegen.emit import emit
from convgen.codegen.pipeline import lower
from convgen.codegen.target import host_cpu
from convgen.dispatch.problem import base_problem


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 16, 32, 32, requires_grad=True)
    w = torch.randn(32, 16, 3, 3, requires_grad=True)
    b = torch.randn(32, requires_grad=True)
    args = dict(stride=1, padding=1, dilation=1, groups=1)

    # Build every kernel this example needs (forward, data, weight and bias gradients) in one
    # ninja run. Optional: the first call would build what it needs by itself.
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 1))
    problems = ops.call_problems(x, w, b, 1, 1, 1, False, 0, 1)
    problems += ops.call_problems(x, model[0].weight, model[0].bias, 1, 1, 1, False, 0, 1,
                                  output_mask=(False, False, False))
    problems += ops.call_problems(torch.empty(4, 8, 32, 32), model[2].weight, model[2].bias, 1, 0, 1, False, 0, 1,
                                  output_mask=(False, False, False))
    dispatch.prepare(problems, policy="eager")

    # 1. drop-in: same call, same result, same gradients
    y = convgen.conv2d(x, w, b, **args)
    y_ref = F.conv2d(x, w, b, **args)
    gy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), gy)
    grads_ref = torch.autograd.grad(y_ref, (x, w, b), gy)
    print("convgen.conv2d vs torch: max |difference|, and that over max |torch|")
    for name, got, ref in zip(("output", "grad_input", "grad_weight", "grad_bias"), (y, *grads), (y_ref, *grads_ref)):
        diff = (got - ref).abs().max().item()
        print(f"  {name:<11} {diff:.2e}  ({diff / ref.abs().max().item():.1e})")

    # 2. a whole model: inside convgen.enabled() torch's own modules run on convgen's kernels;
    #    convert swaps torch's conv modules for convgen's, weights untouched
    with torch.no_grad():
        before = model(x)
        served = convgen.stats()["aten_forward"]
        with convgen.enabled():
            inside = model(x)
        served = convgen.stats()["aten_forward"] - served
        convgen.convert(model)
        after = model(x)
    print(f"\nwith convgen.enabled(): {served} convolutions served by convgen, "
          f"max |difference| {(inside - before).abs().max().item():.2e}")
    print(f"convert(model): {type(model[0]).__module__}.{type(model[0]).__name__}, "
          f"max |difference| {(after - before).abs().max().item():.2e}")

    # 3. what was generated, and why: the problem, the plan's reasons, the source
    problem = base_problem(x, w, b, 1, 1, 1, False, 0, 1)
    plan = lower(problem, host_cpu())
    print(f"\nproblem {problem.name()} -- each pass's decisions (convgen explain):")
    for pass_name, reason in plan.reasons:
        print(f"  [{pass_name}] {reason}")
    source = emit(plan)
    print(f"\nthe first lines of {source.name}.cpp (convgen show --input 4,16,32,32 --weight 32,16,3,3 "
          f"--padding 1 --bias):")
    for line in source.text.splitlines()[:14]:
        print("  " + line)
    print("\ncounters:", convgen.stats())


if __name__ == "__main__":
    main()
