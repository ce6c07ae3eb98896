"""The grouplanes weight gradient's parts of the reduction, counted from the batch (`Tiling.part_pixels`).

The output rows of the batch are cut into one part per GROUPLANES_PART_PIXELS output pixels, at most
`splits` (MIN_ITEMS) of them; each part keeps its own sums in double, and the parts are added in
order, in parallel over the weights. One kernel serves every batch size, so these cases call the same
kernels with batches that give one part, a few and all of them (depthwise and small groups, with and
without the bias gradient, f32 and bf16), against ATen in float64, and check that the results do not
depend on the thread count.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from convgen.codegen.cpu.grouplanes import GROUPLANES_PART_PIXELS
from convgen.codegen.cpu.work import MIN_ITEMS
from convgen.codegen.emit import emit
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import host_cpu
from convgen.dispatch.problem import TORCH_DTYPES, memory_format

from support.builds import load_keyed
from support.problems import conv_problem
from support.reference import check_weight_gradient

# name, problem arguments (batch 1), batches: output pixels 7x7 = 49 a batch image
KERNELS = {
    "depthwise": dict(c=40, k=40, size=(7, 7), kernel=3, pad=1, groups=40),
    "depthwise_5x5_s2": dict(c=24, k=24, size=(13, 14), kernel=5, stride=2, pad=2, groups=24),
    "groups_of_4": dict(c=32, k=32, size=(7, 7), kernel=3, pad=1, groups=8),
    "depthwise_bf16": dict(c=40, k=40, size=(7, 7), kernel=3, pad=1, groups=40, dtype=DType.BF16),
}
BATCHES = (1, 3, 40)   # one part (49 pixels), two (147), all MIN_ITEMS (1960)


def _problem(name: str, n: int, bias: bool = True):
    return conv_problem(n, op=Op.BWD_WEIGHT, layout=Layout.CHANNELS_LAST, bias=bias, **KERNELS[name])


@pytest.fixture(scope="module")
def kernels():
    keyed = []
    for name in KERNELS:
        for bias in (True, False):
            plan = lower(_problem(name, 1, bias), host_cpu(), algorithm="grouplanes")
            keyed.append(((name, bias), plan))
    return load_keyed(keyed)


def test_parts_follow_the_batch():
    plan = lower(_problem("depthwise", 1), host_cpu(), algorithm="grouplanes")
    assert plan.tiling.part_pixels == GROUPLANES_PART_PIXELS and plan.tiling.splits == MIN_ITEMS
    assert f"PART_PIXELS = {GROUPLANES_PART_PIXELS};" in emit(plan).text
    parts = lambda n: max(1, min(MIN_ITEMS, n * 49 // GROUPLANES_PART_PIXELS))
    assert [parts(n) for n in BATCHES] == [1, 2, MIN_ITEMS]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("name", list(KERNELS))
def test_parts_match_aten(kernels, name, n, bias):
    plan, kernel = kernels[(name, bias)]
    problem = dataclasses.replace(plan.problem, n=n)
    check_weight_gradient(kernel, problem, torch.Generator().manual_seed(n * 7 + len(name)))


def _runner(problem, seed: int):
    """run(kernel, threads) -> (grad_weight, grad_bias) of `kernel` on one random grad_output and input
    of `problem` (channels last), its results poisoned with NaN first."""
    tdt = TORCH_DTYPES[problem.dtype]
    gen = torch.Generator().manual_seed(seed)
    cl = lambda t: t.contiguous(memory_format=memory_format(Layout.CHANNELS_LAST, t.dim()))
    x = cl(torch.randn(problem.input_shape, generator=gen).to(tdt))
    gy = cl(torch.randn(problem.output_shape, generator=gen).to(tdt))

    def run(kernel, threads: int):
        gw = cl(torch.full(problem.weight_shape, float("nan"), dtype=tdt))
        gb = torch.full((problem.k,), float("nan"), dtype=tdt)
        kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb}, problem.n, threads)
        return gw, gb
    return run


@pytest.mark.parametrize("name", ["depthwise", "groups_of_4"])
def test_results_do_not_depend_on_the_threads(kernels, name):
    plan, kernel = kernels[(name, True)]
    problem = dataclasses.replace(plan.problem, n=3)
    run = _runner(problem, 3)
    results = [run(kernel, threads) for threads in (1, 2, 3)]
    for gw, gb in results[1:]:
        assert torch.equal(gw, results[0][0]) and torch.equal(gb, results[0][1])


# Tiling.rows_at_once: an output row's input rows in one walk of its pixels (templates/cpu/
# grouplanes_wgrad.cpp.j2's span_rows: a sliding window a row at unit stride and dilation). Each sum takes
# the same products in the same order as the row-by-row walk, so both give the same bits; on this
# host's code shape and the AVX2 one (whose 16 registers hold a 3x3's sums without the windows).
ROWS = {"unit": dict(c=40, k=40, size=(9, 11), kernel=3, pad=1, groups=40),
        "stride2_dil": dict(c=20, k=20, size=(9, 12), kernel=3, stride=2, pad=2, dil=2, groups=20),
        "groups_of_2": dict(c=32, k=32, size=(7, 9), kernel=3, pad=1, groups=16),
        "bf16": dict(c=40, k=40, size=(6, 13), kernel=3, pad=1, groups=40, dtype=DType.BF16)}


@pytest.mark.parametrize("shape", ["host", "avx2"])
def test_rows_at_once_gives_the_row_walks_bits(shape):
    from support.code_shapes import x86_shape
    target = host_cpu() if shape == "host" else x86_shape("avx2")
    keyed = []
    for name, args in ROWS.items():
        plan = lower(conv_problem(2, op=Op.BWD_WEIGHT, layout=Layout.CHANNELS_LAST, **args), target,
                     algorithm="grouplanes")
        assert plan.tiling.rows_at_once and "one walk of its pixels" in " ".join(w for _, w in plan.reasons)
        off = dataclasses.replace(plan, tiling=dataclasses.replace(plan.tiling, rows_at_once=False))
        keyed += [((name, True), plan), ((name, False), off)]
    built = load_keyed(keyed)
    for on in (True, False):   # the flag reaches the kernel (which also asks that the sums fit)
        assert f"constexpr bool ALL_ROWS =\n    {'true' if on else 'false'} && KR > 1" in emit(built[("unit", on)][0]).text
    for name in ROWS:
        plan, kernel = built[(name, True)]
        problem = plan.problem
        check_weight_gradient(kernel, problem, torch.Generator().manual_seed(len(name)))
        run = _runner(problem, 5)
        results = [run(built[(name, at_once)][1], 2) for at_once in (True, False)]
        assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1]), name
