"""Strided kernels of transposed convolutions and strided data gradients on lanes (AVX-512, NCHW).

A transposed convolution's data gradient is a strided forward kernel: on the AVX-512 shape in NCHW,
2-D ones take lanes from 32 channels of grad_output and 3-D ones from 16
(codegen/cpu/lanes.py, WIDE_TRANSPOSED_LANES_MIN_IN); 1-D ones, fewer channels and the AVX2
shape keep blocked. A strided data-gradient kernel (a transposed convolution's forward, or a strided
convolution's data gradient) whose stride phases are one vector wide takes lanes there too, since
lanes stores a stride-2 phase's pixels two masked vector stores per channel (vstore_t_step2 of
templates/cpu/vector.h.j2) instead of value by value. The lanes kernels' results are checked on both
code shapes by tests/cpu/test_variants.py (every algorithm); here the plans these choices make, and
the stores of stride-2 phases (runs of every other pixel, runs broken by a row's end, partial
channel blocks, stride 3, 3-D), are checked against ATen in float64 on the AVX-512 shape (natively
where the CPU runs it; elsewhere compiled for the host, whose stores go value by value).
"""

from __future__ import annotations

import functools
import zlib

import pytest
import torch

from convgen.codegen.ir import Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target

from support.builds import kernels_by_key
from support.code_shapes import x86_shape
from support.problems import conv_problem
from support.reference import rel_err, tolerance

# the data gradient (or `op`) of a transposed (or not) convolution of `c` input and `k` output
# channels, stride 2 unless a case says otherwise
_problem = functools.partial(conv_problem, stride=2, op=Op.BWD_DATA, transposed=True)


AVX512, AVX2 = cpu_target("avx512"), cpu_target("avx2")


@pytest.mark.parametrize("kw, target, algorithm", [
    (dict(n=8, c=128, k=64, size=(16, 16), kernel=(4, 4)), AVX512, "lanes"),            # dcgan_tconv
    (dict(n=8, c=64, k=32, size=(32, 32), kernel=(3, 3), output_padding=1), AVX512, "lanes"),   # 32
    (dict(n=4, c=32, k=16, size=(64, 64), kernel=(3, 3), output_padding=1), AVX512, "blocked"),  # 16
    (dict(n=8, c=64, k=32, size=(32, 32), kernel=(4, 4), groups=2), AVX512, "blocked"),  # 16 per group
    (dict(n=2, c=32, k=16, size=(8, 16, 16), kernel=(4, 4, 4)), AVX512, "lanes"),        # 3-D from 16
    (dict(n=2, c=16, k=8, size=(8, 32, 32), kernel=(3, 3, 3), output_padding=1), AVX512, "blocked"),
    (dict(n=8, c=128, k=64, size=(1024,), kernel=(4,)), AVX512, "blocked"),              # 1-D
    (dict(n=8, c=128, k=64, size=(16, 16), kernel=(4, 4)), AVX2, "blocked"),             # AVX2 shape
    (dict(n=8, c=128, k=64, size=(16, 16), kernel=(4, 4), layout=Layout.CHANNELS_LAST), AVX2, "lanes"),
    # one-vector (16-wide) stride-2 phases: a transposed forward and a data gradient
    (dict(n=8, c=128, k=64, size=(16, 16), kernel=(4, 4), op=Op.FWD), AVX512, "lanes"),     # dcgan_tconv
    (dict(n=8, c=64, k=128, size=(32, 32), kernel=(3, 3), transposed=False), AVX512, "lanes"),
    (dict(n=8, c=64, k=128, size=(64, 64), kernel=(3, 3), transposed=False), AVX512, "blocked"),   # 32-wide
    (dict(n=8, c=128, k=64, size=(16, 16), kernel=(4, 4), op=Op.FWD), AVX2, "blocked"),
], ids=["dcgan", "2d_32", "2d_16", "2d_grouped_16", "3d_16", "3d_8", "1d", "avx2", "avx2_channels_last",
        "dcgan_forward", "s2_data_gradient_16_wide", "s2_data_gradient_32_wide", "avx2_dcgan_forward"])
def test_the_choice(kw, target, algorithm):
    plan = lower(_problem(**kw), target)
    why = "; ".join(r for p, r in plan.reasons if p == "algorithm")
    assert plan.algorithm == algorithm, why
    if target is AVX512 and algorithm == "lanes" and kw.get("op", Op.BWD_DATA) is Op.BWD_DATA and kw.get("transposed", True):
        assert "transposed convolution's data gradient" in why


