"""Random convolution calls for property tests (hypothesis): the model of a call, a strategy of
valid small ones over every axis of CASES.md, ATen's and CASES.md's verdicts on a call, and the
check of convgen's forward and backward against torch's float64 results.

api/test_properties.py runs them through the CPU kernels, sim/test_runtime.py in the simulator.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st

import convgen

from support.reference import assert_close, assert_same_format, channels_last_format, non_contiguous

SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                      HealthCheck.data_too_large])

FUNCTIONAL = {
    (False, 1): F.conv1d, (False, 2): F.conv2d, (False, 3): F.conv3d,
    (True, 1): F.conv_transpose1d, (True, 2): F.conv_transpose2d, (True, 3): F.conv_transpose3d,
}


@dataclasses.dataclass(frozen=True)
class Call:
    """One convolution call: tensor shapes, ATen's arguments and how the operands are laid out."""

    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    bias: bool
    stride: list[int]
    padding: list[int] | str
    dilation: list[int]
    transposed: bool
    output_padding: list[int]
    groups: int
    dtype: torch.dtype = torch.float64
    formats: tuple[str, str, str] = ("contiguous", "contiguous", "contiguous")   # input, weight, grad_output
    mask: tuple[bool, bool, bool] = (True, True, True)                           # the random output_mask

    @property
    def rank(self) -> int:
        return len(self.input_shape) - 2

    @property
    def out_channels(self) -> int:
        return self.weight_shape[1] * self.groups if self.transposed else self.weight_shape[0]

    def torch_forward(self, x, w, b):
        """torch.nn.functional's convolution (it knows 'same', with its one-sided padding)."""
        fn = FUNCTIONAL[(self.transposed, self.rank)]
        if self.transposed:
            return fn(x, w, b, self.stride, self.padding, self.output_padding, self.groups, self.dilation)
        return fn(x, w, b, self.stride, self.padding, self.dilation, self.groups)

    def args(self):
        return (self.stride, self.padding, self.dilation, self.transposed, self.output_padding, self.groups)


def laid_out(t: torch.Tensor, how: str) -> torch.Tensor:
    if how == "channels_last" and channels_last_format(t.dim()) is not None:
        return t.contiguous(memory_format=channels_last_format(t.dim()))
    if how == "non_contiguous":
        return non_contiguous(t)
    return t


def tensors(call: Call, seed: int):
    g = torch.Generator().manual_seed(seed)

    def randn(shape):
        return torch.randn(shape, dtype=torch.float64, generator=g).to(call.dtype)

    x = laid_out(randn(call.input_shape), call.formats[0])
    w = laid_out(randn(call.weight_shape), call.formats[1])
    b = randn((max(call.out_channels, 0),)) if call.bias else None
    return x, w, b


def reference(call: Call, x, w, b, gy):
    """torch's forward and all three gradients in float64 (autograd through the functional call;
    without a bias, a zero bias stands in, so its gradient is there too)."""
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = (b.detach().double() if b is not None else torch.zeros(call.out_channels, dtype=torch.float64))
    b64.requires_grad_()
    y64 = call.torch_forward(x64, w64, b64)
    grads = torch.autograd.grad(y64, (x64, w64, b64), gy.double(), allow_unused=True)
    grads = tuple(torch.zeros_like(t) if gr is None else gr for gr, t in zip(grads, (x64, w64, b64)))
    return y64.detach(), grads


