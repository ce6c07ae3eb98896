"""The cost of a tiny convolution call: torch alone, a convert()ed module, and torch's module inside
`convgen.enabled()` (one block around many calls, and a block entered and left for every call).

    python examples/enabled_overhead.py [--rounds 30 --calls 200]

torch alone is timed first in this fresh process, before anything is registered, then the
variants alternate in rounds of --calls calls, torch outside any block among them (after the
last block closes in a single-threaded process, convgen's kernels are withdrawn, so it should
cost what torch alone did), and torch outside while a second thread keeps them registered.
The best round of each is printed, in µs per call, with a weight and bias that require grad
(forward only: the autograd node is recorded, not run) and without.
Exits 1 when convgen's results differ from torch's beyond float32 tolerance or its counters show
that it did not serve the block's calls.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import threading
import time

import torch

import convgen
from convgen.api import serve_aten


def best_us(variants: dict, rounds: int, calls: int) -> dict:
    """µs per call of each variant (a function that makes `calls` calls and returns the seconds they
    took), best of `rounds` rounds."""
    best = dict.fromkeys(variants, math.inf)
    for _ in range(rounds):
        for name, run in variants.items():
            best[name] = min(best[name], run(calls) / calls * 1e6)
    return best


def timed(loop):
    def run(n):
        start = time.perf_counter()
        loop(n)
        return time.perf_counter() - start
    return run


def variants(module, converted, x) -> dict:
    @timed
    def torch_alone(n):
        for _ in range(n):
            module(x)

    @timed
    def convert(n):
        for _ in range(n):
            converted(x)

    @timed
    def one_block(n):
        with convgen.enabled():
            for _ in range(n):
                module(x)

    @timed
    def block_per_call(n):
        for _ in range(n):
            with convgen.enabled():
                module(x)

    def torch_registration_kept(n):
        # a second Python thread is alive when the block closes, so the registration stays
        # (runtime/api/serve_aten.py) and torch's calls outside take the hop to ATen's kernel
        release = threading.Event()
        other = threading.Thread(target=release.wait)
        other.start()
        try:
            with convgen.enabled():
                pass
            assert serve_aten.registered()
            return torch_alone(n)
        finally:
            release.set()
            other.join()
            with convgen.enabled():   # closed single-threaded: withdrawn again
                pass

    return {"torch": torch_alone, "convert()": convert, "enabled() around all": one_block,
            "enabled() per call": block_per_call, "torch, kept": torch_registration_kept}


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
    for m in (module, frozen):   # warm-up: the first calls of a process pay for page faults and the allocator
        best_us({"t": variants(m, None, x)["torch"]}, args.rounds, args.calls)
    torch_alone = {"grad": best_us({"t": variants(module, None, x)["torch"]}, args.rounds, args.calls)["t"],
                   "no_grad": best_us({"t": variants(frozen, None, x)["torch"]}, args.rounds, args.calls)["t"]}

    before = convgen.stats()["aten_forward"]
    with convgen.enabled():
        served = module(x)
    results = {"convert()": converted(x), "enabled()": served}
    if convgen.stats()["aten_forward"] - before != 1:
        print("FAIL: convgen did not serve the call inside enabled()")
        return 1
    bad = [name for name, y in results.items() if not torch.allclose(y, expected, rtol=1e-5, atol=1e-5)]
    if bad:
        print(f"FAIL: {', '.join(bad)} differ from torch")
        return 1
    rows = {"grad": best_us(variants(module, converted, x), args.rounds, args.calls),
            "no_grad": best_us(variants(frozen, converted_frozen, x), args.rounds, args.calls)}
    print(f"conv2d input 1x4x8x8, weight 4x4x3x3, padding 1, f32, {torch.get_num_threads()} thread(s), torch "
          f"{torch.__version__}; best of {args.rounds} rounds of {args.calls} calls, µs per call (forward; with grad: "
          f"the autograd node is recorded)")
    names = ["torch alone", *rows["grad"]]
    print(f"{'':8}" + "".join(f"{n:>21}" for n in names))
    for mode, row in rows.items():
        print(f"{mode:8}" + f"{torch_alone[mode]:21.1f}" + "".join(f"{row[n]:21.1f}" for n in row))
    print("(torch alone: before anything was registered; torch: outside any block, between the other variants; "
          "torch, kept: outside any block while convgen's registration is kept by a second thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
