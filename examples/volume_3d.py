"""A small 3-D U-Net after `convgen.convert`, forward and backward beside torch.

    python examples/volume_3d.py [--batch 2] [--size 24] [--width 8]

The model segments a volume (one input channel, two classes): two 3x3x3 convs, a stride-2
conv down, two convs at half resolution, a ConvTranspose3d back up, concatenation with the
skip connection, two convs and a 1x1x1 head. The model is copied and the copy converted, so
both start from the same weights; both run forward and backward (cross-entropy against fixed
labels) on the same volume. The output shows the relative difference ‖convgen − torch‖ /
‖torch‖ of the loss, the input gradient and (the largest) of the parameter gradients, and the
time of forward and backward: the first convgen call, which runs the shape-generic kernels (no
compiler on its path), then, once the second call has had each problem's own kernel built in the
background (`convgen.wait_builds()`), the median of a few more. Exits 1 if a result is off by more than
float32 tolerance.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
from torch import nn

import convgen

TOLERANCE = 1e-4   # relative, float32


def double_conv(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv3d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.Conv3d(c_out, c_out, 3, padding=1), nn.ReLU())


class UNet3d(nn.Module):
    def __init__(self, width: int = 8, classes: int = 2):
        super().__init__()
        self.encode = double_conv(1, width)
        self.down = nn.Sequential(nn.Conv3d(width, 2 * width, 3, stride=2, padding=1, bias=False), nn.ReLU())
        self.middle = double_conv(2 * width, 2 * width)
        self.up = nn.ConvTranspose3d(2 * width, width, 2, stride=2)
        self.decode = double_conv(2 * width, width)
        self.head = nn.Conv3d(width, classes, 1)

    def forward(self, volume):
        skip = self.encode(volume)
        x = self.up(self.middle(self.down(skip)))
        return self.head(self.decode(torch.cat([x, skip], dim=1)))


def forward_backward(model, volume, labels):
    """(loss, input and parameter gradients, forward seconds, backward seconds)."""
    volume = volume.detach().requires_grad_()
    model.zero_grad()
    start = time.perf_counter()
    loss = nn.functional.cross_entropy(model(volume), labels)
    middle = time.perf_counter()
    loss.backward()
    end = time.perf_counter()
    grads = {"volume": volume.grad}
    grads.update((name, p.grad) for name, p in model.named_parameters())
    return loss.detach(), grads, middle - start, end - middle


def rel_diff(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-300))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2, help="batch size (default 2)")
    parser.add_argument("--size", type=int, default=24, help="volume depth, height and width, even (default 24)")
    parser.add_argument("--width", type=int, default=8, help="channels of the first level (default 8)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs after the first (default 3)")
    args = parser.parse_args()
    if args.size % 2:
        parser.error("--size must be even (the U-Net halves it and doubles it back)")

    torch.manual_seed(0)
    reference = UNet3d(args.width)
    model = convgen.convert(copy.deepcopy(reference))
    volume = torch.randn(args.batch, 1, args.size, args.size, args.size)
    labels = torch.randint(0, 2, (args.batch, args.size, args.size, args.size))

    print(f"convgen {convgen.__version__}, torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"3-D U-Net, width {args.width}, batch {args.batch} x 1 x {args.size}^3")

    first = forward_backward(model, volume, labels)
    counters = convgen.stats()
    print(f"first convgen forward + backward: {(first[2] + first[3]) * 1e3:.0f} ms "
          f"({counters['generic_calls']} calls of the shape-generic kernels, {counters['builds']} kernels built)")
    forward_backward(model, volume, labels)   # called again, each problem's own kernel builds in the background
    start = time.perf_counter()
    convgen.wait_builds()   # the timings below are the specialised kernels'
    counters = convgen.stats()
    print(f"second call: {counters['background_builds']} specialised kernels built or loaded in the background "
          f"(waited {time.perf_counter() - start:.1f} s more for them)")

    times = {"torch": ([], []), "convgen": ([], [])}
    for _ in range(args.repeat):   # alternate, so both see the same machine load
        for name, m in (("torch", reference), ("convgen", model)):
            *_, fwd_s, bwd_s = forward_backward(m, volume, labels)
            times[name][0].append(fwd_s)
            times[name][1].append(bwd_s)
    print(f"\n{'median ms':<10} {'torch':>8} {'convgen':>8}")
    for i, pass_name in enumerate(("forward", "backward")):
        print(f"{pass_name:<10} {statistics.median(times['torch'][i]) * 1e3:>8.1f} "
              f"{statistics.median(times['convgen'][i]) * 1e3:>8.1f}")

    loss_ref, grads_ref, *_ = forward_backward(reference, volume, labels)
    loss, grads, *_ = forward_backward(model, volume, labels)
    diffs = {"loss": rel_diff(loss, loss_ref)}
    diffs.update((f"grad of {name}", rel_diff(grads[name], grads_ref[name])) for name in grads)
    params = [name for name in diffs if name.startswith("grad of") and name != "grad of volume"]
    worst = max(params, key=diffs.get)
    rows = [(name, diffs[name]) for name in ("loss", "grad of volume")]
    rows.append((f"{worst} (the worst of {len(params)} parameters)", diffs[worst]))
    width = max(len(label) for label, _ in rows)
    print("\nrelative difference, convgen against torch")
    for label, d in rows:
        print(f"  {label:<{width}}  {d:.1e}")

    if max(diffs.values()) > TOLERANCE:
        bad = ", ".join(f"{name} {d:.1e}" for name, d in diffs.items() if d > TOLERANCE)
        print(f"FAIL: beyond the tolerance {TOLERANCE:.0e}: {bad}", file=sys.stderr)
        return 1
    print(f"OK: every result within {max(diffs.values()):.1e} of torch's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
