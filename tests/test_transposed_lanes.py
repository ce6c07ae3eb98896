"""Which kernel a transposed convolution's strided data gradient takes (a strided forward kernel).

On the AVX-512 shape in NCHW, 2-D ones take lanes from 32 channels of grad_output and 3-D ones
from 16 (codegen/passes/algorithm.py, WIDE_TRANSPOSED_LANES_MIN_IN); 1-D ones, fewer channels and
the AVX2 shape keep blocked. The lanes kernels' results against ATen are checked on both code shapes
by tests/test_variants.py (transposed_s2, transposed_k4_s2, transposed_groups_op, every algorithm);
here the results of the plans this choice makes are checked natively against ATen in float64.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target

from code_shapes import x86_shape
from reference import kernels_by_key, rel_err, tolerance


def _problem(n, c, k, size, kernel, stride=2, pad=1, groups=1, output_padding=0, layout=Layout.CONTIGUOUS,
             dtype=DType.F32) -> ConvProblem:
    """The data gradient of a transposed convolution of `c` input and `k` output channels."""
    r = len(size)
    return ConvProblem(op=Op.BWD_DATA, n=n, c=c, k=k, in_size=size, kernel=kernel, stride=(stride,) * r,
                       padding=((pad, pad),) * r, dilation=(1,) * r, groups=groups, transposed=True,
                       output_padding=(output_padding,) * r, dtype=dtype, input_layout=layout,
                       weight_layout=layout, output_layout=layout, bias=False)


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
], ids=["dcgan", "2d_32", "2d_16", "2d_grouped_16", "3d_16", "3d_8", "1d", "avx2", "avx2_channels_last"])
def test_the_choice(kw, target, algorithm):
    plan = lower(_problem(**kw), target)
    why = "; ".join(r for p, r in plan.reasons if p == "algorithm")
    assert plan.algorithm == algorithm, why
    if target is AVX512 and algorithm == "lanes":
        assert "transposed convolution's data gradient" in why


# small cases of the kinds that now take lanes: odd sizes, output padding, groups, 3-D, short batch
CASES = [
    ("k4_s2", dict(n=2, c=40, k=32, size=(5, 7), kernel=(4, 4))),
    ("k3_s2_output_padding", dict(n=3, c=33, k=48, size=(6, 5), kernel=(3, 3), output_padding=1)),
    ("groups", dict(n=2, c=64, k=64, size=(4, 6), kernel=(4, 4), groups=2, pad=2)),
    ("3d", dict(n=1, c=20, k=17, size=(3, 4, 5), kernel=(4, 4, 4))),
    ("k2_s2_no_padding", dict(n=2, c=48, k=40, size=(7, 6), kernel=(2, 2), pad=0)),
]


@pytest.fixture(scope="module")
def kernels():
    return kernels_by_key([(name,) for name, _ in CASES],
                          lambda name: lower(_problem(**dict(CASES)[name]), x86_shape("avx512")))


@pytest.mark.parametrize("name, kw", CASES, ids=[c[0] for c in CASES])
def test_results_match_aten(kernels, name, kw):
    plan, kernel = kernels[(name,)]
    problem = plan.problem
    assert plan.algorithm == "lanes", plan.reasons
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    gy = torch.randn(problem.output_shape, generator=gen, dtype=torch.float64)
    w = torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64)
    out = torch.full(problem.input_shape, float("nan"), dtype=torch.float32)
    kernel({"grad_output": gy.float(), "weight": w.float(), "grad_input": out}, problem.n, 2)
    x = torch.empty(problem.input_shape, dtype=torch.float64)
    rank = len(problem.kernel)
    ref = torch.ops.aten.convolution_backward(
        gy, x, w, None, list(problem.stride), [lo for lo, _ in problem.padding], [1] * rank, True,
        list(problem.output_padding), problem.groups, (True, False, False))[0]
    terms = problem.k // problem.groups * torch.Size(problem.kernel).numel()
    assert not torch.isnan(out).any(), "outputs left unwritten"
    assert rel_err(out, ref) <= tolerance(torch.float32, terms), f"rel err {rel_err(out, ref):.2e}"