# small cases of the kinds that now take lanes: odd sizes, output padding, groups, 3-D, short batch;
# then strided data-gradient kernels forced onto lanes, whose stride-2 phases are stored as runs of
# every other pixel: a 16-wide phase, a 20-wide one (a run and the rest), odd widths (phases of 17
# and 16), 20 channels (a partial block), stride 3 (value by value), 3-D, stride 2 along rows only
CASES = [
    ("k4_s2", dict(n=2, c=40, k=32, size=(5, 7), kernel=(4, 4))),
    ("k3_s2_output_padding", dict(n=3, c=33, k=48, size=(6, 5), kernel=(3, 3), output_padding=1)),
    ("groups", dict(n=2, c=64, k=64, size=(4, 6), kernel=(4, 4), groups=2, pad=2)),
    ("3d", dict(n=1, c=20, k=17, size=(3, 4, 5), kernel=(4, 4, 4))),
    ("k2_s2_no_padding", dict(n=2, c=48, k=40, size=(7, 6), kernel=(2, 2), pad=0)),
]
FORCED = [
    ("phase_16_transposed_forward", dict(n=2, c=24, k=32, size=(3, 16), kernel=(4, 4), op=Op.FWD)),
    ("phase_16_data_gradient", dict(n=2, c=32, k=24, size=(5, 32), kernel=(3, 3), transposed=False)),
    ("phase_20", dict(n=1, c=16, k=20, size=(4, 40), kernel=(3, 3), transposed=False)),
    ("odd_width", dict(n=2, c=20, k=16, size=(3, 33), kernel=(3, 3), transposed=False)),
    ("partial_block", dict(n=1, c=20, k=24, size=(4, 20), kernel=(4, 4), op=Op.FWD)),
    ("stride_3", dict(n=1, c=16, k=16, size=(4, 48), kernel=(3, 3), stride=3, transposed=False)),
    ("3d_phase_16", dict(n=1, c=16, k=20, size=(3, 4, 32), kernel=(3, 3, 3), transposed=False)),
    ("rows_only", dict(n=2, c=16, k=16, size=(6, 35), kernel=(3, 3), stride=(2, 1), transposed=False)),
]


@pytest.fixture(scope="module")
def kernels():
    forced = dict(FORCED)
    return kernels_by_key([(name,) for name, _ in CASES + FORCED],
                          lambda name: lower(_problem(**dict(CASES + FORCED)[name]), x86_shape("avx512"),
                                             algorithm="lanes" if name in forced else None))


@pytest.mark.parametrize("name, kw", CASES + FORCED, ids=[c[0] for c in CASES + FORCED])
def test_results_match_aten(kernels, name, kw):
    plan, kernel = kernels[(name,)]
    problem = plan.problem
    assert plan.algorithm == "lanes", plan.reasons
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    rank = len(problem.kernel)
    args = (list(problem.stride), [lo for lo, _ in problem.padding], [1] * rank, problem.transposed,
            list(problem.output_padding), problem.groups)
    w = torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64)
    if problem.op is Op.FWD:
        x = torch.randn(problem.input_shape, generator=gen, dtype=torch.float64)
        b = torch.randn(problem.k, generator=gen, dtype=torch.float64)
        out = torch.full(problem.output_shape, float("nan"), dtype=torch.float32)
        kernel({"input": x.float(), "weight": w.float(), "bias": b.float(), "output": out}, problem.n, 2)
        ref = torch.ops.aten.convolution(x, w, b, *args)
        terms = problem.c // problem.groups * torch.Size(problem.kernel).numel()
    else:
        gy = torch.randn(problem.output_shape, generator=gen, dtype=torch.float64)
        out = torch.full(problem.input_shape, float("nan"), dtype=torch.float32)
        kernel({"grad_output": gy.float(), "weight": w.float(), "grad_input": out}, problem.n, 2)
        x = torch.empty(problem.input_shape, dtype=torch.float64)
        ref = torch.ops.aten.convolution_backward(gy, x, w, None, *args, (True, False, False))[0]
        terms = problem.k // problem.groups * torch.Size(problem.kernel).numel()
    assert not torch.isnan(out).any(), "outputs left unwritten"
    assert rel_err(out, ref) <= tolerance(torch.float32, terms), f"rel err {rel_err(out, ref):.2e}"
