"""Training on a new input size every step (multi-scale images, variable-length audio), from an
empty kernel cache, with every convolution served by convgen inside `convgen.enabled()`.

    python examples/variable_sizes.py [--steps 30] [--batch 8] [--min 32] [--max 96] [--jit background]

The model has a strided stem, a grouped conv, a depthwise conv, a 1x1 conv, a transposed conv and
a 1-D conv head. Each step draws a new height and width; torch and convgen train copies of the
same model on the same batch, alternating, and the step times are printed side by side. A new
shape costs no compiler call (DESIGN.md "Kernel tiers"): it runs the shape-generic kernels at once;
the specialised kernels of problems that come back are built in the background, and a layer seen
at more than two sizes stays on the generic kernels. Exits 1 if the losses disagree.

The kernel cache is a fresh temporary directory unless --cache names one (or CONVGEN_CACHE_DIR is
set and --cache is "env"). The shape-generic kernels are not in it: `convgen setup` built them in
their own directory (CONVGEN_GENERIC_DIR), once per machine; without it, the first step builds them.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time

import torch
from torch import nn

LOSS_TOLERANCE = 1e-4   # relative, per step (the copies drift apart a little each step)


class Net(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 24, 5, stride=2, padding=2), nn.ReLU(),                  # stem
            nn.Conv2d(24, 48, 3, padding=1, groups=3), nn.ReLU(),                 # grouped
            nn.Conv2d(48, 48, 3, padding=1, groups=48), nn.ReLU(),                # depthwise
            nn.Conv2d(48, 64, 1), nn.ReLU(),                                      # pointwise
            nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1), nn.ReLU(),        # transposed
        )
        self.head = nn.Conv1d(32, classes, 3, padding=1)                          # 1-D head over width

    def forward(self, x):
        features = self.features(x).mean(dim=2)          # (N, 32, W)
        return self.head(features).mean(dim=2)           # (N, classes)


def step(model, optimizer, x, labels):
    start = time.perf_counter()
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), labels)
    loss.backward()
    optimizer.step()
    return loss.item(), time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--min", type=int, default=32, help="smallest height/width (default 32)")
    parser.add_argument("--max", type=int, default=96, help="largest height/width (default 96)")
    parser.add_argument("--jit", default="background", choices=("background", "eager", "generic"),
                        help="CONVGEN_JIT for convgen's calls (default background)")
    parser.add_argument("--cache", default="", help="kernel cache directory ('env': CONVGEN_CACHE_DIR; "
                                                    "default: a fresh temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="convgen-cache-") as fresh:
        if args.cache != "env":
            os.environ["CONVGEN_CACHE_DIR"] = args.cache or fresh
        os.environ["CONVGEN_JIT"] = args.jit
        try:
            return run(args)
        finally:   # the background builder builds into the cache about to be removed: let it finish first
            import convgen
            convgen.wait_builds(drop_queued=True)


def run(args) -> int:
    import convgen   # after CONVGEN_CACHE_DIR is set

    torch.manual_seed(0)
    reference = Net()
    model = copy.deepcopy(reference)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (reference, model)]
    sizes = torch.randint(args.min, args.max + 1, (args.steps, 2)).tolist()
    print(f"convgen {convgen.__version__}, torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"{args.steps} steps of batch {args.batch}, sizes {args.min}..{args.max}, "
          f"CONVGEN_JIT={args.jit}")
    print(f"{'step':>4}  {'size':>7}  {'torch ms':>9}  {'convgen ms':>10}")
    totals, slowest, worst = [0.0, 0.0], [0.0, 0.0], 0.0
    for i, (h, w) in enumerate(sizes):
        x = torch.randn(args.batch, 3, h, w)
        labels = torch.randint(0, 10, (args.batch,))
        ref_loss, ref_s = step(reference, optimizers[0], x, labels)
        with convgen.enabled():
            loss, s = step(model, optimizers[1], x, labels)
        worst = max(worst, abs(loss - ref_loss) / abs(ref_loss))
        for j, t in enumerate((ref_s, s)):
            totals[j] += t
            slowest[j] = max(slowest[j], t)
        print(f"{i + 1:>4}  {h:>3}x{w:<3}  {ref_s * 1e3:>9.1f}  {s * 1e3:>10.1f}")
    counters = convgen.stats()
    print(f"total: torch {totals[0]:.2f} s, convgen {totals[1]:.2f} s ({totals[1] / totals[0]:.2f}x torch); "
          f"slowest step: torch {slowest[0] * 1e3:.0f} ms, convgen {slowest[1] * 1e3:.0f} ms")
    print("counters: " + ", ".join(f"{k} {counters[k]}" for k in ("builds", "disk_hits", "generic_calls",
                                                                   "layer_calls", "background_builds", "swaps")))
    if worst > LOSS_TOLERANCE:
        print(f"FAIL: losses differ by {worst:.1e} (relative; tolerance {LOSS_TOLERANCE:.0e})", file=sys.stderr)
        return 1
    print(f"OK: losses within {worst:.1e} (relative)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
