"""convgen against torch on a default set of conv layers, forward and backward.

    python examples/demo.py

Each layer runs through convgen's drop-in functions and through torch.nn.functional, forward
and backward (autograd, gradients of input, weight and bias). The table shows the largest
relative error of any result, ‖convgen − torch‖ / ‖torch‖, and the time ratio torch/convgen
of each pass (above 1: convgen is faster), the median of a few alternating runs. It is a
sanity check, not a benchmark: `convgen bench` times one problem carefully.

Every kernel the demo needs is built first, in one parallel ninja run. Exits 1 if a result
is off by more than the float32 tolerance.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

import convgen
from convgen.dispatch import dispatch
from convgen.api import ops

TOLERANCE = 1e-5   # relative, float32
REPEAT = 5

# (what the layer stands for, function name in torch.nn.functional and convgen, input size,
#  weight size, keyword arguments) -- small-to-medium layers of common networks
LAYERS = [
    ("3x3 conv (ResNet stage 2)", "conv2d", (8, 32, 28, 28), (32, 32, 3, 3), dict(padding=1)),
    ("1x1 conv (bottleneck)", "conv2d", (8, 64, 28, 28), (32, 64, 1, 1), {}),
    ("3x3 stride-2 (downsample)", "conv2d", (8, 32, 28, 28), (64, 32, 3, 3), dict(stride=2, padding=1)),
    ("3x3 depthwise (MobileNet)", "conv2d", (8, 64, 28, 28), (64, 1, 3, 3), dict(padding=1, groups=64)),
    ("3x3 grouped (ResNeXt)", "conv2d", (8, 64, 14, 14), (64, 16, 3, 3), dict(padding=1, groups=4)),
    ("4x4 transposed (decoder)", "conv_transpose2d", (8, 32, 14, 14), (32, 16, 4, 4), dict(stride=2, padding=1)),
    ("1-D k5 (audio / sequence)", "conv1d", (8, 32, 256), (32, 32, 5), dict(padding=2)),
]


def aten_args(fn: str, kwargs: dict) -> tuple:
    """(stride, padding, dilation, transposed, output_padding, groups) of a functional call."""
    transposed = fn.startswith("conv_transpose")
    return (kwargs.get("stride", 1), kwargs.get("padding", 0), kwargs.get("dilation", 1), transposed,
            kwargs.get("output_padding", 0), kwargs.get("groups", 1))


def tensors(x_size, w_size, k, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(x_size, generator=gen, requires_grad=True)
    w = (torch.randn(w_size, generator=gen) / (w_size[1] * w_size[2]) ** 0.5).requires_grad_()
    b = torch.randn(k, generator=gen, requires_grad=True)
    return x, w, b


def run(fn, x, w, b, kwargs, gy):
    """One forward and backward; returns (results, forward seconds, backward seconds)."""
    for t in (x, w, b):
        t.grad = None
    start = time.perf_counter()
    y = fn(x, w, b, **kwargs)
    middle = time.perf_counter()
    y.backward(gy)
    end = time.perf_counter()
    return (y.detach(), x.grad, w.grad, b.grad), middle - start, end - middle


def rel_err(got, ref) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-300))


def main() -> int:
    cases = []
    for i, (what, fn, x_size, w_size, kwargs) in enumerate(LAYERS):
        k = w_size[1] * kwargs.get("groups", 1) if fn.startswith("conv_transpose") else w_size[0]
        cases.append((what, fn, kwargs, *tensors(x_size, w_size, k, seed=i)))

    print(f"convgen {convgen.__version__}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    start = time.perf_counter()
    problems = [p for _, fn, kwargs, x, w, b in cases for p in ops.call_problems(x, w, b, *aten_args(fn, kwargs))]
    dispatch.prepare(problems, policy="eager")
    print(f"prepared {len(problems)} kernels in {time.perf_counter() - start:.1f} s "
          f"({convgen.stats()['builds']} built, {convgen.stats()['disk_hits']} from the cache)\n")

    header = f"{'layer':<28}{'convgen kernel (forward)':<52}{'max rel err':>12}{'fwd t/c':>9}{'bwd t/c':>9}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    for what, fn, kwargs, x, w, b in cases:
        gy = torch.randn(getattr(F, fn)(x, w, b, **kwargs).shape, generator=torch.Generator().manual_seed(99))
        ours, theirs = getattr(convgen, fn), getattr(F, fn)
        got, _, _ = run(ours, x, w, b, kwargs, gy)   # warm-up (and the results we check)
        ref, _, _ = run(theirs, x, w, b, kwargs, gy)
        err = max(rel_err(g, r) for g, r in zip(got, ref))
        worst = max(worst, err)
        times = {"torch": ([], []), "convgen": ([], [])}
        for r in range(REPEAT):   # alternate, and alternate who goes first
            for name, f in ((("torch", theirs), ("convgen", ours)) if r % 2 == 0 else
                            (("convgen", ours), ("torch", theirs))):
                _, t_fwd, t_bwd = run(f, x, w, b, kwargs, gy)
                times[name][0].append(t_fwd)
                times[name][1].append(t_bwd)
        ratio = [statistics.median(times["torch"][i]) / statistics.median(times["convgen"][i]) for i in (0, 1)]
        kernel = dispatch.kernel_for(ops.call_problems(x, w, b, *aten_args(fn, kwargs))[0]).plan.name()
        print(f"{what:<28}{kernel:<52}{err:>12.1e}{ratio[0]:>9.2f}{ratio[1]:>9.2f}")

    print("\nt/c: median time of torch over that of convgen (above 1: convgen is faster);"
          f" median of {REPEAT} alternating runs")
    print("counters:", convgen.stats())
    if worst > TOLERANCE:
        print(f"MISMATCH: a result differs from torch by {worst:.1e} (relative), more than {TOLERANCE:.0e}")
        return 1
    print(f"all results match torch within {TOLERANCE:.0e} (relative)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
