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
from convgen.codegen.ir import DType, Layout, Op
from support.reference import assert_close, generator_for, in_layout

# (name, input, weight, groups, kernel family of the weight gradient, channels-last)
SHAPES = [
    ("stem", (2, 4, 9, 9), (3, 4, 2, 3), 1, "stem", False),
    ("depthwise", (2, 8, 9, 9), (8, 1, 3, 3), 8, "depthwise", False),
    ("gemm", (2, 16, 9, 9), (16, 16, 3, 3), 1, "igemm", False),
    # channels-last: the implicit GEMM's fused bias reads rows of channels (igemm.cu.j2 bias_rows), 16
    # bytes a lane where the channels come in whole loads (16 of f32), one channel a lane where not (18)
    ("gemm_cl", (2, 16, 9, 9), (16, 16, 3, 3), 1, "igemm", True),
    ("gemm_cl_18", (2, 6, 9, 9), (18, 6, 3, 3), 1, "igemm", True),
]


def _cancelling(shape, gen) -> torch.Tensor:
    """Normal values whose per-channel sums (over images and pixels) are about 1e-3 of the sums of
    their magnitudes: each channel's float64 mean taken out, then a small common offset added."""
    g = torch.randn(shape, dtype=torch.float64, generator=gen)
    dims = [0] + list(range(2, len(shape)))
    g = g - g.mean(dim=dims, keepdim=True) + 1e-3
    return g.float()


@pytest.mark.parametrize("vendor", ["cuda", "hip"])
@pytest.mark.parametrize("name, x_shape, w_shape, groups, family, channels_last", SHAPES, ids=[s[0] for s in SHAPES])
def test_a_cancelling_bias_gradient_stays_within_f32s_tolerance(monkeypatch, vendor, name, x_shape, w_shape,
                                                               groups, family, channels_last):
    monkeypatch.setenv("CONVGEN_SIM", vendor)
    layout = Layout.CHANNELS_LAST if channels_last else Layout.CONTIGUOUS
    problem = conv_problem(x_shape[0], x_shape[1], w_shape[0], x_shape[2:], w_shape[2:], groups=groups,
                           dtype=DType.F32, op=Op.BWD_WEIGHT, bias=True, layout=layout)
    assert algorithm_of(problem, vendor) == family   # the family this row is for
    gen = generator_for(f"bias-sums-{vendor}-{name}")
    x = in_layout(torch.randn(x_shape, dtype=torch.float64, generator=gen).float(), layout)
    w = in_layout(torch.randn(w_shape, dtype=torch.float64, generator=gen).float(), layout)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], groups)
    gy = in_layout(_cancelling(torch.ops.aten.convolution(x, w, None, *args).shape, gen), layout)
    exact = gy.double().sum(dim=(0, 2, 3))
    magnitude = gy.double().abs().sum(dim=(0, 2, 3))
    assert (exact.abs() < 2e-2 * magnitude).all()   # the terms do cancel
    for mask in ([False, True, True], [False, False, True], [True, True, True]):
        got = convgen.convolution_backward(gy, x, w, [w_shape[0]], *args, mask)
        assert_close(got[2], exact, torch.float32, f"grad_bias ({family}, output_mask={mask})",
                     terms=gy.numel() // gy.shape[1])


@pytest.mark.parametrize("channels, filters, most", [(32, 64, 1.0), (6, 18, 2.5)])
def test_the_fused_bias_reads_channels_last_grad_output_in_whole_sectors(monkeypatch, channels, filters, most):
    """The implicit GEMM's fused bias gradient, channels-last (igemm.cu.j2 bias_rows): the weight
    gradient's launch with the bias reads grad_output once more, in as many 32-byte sectors as it has
    (64 bf16 filters: 16-byte loads, four runs of 8 channels a row) or near that (18: one channel a lane,
    rows of 36 bytes). Lanes along one channel's pixels read a sector an element: 16 times as many
    (18432 for 64 filters, 5184 for 18, as this kernel did before)."""
    monkeypatch.setenv("CONVGEN_SIM", "cuda")
    gen = generator_for(f"bias-rows-{filters}")
    cl = torch.channels_last
    x = torch.randn((2, channels, 12, 12), generator=gen).bfloat16().contiguous(memory_format=cl)
    w = torch.randn((filters, channels, 3, 3), generator=gen).bfloat16().contiguous(memory_format=cl)
    gy = torch.randn((2, filters, 12, 12), generator=gen).bfloat16().contiguous(memory_format=cl)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    loads = {}
    for bias in (False, True):
        with convgen.sim_profile() as launches:
            convgen.convolution_backward(gy, x, w, [filters], *args, [False, True, bias])
        (partial,) = [launch for launch in launches if launch["kernel"] == "bwd_weight_partial"]
        loads[bias] = (partial["global_sectors"] - partial["store_sectors"], partial["bytes_read"])
    ideal = gy.numel() * gy.element_size() // 32
    assert loads[True][1] - loads[False][1] == gy.numel() * gy.element_size()   # grad_output once more
    assert ideal <= loads[True][0] - loads[False][0] <= most * ideal, (loads, ideal)
