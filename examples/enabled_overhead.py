"""The cost of a tiny convolution call three ways: torch alone, a convert()ed module, and torch's
module inside `convgen.enabled()` (plus torch's module outside the block once enabled() has
registered its kernels: the price every later torch call pays for the registration).

    python examples/enabled_overhead.py [--rounds 30 --calls 200]

torch alone is timed first, in this fresh process, before anything is registered; the other
three then alternate in rounds of --calls calls. The best round of each is printed, in µs per
call, with a weight and bias that require grad (forward only: the autograd node is recorded,
not run) and without. Exits 1 when convgen's results differ from torch's beyond float32
tolerance or its counters show it did not serve the block's calls.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time

import torch

import convgen


def best_us(fns: dict, rounds: int, calls: int) -> dict:
    best = dict.fromkeys(fns, math.inf)
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(1, 4, 8, 8)
    module = torch.nn.Conv2d(4, 4, 3, padding=1)
    frozen = copy.deepcopy(module).requires_grad_(False)
    converted = convgen.convert(copy.deepcopy(module))
    converted_frozen = convgen.convert(copy.deepcopy(frozen))

    with torch.no_grad():
        expected = module(x)
    torch_alone = {"grad": best_us({"t": lambda: module(x)}, args.rounds, args.calls)["t"],
                   "no_grad": best_us({"t": lambda: frozen(x)}, args.rounds, args.calls)["t"]}

    def inside(m):
        def run():
            with convgen.enabled():
                return m(x)
        return run

    served_before = convgen.stats()["aten_forward"]
    results = {"converted": converted(x), "enabled": inside(module)()}
    if convgen.stats()["aten_forward"] - served_before != 1:
        print("FAIL: convgen did not serve the call inside enabled()")
        return 1
    bad = [name for name, y in results.items() if not torch.allclose(y, expected, rtol=1e-5, atol=1e-5)]
    if bad:
        print(f"FAIL: {', '.join(bad)} differ from torch")
        return 1
    # warm both paths (kernels built, calls remembered), then time
    for fn in (converted_frozen, inside(frozen)):
        fn(x) if isinstance(fn, torch.nn.Module) else fn()
    grad = best_us({"convert": lambda: converted(x), "enabled": inside(module), "torch": lambda: module(x)},
                   args.rounds, args.calls)
    no_grad = best_us({"convert": lambda: converted_frozen(x), "enabled": inside(frozen),
                       "torch": lambda: frozen(x)}, args.rounds, args.calls)
    print(f"conv2d input 1x4x8x8, weight 4x4x3x3, padding 1, f32, {torch.get_num_threads()} thread(s); best of "
          f"{args.rounds} rounds of {args.calls} calls, µs per call (forward; with grad = autograd node recorded)")
    print(f"{'':10} {'torch alone':>12} {'convert()':>10} {'enabled()':>10} {'torch after':>12}")
    for mode, row in (("grad", grad), ("no_grad", no_grad)):
        print(f"{mode:10} {torch_alone[mode]:12.1f} {row['convert']:10.1f} {row['enabled']:10.1f} {row['torch']:12.1f}")
    print("(enabled() includes entering and leaving the block on every call; torch after = torch's module outside "
          "the block once enabled() has registered its kernels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