def torch_refuses(call: Call) -> bool:
    """ATen decides validity: its forward and its backward (on a matching grad_output) must accept.

    torch.nn.functional's normal convolutions take no output_padding, so ATen's own rules for it
    are applied here: one value or one per spatial axis, and all zero unless transposed (ATen's
    convolution_backward refuses any other, and convgen refuses it in both passes)."""
    if len(call.output_padding) not in (1, call.rank) or (not call.transposed and any(call.output_padding)):
        note("ATen refuses the output_padding")
        return True
    x, w, b = tensors(call, 0)
    try:
        y = call.torch_forward(x, w, b)
        if call.padding not in ("same", "valid"):
            torch.ops.aten.convolution_backward(torch.ones_like(y), x, w, [call.out_channels], call.stride,
                                               call.padding, call.dilation, call.transposed, call.output_padding,
                                               call.groups, [True, True, True])
    except Exception as e:   # noqa: BLE001 - any refusal counts, whatever its type
        note(f"torch refuses: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return True
    return False


def cases_md_refuses(call: Call) -> bool:
    """CASES.md's rules that convgen applies whatever the batch, where ATen skips them for an empty
    input (zero batch or channels): an empty spatial dimension, a zero-size kernel dimension,
    dilation <= 0, and for transposed convolutions output_padding not smaller than stride or
    dilation, or an output size below 1."""
    if min(call.input_shape[2:], default=1) == 0 or min(call.dilation, default=1) <= 0:
        return True
    if min(call.weight_shape[2:], default=1) == 0:
        return True
    if call.transposed:
        expand = lambda v: list(v) * call.rank if len(v) == 1 else list(v)
        s, p, d, op = (expand(v) for v in (call.stride, call.padding, call.dilation, call.output_padding))
        for i, kr, si, pi, di, opi in zip(call.input_shape[2:], call.weight_shape[2:], s, p, d, op):
            if opi >= si and opi >= di:
                return True
            if (i - 1) * si - 2 * pi + di * (kr - 1) + opi + 1 < 1:
                return True
    return False


def check_against_torch(call: Call, masks) -> None:
    """convgen's forward and backward (for each mask) against torch's float64 results."""
    x, w, b = tensors(call, 1)
    y = convgen.convolution(x, w, b, *call.args())
    native = call.torch_forward(x, w, b)
    g = torch.Generator().manual_seed(2)
    gy = laid_out(torch.randn(native.shape, dtype=torch.float64, generator=g).to(call.dtype), call.formats[2])
    y64, grads64 = reference(call, x, w, b, gy)
    assert_close(y, y64, call.dtype, "forward")
    assert y.shape == native.shape
    assert_same_format(y, native, "forward")
    for mask in masks:
        got = convgen.convolution_backward(gy, x, w, [call.out_channels], *call.args(), list(mask))
        for name, grad, grad64, wanted in zip(("grad_input", "grad_weight", "grad_bias"), got, grads64, mask):
            if not wanted:
                assert grad is None, f"{name} computed although output_mask={list(mask)}"
            else:
                assert_close(grad, grad64, call.dtype, f"{name} (output_mask={list(mask)})")


@st.composite
def valid_calls(draw, rank: int, transposed: bool, dtypes=(torch.float32, torch.float64)) -> Call:
    groups = draw(st.sampled_from([1, 1, 2, 3, 4]))
    depthwise = groups > 1 and draw(st.booleans())
    in_per_group = 1 if depthwise else draw(st.sampled_from([0, 1, 1, 2, 3]))
    out_per_group = draw(st.integers(1, 3))
    n = draw(st.integers(0, 3))
    kmax, smax = (3, 8) if rank < 3 else (2, 4)
    kernel = [draw(st.integers(1, kmax)) for _ in range(rank)]
    stride = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilation = [draw(st.integers(1, 3)) for _ in range(rank)]
    padding_kind = draw(st.sampled_from(["ints", "ints", "same", "valid"]))
    if transposed or padding_kind == "ints":
        padding = [draw(st.integers(0, 2)) for _ in range(rank)]
    else:
        padding = padding_kind
        if padding == "same":
            stride = [1] * rank
    if transposed:
        output_padding = [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation)]
    else:
        output_padding = [0] * rank
    pads = [0] * rank if isinstance(padding, str) else padding
    # at least as large as the padded, dilated kernel for a normal convolution
    low = [max(1, d * (k - 1) + 1 - 2 * p) if not transposed else 1 for k, d, p in zip(kernel, dilation, pads)]
    in_size = [draw(st.integers(lo, lo + smax)) for lo in low]
    c = groups * in_per_group
    if transposed:
        weight = (c, out_per_group, *kernel)
    else:
        weight = (groups * out_per_group, in_per_group, *kernel)
    formats = tuple(draw(st.sampled_from(["contiguous", "channels_last", "non_contiguous"])) for _ in range(3))
    mask = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    return Call((n, c, *in_size), weight, draw(st.booleans()), stride, padding, dilation, transposed,
                output_padding, groups, draw(st.sampled_from(list(dtypes))), formats, mask)
