"""The cost of one call (step 7 of bench.py's method): `convgen.conv2d` against
`torch.nn.functional.conv2d` on a tiny problem, with and without grad, on the CPU."""

from __future__ import annotations

import math
import time

import torch

from ..api import eager, functional


CALL_PROBLEM = {"input": (1, 4, 8, 8), "weight": (4, 4, 3, 3), "padding": 1}
CALL_ROUNDS, CALL_CALLS = 30, 200


def call_cost() -> dict:
    """µs per call of convgen.conv2d and torch's conv2d on CALL_PROBLEM, with grad and without
    (method: step 7 of this module's docstring)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(CALL_PROBLEM["input"], generator=gen)
    w = torch.randn(CALL_PROBLEM["weight"], generator=gen)
    b = torch.randn(CALL_PROBLEM["weight"][0], generator=gen)
    wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
    pad = CALL_PROBLEM["padding"]
    fns = {("grad", "convgen"): lambda: functional.conv2d(x, wg, bg, padding=pad),
           ("grad", "torch"): lambda: torch.nn.functional.conv2d(x, wg, bg, padding=pad),
           ("no_grad", "convgen"): lambda: functional.conv2d(x, w, b, padding=pad),
           ("no_grad", "torch"): lambda: torch.nn.functional.conv2d(x, w, b, padding=pad)}
    best = dict.fromkeys(fns, math.inf)
    for fn in fns.values():
        fn()   # builds the kernels (forward and backward) and remembers the call
    for _ in range(CALL_ROUNDS):
        for k, fn in fns.items():
            start = time.perf_counter()
            for _ in range(CALL_CALLS):
                fn()
            best[k] = min(best[k], (time.perf_counter() - start) / CALL_CALLS * 1e6)
    result = {"problem": {k: list(v) if isinstance(v, tuple) else v for k, v in CALL_PROBLEM.items()},
              "dtype": "f32", "path": eager.status(), "rounds": CALL_ROUNDS, "calls_per_round": CALL_CALLS}
    for mode in ("grad", "no_grad"):
        cg, th = best[(mode, "convgen")], best[(mode, "torch")]
        result[mode] = {"convgen_us": cg, "torch_us": th, "convgen_over_torch": cg / th}
    return result


def call_line(c: dict) -> str:
    return (f"call cost (conv2d, input {'x'.join(map(str, c['problem']['input']))}, weight "
            f"{'x'.join(map(str, c['problem']['weight']))}, f32; best of {c['rounds']} rounds, µs): with grad "
            f"convgen {c['grad']['convgen_us']:.1f}, torch {c['grad']['torch_us']:.1f} "
            f"({c['grad']['convgen_over_torch']:.2f}x torch's); without grad convgen {c['no_grad']['convgen_us']:.1f}, "
            f"torch {c['no_grad']['torch_us']:.1f} ({c['no_grad']['convgen_over_torch']:.2f}x torch's); eager calls "
            f"take {c['path']}")
