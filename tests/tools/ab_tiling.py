"""Two tilings of the same CPU kernels, alternating: what one tiling field is worth, kernel alone.

    python tests/tools/ab_tiling.py --field x_inner=true [--isa avx2] [--suites standard,more]
    python tests/tools/ab_tiling.py --field layout=channels_last --op bwd_data --dtype bf16
                                    [--dtype f32] [--layout nchw] [--op fwd] [--shapes a,b] [--samples 11]

Every shape of the suites (not transposed) is lowered for the CPU code shape `--isa` with the
heuristic's choices (plan A); where `--field` names a Tiling field that the kernel's plan has at
another value, plan B is A with that field set (`--field algorithm=NAME`: the problem lowered on
that algorithm, where it is another; `--field layout=nchw|channels_last`: lowered with the activations
read in that internal layout, converted in the kernel's scratch, where the layout pass chose another). Both kernels are built, run once each on the same
operands (their results must agree), then timed alternately (A B, B A, ...; each sample repeated to
at least 50 ms) on 2 threads. Prints the medians and B / A per shape. Not a test: the figures go to
BENCHMARKS.md with the host class.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from convgen.bench.bench import layout_for   # noqa: E402
from convgen.bench.suites import select   # noqa: E402
from convgen.codegen.ir import DType, Layout, Op   # noqa: E402
from convgen.codegen.pipeline import lower   # noqa: E402
from convgen.codegen.target import cpu_target, parse_target   # noqa: E402
from convgen.dispatch.problem import TORCH_DTYPES, memory_format   # noqa: E402
from support.builds import load_keyed   # noqa: E402
from support.problems import conv_problem   # noqa: E402

OPS = {"fwd": Op.FWD, "bwd_data": Op.BWD_DATA, "bwd_weight": Op.BWD_WEIGHT}
LAYOUTS = {"nchw": Layout.CONTIGUOUS, "channels_last": Layout.CHANNELS_LAST}


def _value(text: str):
    return {"true": True, "false": False}.get(text.lower(), int(text) if text.lstrip("-").isdigit() else text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--field", required=True, help="NAME=VALUE of a Tiling field (plan B; several joined by '+'), "
                                                   "or algorithm=NAME, or layout=nchw|channels_last")
    ap.add_argument("--isa", default="avx512", help="a CPU code shape (avx512, avx2, ...), or host: this CPU's "
                                                     "target with its bf16 dot products and AMX tiles")
    ap.add_argument("--suites", default="standard,more")
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--layout", default="nchw", choices=sorted(LAYOUTS))
    ap.add_argument("--op", default="fwd", choices=sorted(OPS))
    ap.add_argument("--shapes", default="")
    ap.add_argument("--samples", type=int, default=11)
    a = ap.parse_args(argv)
    name, text = a.field.split("=", 1)
    value, dtype = _value(text), DType(a.dtype)
    # Tiling fields: NAME=VALUE, several joined by "+" (kb=12+nv=2)
    fields = {f: _value(v) for f, v in (pair.split("=", 1) for pair in a.field.split("+"))}
    target = parse_target("cpu") if a.isa == "host" else cpu_target(a.isa)
    only = set(filter(None, a.shapes.split(",")))
    torch.set_num_threads(2)
    keyed = []
    for suite in a.suites.split(","):
        for _, shapes in select(suite):
            for s in shapes:
                if s.transposed or (only and s.name not in only):
                    continue
                stride, pad, dil, _, _, groups = s.conv_args()
                problem = conv_problem(s.input[0], s.input[1], s.weight[0], tuple(s.input[2:]), tuple(s.weight[2:]),
                                       stride=stride, pad=pad, dil=dil, groups=groups, dtype=dtype,
                                       layout=layout_for(s, LAYOUTS[a.layout]), op=OPS[a.op], bias=a.op == "fwd")
                plan = lower(problem, target)
                if name == "algorithm":   # plan B: the problem lowered on another algorithm
                    if plan.algorithm == value:
                        continue
                    try:
                        other = lower(problem, target, algorithm=value)
                    except Exception as e:   # (not a candidate for this problem)
                        print(f"{s.name:24s} {value}: {type(e).__name__}: {e}")
                        continue
                elif name == "layout":   # plan B: the activations read in another internal layout
                    other = lower(problem, target, layout=LAYOUTS[value])
                    if dict(other.layouts) == dict(plan.layouts):
                        continue
                elif plan.tiling is None or not all(hasattr(plan.tiling, f) for f in fields) or \
                        all(getattr(plan.tiling, f) == v for f, v in fields.items()):
                    continue
                else:
                    other = dataclasses.replace(plan, tiling=dataclasses.replace(plan.tiling, **fields))
                keyed += [((s.name, "A"), plan), ((s.name, "B"), other)]
    kernels = load_keyed(keyed)
    tdt = TORCH_DTYPES[dtype]
    for shape in dict.fromkeys(key[0] for key, _ in keyed):
        plan, _ = kernels[(shape, "A")]
        p = plan.problem
        tensors = {role: torch.randn(size).to(tdt).contiguous(memory_format=memory_format(layout, len(size)))
                   for role, size, layout in _roles(p)}
        role, size, layout = _result(p)
        fmt = memory_format(layout, len(size))
        outs = {v: torch.empty(size, dtype=tdt).contiguous(memory_format=fmt) for v in "AB"}

        def call(v):
            kernels[(shape, v)][1]({**tensors, role: outs[v]}, p.n, 2)

        for v in "AB":
            call(v)
        assert torch.allclose(outs["A"].double(), outs["B"].double(), rtol=2e-2, atol=2e-2), f"{shape}: A != B"
        t0 = time.perf_counter()
        call("A")
        reps = max(1, int(0.05 / max(time.perf_counter() - t0, 1e-5)))
        times = {"A": [], "B": []}
        for i in range(a.samples):
            for v in ("AB" if i % 2 else "BA"):
                t0 = time.perf_counter()
                for _ in range(reps):
                    call(v)
                times[v].append((time.perf_counter() - t0) / reps * 1e3)
        ma, mb = statistics.median(times["A"]), statistics.median(times["B"])
        print(f"{shape:24s} A {ma:9.3f} ms  B {mb:9.3f} ms  B/A {mb / ma:5.2f}   ({p.name()})", flush=True)
    return 0


def _roles(p):
    """(role, shape, layout) of the kernel's operands but its result."""
    if p.op is Op.FWD:
        roles = [("input", p.input_shape, p.input_layout), ("weight", p.weight_shape, p.weight_layout)]
        return roles + ([("bias", (p.k,), Layout.CONTIGUOUS)] if p.bias else [])
    if p.op is Op.BWD_DATA:
        return [("grad_output", p.output_shape, p.output_layout), ("weight", p.weight_shape, p.weight_layout)]
    return [("grad_output", p.output_shape, p.output_layout), ("input", p.input_shape, p.input_layout)]


def _result(p):
    """(role, shape, layout) of the kernel's result."""
    if p.op is Op.FWD:
        return "output", p.output_shape, p.output_layout
    if p.op is Op.BWD_DATA:
        return "grad_input", p.input_shape, p.input_layout
    return "grad_weight", p.weight_shape, p.weight_layout


if __name__ == "__main__":
    sys.exit(main())
