"""A few training steps of a small CNN after `convgen.convert`, beside the same model in torch.

    python examples/train_small_cnn.py [--steps 5] [--batch 16]

The model (conv/BatchNorm/ReLU blocks, a stride-2 conv, a depthwise conv, global pooling and a
linear classifier) is copied; the copy is converted, so both start from the same weights. Both
train with SGD on the same fixed synthetic batch. Each step prints both losses, the largest
relative gradient difference over the parameters, ‖convgen − torch‖ / ‖torch‖, and the time of
each step. convgen's first step runs the shape-generic kernels (no compiler on its path; they
are built once per machine by `convgen setup`, or at the first call), the second has each
problem's own kernel built in the background, and the later steps take them as they are loaded. Exits 1 if the losses or the gradients disagree beyond float32 tolerance.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
from torch import nn

import convgen

LOSS_TOLERANCE = 1e-5   # relative
GRAD_TOLERANCE = 1e-4   # relative, per parameter (the two models drift apart a little each step)


def block(c_in: int, c_out: int, kernel: int = 3, stride: int = 1) -> list[nn.Module]:
    """conv (no bias: BatchNorm has one), BatchNorm, ReLU."""
    conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)
    return [conv, nn.BatchNorm2d(c_out), nn.ReLU()]


def small_cnn(classes: int = 10) -> nn.Sequential:
    """The depthwise conv has no BatchNorm after it: a per-channel chain BatchNorm, ReLU, depthwise
    conv, BatchNorm would make the first BatchNorm's scale irrelevant, its gradient nearly 0 and
    that gradient's relative difference meaningless (float32 rounding noise, in torch too)."""
    return nn.Sequential(
        *block(3, 16),
        *block(16, 32, stride=2),                     # downsampling
        nn.Conv2d(32, 32, 3, padding=1, groups=32),   # depthwise, with bias
        nn.ReLU(),
        *block(32, 64, kernel=1),                     # pointwise
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, classes),
    )


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, labels: torch.Tensor):
    """One SGD step: (loss, gradients, seconds)."""
    start = time.perf_counter()
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), labels)
    loss.backward()
    optimizer.step()
    seconds = time.perf_counter() - start
    return loss.item(), [p.grad.clone() for p in model.parameters()], seconds


def rel_diff(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-300))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    parser.add_argument("--batch", type=int, default=16, help="batch size (default 16)")
    parser.add_argument("--size", type=int, default=32, help="image height and width (default 32)")
    args = parser.parse_args()

    torch.manual_seed(0)
    reference = small_cnn()
    model = convgen.convert(copy.deepcopy(reference))
    x = torch.randn(args.batch, 3, args.size, args.size)
    labels = torch.randint(0, 10, (args.batch,))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (reference, model)]

    print(f"convgen {convgen.__version__}, torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"batch {args.batch}x3x{args.size}x{args.size}, {args.steps} SGD steps")
    print(f"{'step':>4}  {'torch loss':>10}  {'convgen loss':>12}  {'max grad diff':>13}  "
          f"{'torch ms':>8}  {'convgen ms':>10}")
    worst_loss = worst_grad = 0.0
    for i in range(args.steps):
        ref_loss, ref_grads, ref_s = step(reference, optimizers[0], x, labels)
        loss, grads, s = step(model, optimizers[1], x, labels)
        grad_diff = max(rel_diff(g, r) for g, r in zip(grads, ref_grads))
        worst_loss = max(worst_loss, abs(loss - ref_loss) / abs(ref_loss))
        worst_grad = max(worst_grad, grad_diff)
        note = "  (the shape-generic kernels)" if i == 0 else ""
        print(f"{i + 1:>4}  {ref_loss:>10.6f}  {loss:>12.6f}  {grad_diff:>13.1e}  "
              f"{ref_s * 1e3:>8.1f}  {s * 1e3:>10.1f}{note}")

    counters = convgen.stats()
    print(f"kernels: {counters['builds']} built, {counters['disk_hits']} from the disk cache")
    if worst_loss > LOSS_TOLERANCE or worst_grad > GRAD_TOLERANCE:
        print(f"FAIL: loss difference {worst_loss:.1e} (tolerance {LOSS_TOLERANCE:.0e}), "
              f"gradient difference {worst_grad:.1e} (tolerance {GRAD_TOLERANCE:.0e})", file=sys.stderr)
        return 1
    print(f"OK: losses within {worst_loss:.1e}, gradients within {worst_grad:.1e} (relative)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
