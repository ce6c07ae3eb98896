"""The GPU bias gradient where a channel's terms cancel, in every kernel family that sums it.

A bias gradient is one sum per channel of grad_output. Where its terms nearly cancel (|sum| far below
sum of |terms|), an f32 running sum loses digits that the float64 reference keeps: on an H200, CASES.md
case 05 in f32 with a channels-last weight (25 terms, |sum| / sum |terms| = 1/107) came out 3.0e-6
off (f32's bound: 1e-6), the simulator giving the same bits. The GPU kernels sum bias gradients in
double (BiasAcc), as the CPU's do, so each channel's result is its sum rounded once per stored
partial. Here grad_output is drawn so that every channel's terms cancel to about a thousandth of
their magnitudes, and each family's bias gradient -- fused into the weight gradient (stem, depthwise,
implicit GEMM's split partials) and alone (the GEMM kernels' bwd_bias) -- must stay within f32's
tolerance of float64 ATen, in the simulator of both vendors.
"""

from __future__ import annotations

import pytest
import torch

import convgen
from support.gpu_plans import algorithm_of
from support.problems import conv_problem
from convgen.codegen.ir import DType, Op
from support.reference import assert_close, generator_for

# (name, input, weight, groups, kernel family of the weight gradient)
SHAPES = [
    ("stem", (2, 4, 9, 9), (3, 4, 2, 3), 1, "stem"),
    ("depthwise", (2, 8, 9, 9), (8, 1, 3, 3), 8, "depthwise"),
    ("gemm", (2, 16, 9, 9), (16, 16, 3, 3), 1, "igemm"),
]


def _cancelling(shape, gen) -> torch.Tensor:
    """Normal values whose per-channel sums (over images and pixels) are about 1e-3 of the sums of
    their magnitudes: each channel's float64 mean taken out, then a small common offset added."""
    g = torch.randn(shape, dtype=torch.float64, generator=gen)
    dims = [0] + list(range(2, len(shape)))
    g = g - g.mean(dim=dims, keepdim=True) + 1e-3
    return g.float()


@pytest.mark.parametrize("vendor", ["cuda", "hip"])
@pytest.mark.parametrize("name, x_shape, w_shape, groups, family", SHAPES, ids=[s[0] for s in SHAPES])
def test_a_cancelling_bias_gradient_stays_within_f32s_tolerance(monkeypatch, vendor, name, x_shape, w_shape,
                                                               groups, family):
    monkeypatch.setenv("CONVGEN_SIM", vendor)
    problem = conv_problem(x_shape[0], x_shape[1], w_shape[0], x_shape[2:], w_shape[2:], groups=groups,
                           dtype=DType.F32, op=Op.BWD_WEIGHT, bias=True)
    assert algorithm_of(problem, vendor) == family   # the family this row is for
    gen = generator_for(f"bias-sums-{vendor}-{name}")
    x = torch.randn(x_shape, dtype=torch.float64, generator=gen).float()
    w = torch.randn(w_shape, dtype=torch.float64, generator=gen).float()
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], groups)
    gy = _cancelling(torch.ops.aten.convolution(x, w, None, *args).shape, gen)
    exact = gy.double().sum(dim=(0, 2, 3))
    magnitude = gy.double().abs().sum(dim=(0, 2, 3))
    assert (exact.abs() < 2e-2 * magnitude).all()   # the terms do cancel
    for mask in ([False, True, True], [False, False, True], [True, True, True]):
        got = convgen.convolution_backward(gy, x, w, [w_shape[0]], *args, mask)
        assert_close(got[2], exact, torch.float32, f"grad_bias ({family}, output_mask={mask})",
                     terms=gy.numel() // gy.shape[1])
