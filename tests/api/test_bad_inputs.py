"""Bad inputs (CASES.md "Bad inputs: the rule and the message"), one curated case per rule.

Each case is one call that convgen must refuse with `ConvSpecError` (a `ValueError`) — or
`NotImplementedError`/`TypeError` for an unsupported dtype — whose message names the parameter
and the offending values, before anything is built (`stats()["builds"]` unchanged). The same
call on torch (torch.nn.functional, torch.ops.aten) is checked too: torch rejects it as well,
which shows the rule is ATen's — except in the cases marked `torch_accepts`, where CASES.md asks
convgen to refuse what ATen lets through (meta tensors, unsupported dtypes, a mismatched
grad_output, ...). A case whose call convgen gets wrong today carries `bug=` and is an expected
failure (strict), so it shows up the day it is fixed.
"""

from __future__ import annotations

import dataclasses
import re
import types
from typing import Callable

import pytest
import torch

import convgen

TORCH = types.SimpleNamespace(
    conv1d=torch.nn.functional.conv1d, conv2d=torch.nn.functional.conv2d, conv3d=torch.nn.functional.conv3d,
    conv_transpose1d=torch.nn.functional.conv_transpose1d, conv_transpose2d=torch.nn.functional.conv_transpose2d,
    conv_transpose3d=torch.nn.functional.conv_transpose3d, convolution=torch.ops.aten.convolution,
    convolution_backward=torch.ops.aten.convolution_backward)


def t(*shape, dtype=torch.float32, device="cpu"):
    """A fresh random tensor (the cases build their tensors anew on every call)."""
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=torch.float64).to(dtype=dtype, device=device)
    return torch.randint(0, 3, shape).to(dtype=dtype, device=device)


# the tensors of one valid 2-D convolution: x (1, 4, 8, 8) * w (4, 4, 3, 3) -> y (1, 4, 6, 6)
def x():
    return t(1, 4, 8, 8)


def w():
    return t(4, 4, 3, 3)


def gy():
    return t(1, 4, 6, 6)


def conv(api, input=None, weight=None, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
         transposed=False, output_padding=(0, 0), groups=1):
    """ATen-style forward with the valid defaults above; override one argument to break one rule."""
    return api.convolution(x() if input is None else input, w() if weight is None else weight, bias,
                           list(stride), padding if isinstance(padding, str) else list(padding), list(dilation),
                           transposed, list(output_padding), groups)


def conv_bwd(api, grad_output=None, input=None, weight=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
             transposed=False, output_padding=(0, 0), groups=1, output_mask=(True, True, True)):
    """ATen-style backward with the valid defaults above; override one argument to break one rule."""
    return api.convolution_backward(gy() if grad_output is None else grad_output, x() if input is None else input,
                                    w() if weight is None else weight, [4], list(stride), list(padding),
                                    list(dilation), transposed, list(output_padding), groups, list(output_mask))


def said(name: str, value: str) -> str:
    """A pattern for `name` followed closely by `value`: 'stride=[0, 0]', 'groups=0', 'stride: 0'."""
    return rf"{name}\W{{0,4}}{re.escape(value)}"


UNSUPPORTED_DTYPE = (NotImplementedError, TypeError)


@dataclasses.dataclass(frozen=True)
class Bad:
    call: Callable            # call(api), api being convgen or TORCH
    says: tuple[str, ...]     # regular expressions that must all be found in convgen's message
    error: type | tuple = convgen.ConvSpecError
    torch_accepts: bool = False   # ATen lets this through; CASES.md asks convgen to refuse it
    bug: str | None = None        # convgen gets it wrong today (an expected failure, strict)


CASES = {
    # ---- ranks: input rank does not fit the function, weight rank != input rank, weight < 3 dims
    "conv2d_5d_input": Bad(lambda api: api.conv2d(t(1, 4, 8, 8, 8), w()), ("conv2d", "input", r"\[1, 4, 8, 8, 8\]")),
    "conv3d_3d_input": Bad(lambda api: api.conv3d(t(4, 8, 8), t(4, 4, 3, 3, 3)), ("conv3d", "input", r"\[4, 8, 8\]")),
    "conv1d_1d_input": Bad(lambda api: api.conv1d(t(8), t(4, 4, 3)), ("conv1d", "input", r"\[8\]")),
    "conv2d_0d_input": Bad(lambda api: api.conv2d(torch.tensor(1.0), w()), ("conv2d", "input", r"\[\]")),
    # torch's own message talks about stride here; convgen names the ranks
    "conv2d_3d_weight": Bad(lambda api: api.conv2d(x(), t(4, 4, 3)), ("weight", r"\[4, 4, 3\]", r"\[1, 4, 8, 8\]")),
    "aten_weight_rank_differs": Bad(lambda api: conv(api, weight=t(4, 4, 3, 3, 3)),
                                    ("weight", r"\[4, 4, 3, 3, 3\]", r"\[1, 4, 8, 8\]")),
    "weight_2d": Bad(lambda api: api.conv1d(t(1, 4, 8), t(4, 4)), ("weight", r"three|3", r"\[4, 4\]")),
    "aten_weight_1d": Bad(lambda api: api.convolution(t(4), t(4), None, [1], [0], [1], False, [0], 1),
                          ("weight", r"three|3", r"\[4\]")),
    "aten_4_spatial_dims": Bad(lambda api: api.convolution(t(1, 1, 2, 2, 2, 2), t(1, 1, 1, 1, 1, 1), None, [1] * 4,
                                                           [0] * 4, [1] * 4, False, [0] * 4, 1),
                               ("weight|input", r"\[1, 1, 1, 1, 1, 1\]|\[1, 1, 2, 2, 2, 2\]")),

    # ---- channels and groups
    "channels_differ": Bad(lambda api: api.conv2d(x(), t(4, 3, 3, 3)),
                           (said("groups", "1"), r"\[4, 3, 3, 3\]", r"\b3 channels", r"\b4 channels")),
    "channels_differ_grouped": Bad(lambda api: api.conv2d(x(), w(), groups=2),
                                   (said("groups", "2"), r"\b8 channels", r"\b4 channels")),
    "channels_differ_unbatched": Bad(lambda api: api.conv2d(t(4, 8, 8), t(4, 3, 3, 3)),
                                     (r"\[4, 3, 3, 3\]", r"\b3 channels", r"\b4 channels")),
    "out_channels_not_divisible_by_groups": Bad(lambda api: api.conv2d(x(), t(3, 2, 3, 3), groups=2),
                                                (said("groups", "2"), r"\[3, 2, 3, 3\]")),
    "out_channels_fewer_than_groups": Bad(lambda api: api.conv2d(t(1, 4, 8, 8), t(0, 4, 3, 3)),
                                          (said("groups", "1"), r"\[0, 4, 3, 3\]")),
    # ATen fails inside its kernels here (IndexError at batch 0); found by test_properties
    "transposed_no_output_channels": Bad(lambda api: api.conv_transpose1d(t(2, 1, 2), t(1, 0, 1)),
                                         ("dimension 1", r"\[1, 0, 1\]")),
    "transposed_channels_differ": Bad(lambda api: api.conv_transpose2d(x(), t(3, 4, 3, 3)),
                                      ("transposed", r"\[3, 4, 3, 3\]", r"\b3 channels", r"\b4 channels")),
    "transposed_channels_not_divisible_by_groups": Bad(
        lambda api: api.conv_transpose2d(t(1, 3, 8, 8), t(3, 2, 3, 3), groups=2), (said("groups", "2"), r"\[3, 2, 3, 3\]")),
    "aten_transposed_channels_differ": Bad(lambda api: conv(api, weight=t(8, 4, 3, 3), transposed=True),
                                           ("transposed", r"\[8, 4, 3, 3\]", r"\b8 channels", r"\b4 channels")),
    "groups_0": Bad(lambda api: api.conv2d(x(), w(), groups=0), (said("groups", "0"),)),
    "groups_negative": Bad(lambda api: api.conv2d(x(), w(), groups=-1), (said("groups", "-1"),)),
    "transposed_groups_0": Bad(lambda api: api.conv_transpose2d(x(), w(), groups=0), (said("groups", "0"),)),
    "transposed_groups_negative": Bad(lambda api: api.conv_transpose2d(x(), w(), groups=-2), (said("groups", "-2"),)),
    "aten_groups_0": Bad(lambda api: conv(api, groups=0), (said("groups", "0"),)),

    # ---- kernel against the (padded) input
    "kernel_larger_than_input": Bad(lambda api: api.conv2d(x(), t(4, 4, 9, 9)),
                                    (r"(?i)kernel", r"9 x 9|\[9, 9\]", r"8 x 8|\[8, 8\]")),
    "kernel_larger_than_padded_input": Bad(lambda api: api.conv2d(t(1, 4, 4, 4), t(4, 4, 7, 7), padding=1),
                                           (r"(?i)kernel", r"7 x 7|\[7, 7\]", r"6 x 6|\[6, 6\]")),
    "dilated_kernel_larger_than_input": Bad(lambda api: api.conv2d(x(), w(), dilation=4),
                                            ("dilation", r"9 x 9|\[9, 9\]", r"8 x 8|\[8, 8\]")),
    "kernel_too_large_zero_batch": Bad(lambda api: api.conv2d(t(0, 4, 2, 2), w()),
                                       (r"(?i)kernel", r"3 x 3|\[3, 3\]", r"2 x 2|\[2, 2\]")),
    "valid_padding_kernel_too_large": Bad(lambda api: api.conv2d(x(), t(4, 4, 9, 9), padding="valid"),
                                          (r"(?i)kernel", r"9 x 9|\[9, 9\]")),
    "zero_size_kernel_dim": Bad(lambda api: api.conv2d(x(), t(4, 4, 0, 3)), (r"(?i)kernel", r"\b0\b", r"\b3\b")),
    "zero_size_kernel_dim_1d": Bad(lambda api: api.conv1d(t(1, 4, 8), t(4, 4, 0)), (r"(?i)kernel", r"\b0\b")),

    # ---- stride, padding, dilation values
    "stride_0": Bad(lambda api: api.conv2d(x(), w(), stride=0), (said("stride", "[0, 0]"),)),
    "stride_negative": Bad(lambda api: api.conv2d(x(), w(), stride=-1), (said("stride", "[-1, -1]"),)),
    "stride_0_one_axis": Bad(lambda api: api.conv2d(x(), w(), stride=[1, 0]), (said("stride", "[1, 0]"),)),
    "aten_stride_0": Bad(lambda api: conv(api, stride=(0, 1)), (said("stride", "[0, 1]"),)),
    "dilation_0": Bad(lambda api: api.conv2d(x(), w(), dilation=0), (said("dilation", "[0, 0]"),)),
    "dilation_negative": Bad(lambda api: api.conv3d(t(1, 2, 5, 5, 5), t(2, 2, 1, 1, 1), dilation=(1, -2, 1)),
                             (said("dilation", "[1, -2, 1]"),)),
    "padding_negative": Bad(lambda api: api.conv2d(x(), w(), padding=-1), ("padding", r"-1")),
    "padding_negative_one_axis": Bad(lambda api: api.conv1d(t(1, 4, 8), t(4, 4, 3), padding=-2), ("padding", r"-2")),
    "aten_padding_negative": Bad(lambda api: conv(api, padding=(1, -3)), ("padding", r"-3")),

    # ---- a parameter list of the wrong length
    "stride_3_values_for_2d": Bad(lambda api: api.conv2d(x(), w(), stride=[1, 1, 1]),
                                  (said("stride", "[1, 1, 1]"), r"\b2\b")),
    "padding_3_values_for_2d": Bad(lambda api: api.conv2d(x(), w(), padding=[1, 1, 1]),
                                   (said("padding", "[1, 1, 1]"), r"\b2\b")),
    "dilation_3_values_for_2d": Bad(lambda api: api.conv2d(x(), w(), dilation=[1, 1, 1]),
                                    (said("dilation", "[1, 1, 1]"), r"\b2\b")),
    "stride_2_values_for_1d": Bad(lambda api: api.conv1d(t(1, 4, 8), t(4, 4, 3), stride=[1, 2]),
                                  (said("stride", "[1, 2]"), r"\b1\b")),
    "stride_empty": Bad(lambda api: conv(api, stride=()), (said("stride", "[]"),)),
    "output_padding_3_values_for_2d": Bad(lambda api: conv(api, transposed=True, output_padding=(0, 0, 0)),
                                          (said("output_padding", "[0, 0, 0]"), r"\b2\b")),
    "aten_dilation_1_of_3d": Bad(lambda api: api.convolution(t(1, 2, 5, 5, 5), t(2, 2, 1, 1, 1), None, [1, 1, 1],
                                                             [0, 0, 0], [1, 1], False, [0, 0, 0], 1),
                                 (said("dilation", "[1, 1]"), r"\b3\b")),

    # ---- padding strings, overflow
    "same_with_stride_2": Bad(lambda api: api.conv2d(x(), w(), padding="same", stride=2),
                              (r"padding\W{0,4}'same'", said("stride", "[2, 2]"))),
    "same_with_stride_2_one_axis": Bad(lambda api: api.conv1d(t(1, 4, 8), t(4, 4, 2), padding="same", stride=[2]),
                                       (r"'same'", said("stride", "[2]"))),
    "unknown_padding_string": Bad(lambda api: api.conv2d(x(), w(), padding="full"), ("padding", "'full'")),
    "same_transposed": Bad(lambda api: api.conv_transpose2d(x(), w(), padding="same"), ("padding", "'same'")),
    "aten_unknown_padding_string": Bad(lambda api: conv(api, padding="circular"), ("padding", "'circular'")),
    # 2**62 is one past the most ATen accepts; 2**63 does not even fit an int64
    "padding_2_pow_62": Bad(lambda api: api.conv2d(x(), w(), padding=2**62), ("padding", str(2**62))),
    "padding_2_pow_63": Bad(lambda api: api.conv2d(x(), w(), padding=2**63), ("padding", str(2**63))),
    # ATen tries to allocate the padded output (petabytes) and fails in its allocator
    "padding_2_pow_40": Bad(lambda api: api.conv2d(x(), w(), padding=2**40), ("padding", str(2**40))),
    "aten_padding_2_pow_62": Bad(lambda api: conv(api, padding=(0, 2**62)), ("padding", str(2**62))),

    # ---- bias
    "bias_2d": Bad(lambda api: api.conv2d(x(), w(), t(4, 1)), ("bias", r"\[4, 1\]", r"\b4 elements")),
    "bias_wrong_length": Bad(lambda api: api.conv2d(x(), w(), t(3)), ("bias", r"\[3\]", r"\b4 elements")),
    "bias_0d": Bad(lambda api: api.conv2d(x(), w(), torch.tensor(1.0)), ("bias", r"\[\]", r"\b4 elements")),
    "transposed_bias_wrong_length": Bad(lambda api: api.conv_transpose2d(x(), t(4, 2, 3, 3), t(4)),
                                        ("bias", r"\[4\]", r"\b2 elements")),
    "bias_dtype_differs": Bad(lambda api: api.conv2d(x(), w(), t(4, dtype=torch.float64)),
                              ("bias", "float64", "float32")),
    "bias_bool": Bad(lambda api: api.conv2d(x(), w(), t(4, dtype=torch.bool)), ("bias", "bool", "float32")),
    # torch.ops.aten.convolution on the CPU quietly accepts a float64 bias for float32 tensors
    "aten_bias_dtype_differs": Bad(lambda api: conv(api, bias=t(4, dtype=torch.float64)),
                                   ("bias", "float64", "float32"), torch_accepts=True),

    # ---- dtypes: input and weight differ; unsupported dtypes
    "weight_dtype_differs": Bad(lambda api: api.conv2d(x(), w().double()), ("weight", "float64", "float32")),
    "input_bf16_weight_f32": Bad(lambda api: api.conv2d(x().bfloat16(), w()), ("weight", "bfloat16", "float32")),
    "aten_grad_output_dtype_differs": Bad(lambda api: conv_bwd(api, grad_output=gy().double()),
                                          ("grad_output", "float64", "float32")),
    "bool": Bad(lambda api: api.conv2d(x().bool(), w().bool()), ("bool",), UNSUPPORTED_DTYPE),
    # ATen's CPU convolution computes integer and complex convolutions; convgen does not (CASES.md)
    "int32": Bad(lambda api: api.conv2d(x().int(), w().int()), ("int32",), UNSUPPORTED_DTYPE, torch_accepts=True),
    "int64": Bad(lambda api: api.conv2d(x().long(), w().long()), ("int64",), UNSUPPORTED_DTYPE, torch_accepts=True),
    "complex64": Bad(lambda api: api.conv2d(x().to(torch.complex64), w().to(torch.complex64)), ("complex64",),
                     UNSUPPORTED_DTYPE, torch_accepts=True),
    "aten_int32": Bad(lambda api: conv(api, input=x().int(), weight=w().int()), ("int32",), UNSUPPORTED_DTYPE,
                      torch_accepts=True),
    "aten_backward_int64": Bad(lambda api: conv_bwd(api, grad_output=gy().long(), input=x().long(),
                                                    weight=w().long()), ("int64",), UNSUPPORTED_DTYPE),
    "aten_backward_complex64": Bad(lambda api: conv_bwd(api, grad_output=gy().to(torch.complex64),
                                                        input=x().to(torch.complex64), weight=w().to(torch.complex64)),
                                   ("complex64",), UNSUPPORTED_DTYPE),

    # ---- devices: the meta device (ATen computes shapes there; convgen has no kernel for it)
    "meta_input": Bad(lambda api: api.conv2d(x().to("meta"), w()), ("input", "meta"), torch_accepts=True),
    "meta_all": Bad(lambda api: api.conv2d(x().to("meta"), w().to("meta"), t(4, device="meta")), ("meta",),
                    torch_accepts=True),
    "meta_bias": Bad(lambda api: api.conv2d(x(), w(), t(4, device="meta")), ("bias", "meta"), torch_accepts=True),
    "aten_meta": Bad(lambda api: conv(api, input=x().to("meta"), weight=w().to("meta")), ("meta",),
                     torch_accepts=True),
    "aten_backward_meta": Bad(lambda api: conv_bwd(api, grad_output=gy().to("meta"), input=x().to("meta"),
                                                   weight=w().to("meta")), ("meta",), torch_accepts=True),
    "aten_backward_meta_grad_output": Bad(lambda api: conv_bwd(api, grad_output=gy().to("meta")),
                                          ("grad_output", "meta"), torch_accepts=True),

    # ---- empty spatial dimensions (zero batch and zero channels are valid, see test_zero_batch_...)
    "empty_spatial": Bad(lambda api: api.conv2d(t(1, 4, 0, 8), w()), ("input", r"\[1, 4, 0, 8\]")),
    "empty_spatial_padded": Bad(lambda api: api.conv2d(t(1, 4, 0, 8), w(), padding=2), ("input", r"\[1, 4, 0, 8\]")),
    "empty_spatial_1d": Bad(lambda api: api.conv1d(t(1, 4, 0), t(4, 4, 1)), ("input", r"\[1, 4, 0\]")),
    "empty_spatial_transposed": Bad(lambda api: api.conv_transpose2d(t(1, 4, 8, 0), w()), ("input", r"\[1, 4, 8, 0\]")),
    # with a zero batch ATen's transposed convolution returns an empty result; CASES.md refuses any empty spatial dim
    "empty_spatial_transposed_zero_batch": Bad(lambda api: api.conv_transpose2d(t(0, 4, 0, 8), w()),
                                               ("input", r"\[0, 4, 0, 8\]"), torch_accepts=True),

    # ---- transposed: output_padding negative or not smaller than stride or dilation; output size < 1
    "output_padding_ge_stride_and_dilation": Bad(lambda api: api.conv_transpose2d(x(), w(), stride=2, output_padding=2),
                                                 (said("output_padding", "[2, 2]"), said("stride", "[2, 2]"),
                                                  said("dilation", "[1, 1]"))),
    "output_padding_eq_stride_eq_dilation": Bad(lambda api: api.conv_transpose1d(t(1, 4, 8), t(4, 4, 3), output_padding=1),
                                                (said("output_padding", "[1]"), said("stride", "[1]"))),
    "output_padding_ge_one_axis": Bad(lambda api: api.conv_transpose2d(x(), w(), stride=[2, 1], output_padding=[0, 1]),
                                      (said("output_padding", "[0, 1]"), said("stride", "[2, 1]"))),
    "output_padding_negative": Bad(lambda api: api.conv_transpose2d(x(), w(), stride=2, output_padding=[1, -1]),
                                   (said("output_padding", "[1, -1]"),)),
    "aten_output_padding_ge_stride": Bad(lambda api: conv(api, transposed=True, stride=(2, 2), dilation=(2, 1),
                                                          output_padding=(2, 0)),
                                         (said("output_padding", "[2, 0]"), said("stride", "[2, 2]"),
                                          said("dilation", "[2, 1]"))),
    "transposed_output_below_1": Bad(lambda api: api.conv_transpose2d(t(1, 4, 1, 1), w(), padding=2),
                                     (r"(?i)output size", r"-1", r"padding")),
    # ATen's message here is "only one dimension can be inferred"
    "transposed_output_below_1_zero_batch": Bad(lambda api: api.conv_transpose2d(t(0, 4, 1, 1), w(), padding=2),
                                                (r"(?i)output size", r"-1")),
    "transposed_output_0_3d": Bad(lambda api: api.conv_transpose3d(t(1, 2, 2, 2, 2), t(2, 2, 1, 1, 1), padding=[0, 1, 0]),
                                  (r"(?i)output size", r"\b0\b")),

    # ---- backward only: grad_output rank, grad_output shape, output_padding of a normal convolution
    "grad_output_rank_3": Bad(lambda api: conv_bwd(api, grad_output=t(1, 4, 6)), ("grad_output", r"\[1, 4, 6\]")),
    "grad_output_rank_5": Bad(lambda api: conv_bwd(api, grad_output=t(1, 4, 6, 6, 1)),
                              ("grad_output", r"\[1, 4, 6, 6, 1\]")),
    "grad_output_spatial_differs": Bad(lambda api: conv_bwd(api, grad_output=t(1, 4, 5, 6)),
                                       ("grad_output", r"\[1, 4, 6, 6\]", r"\[1, 4, 5, 6\]")),
    "grad_output_too_large": Bad(lambda api: conv_bwd(api, grad_output=t(1, 4, 7, 7)),
                                 ("grad_output", r"\[1, 4, 6, 6\]", r"\[1, 4, 7, 7\]")),
    "grad_output_channels_differ": Bad(lambda api: conv_bwd(api, grad_output=t(1, 3, 6, 6)),
                                       ("grad_output", r"\[1, 4, 6, 6\]", r"\[1, 3, 6, 6\]")),
    # ATen computes something with a grad_output of another batch size and says nothing
    "grad_output_batch_differs": Bad(lambda api: conv_bwd(api, grad_output=t(2, 4, 6, 6)),
                                     ("grad_output", r"\[1, 4, 6, 6\]", r"\[2, 4, 6, 6\]"), torch_accepts=True),
    "grad_output_transposed_differs": Bad(lambda api: conv_bwd(api, grad_output=t(1, 4, 9, 9), transposed=True),
                                          ("grad_output", r"\[1, 4, 10, 10\]", r"\[1, 4, 9, 9\]")),
    "backward_output_padding_not_transposed": Bad(lambda api: conv_bwd(api, output_padding=(1, 1)),
                                                  (said("output_padding", "[1, 1]"), "transposed")),
    "backward_output_padding_not_transposed_strided": Bad(
        lambda api: conv_bwd(api, grad_output=t(1, 4, 3, 3), stride=(2, 2), output_padding=(0, 1)),
        (said("output_padding", "[0, 1]"), "transposed")),
    # ATen's forward ignores output_padding when transposed=False; convgen refuses it in both passes,
    # so that no forward succeeds whose backward would then fail
    "forward_output_padding_not_transposed": Bad(lambda api: conv(api, output_padding=(1, 1)),
                                                 (said("output_padding", "[1, 1]"), "transposed"), torch_accepts=True),
    "backward_stride_0": Bad(lambda api: conv_bwd(api, stride=(0, 0)), (said("stride", "[0, 0]"),)),
    "backward_groups_0": Bad(lambda api: conv_bwd(api, groups=0), (said("groups", "0"),)),
    "backward_channels_differ": Bad(lambda api: conv_bwd(api, weight=t(4, 2, 3, 3)),
                                    (r"\[4, 2, 3, 3\]", r"\b2 channels", r"\b4 channels")),
    "backward_output_padding_ge_stride": Bad(lambda api: conv_bwd(api, grad_output=t(1, 4, 12, 12), transposed=True,
                                                                  output_padding=(2, 2)),
                                             (said("output_padding", "[2, 2]"), said("stride", "[1, 1]"))),
    "backward_output_mask_2_values": Bad(lambda api: conv_bwd(api, output_mask=(True, True)),
                                         ("output_mask", r"\[True, True\]")),

    # ---- layouts other than strided (not in CASES.md's list, but "never a crash")
    "sparse_input": Bad(lambda api: api.conv2d(x().to_sparse(), w()), ("input", "(?i)sparse")),
}


def _params(for_convgen: bool):
    params = []
    for name, case in CASES.items():
        marks = ()
        if for_convgen and case.bug:
            marks = pytest.mark.xfail(strict=True, reason=f"bug: {case.bug}")
        params.append(pytest.param(case, id=name, marks=marks))
    return params


@pytest.mark.parametrize("case", _params(for_convgen=True))
def test_convgen_refuses_before_building(case):
    before = convgen.stats()
    with pytest.raises(case.error) as info:
        case.call(convgen)
    message = str(info.value)
    for pattern in case.says:
        assert re.search(pattern, message), f"the message does not match {pattern!r}: {message!r}"
    after = convgen.stats()
    assert (after["builds"], after["ninja_runs"], after["build_failures"]) == \
        (before["builds"], before["ninja_runs"], before["build_failures"]), "refused only after building"


@pytest.mark.parametrize("case", _params(for_convgen=False))
def test_torch_agrees(case):
    """The rule is ATen's: torch refuses the same call, except where CASES.md asks more of convgen."""
    if case.torch_accepts:
        case.call(TORCH)   # the comment at the case says why convgen refuses anyway
    else:
        with pytest.raises(Exception):
            case.call(TORCH)


def test_spec_errors_are_value_errors():
    assert issubclass(convgen.ConvSpecError, ValueError)
    assert issubclass(convgen.ConvSpecError, convgen.ConvgenError)
    with pytest.raises(ValueError):
        convgen.conv2d(x(), w(), stride=0)


def test_build_counter_sees_a_valid_call():
    """The counters checked above do move for a valid call (a shape no other test uses), so
    'unchanged' in test_convgen_refuses_before_building means nothing was built."""
    before = convgen.stats()
    convgen.conv2d(t(1, 3, 7, 5), t(5, 3, 2, 3), stride=(2, 1))
    after = convgen.stats()
    found = sum(after[k] - before[k] for k in ("builds", "disk_hits", "memory_hits"))
    assert found >= 1


@pytest.mark.parametrize("input_shape, weight_shape, groups", [
    ((0, 6, 7, 8), (12, 2, 3, 3), 3),    # zero batch
    ((2, 0, 7, 8), (12, 0, 3, 3), 3),    # zero channels
    ((0, 0, 7, 8), (12, 0, 3, 3), 3),    # both
])
def test_zero_batch_and_zero_channels_are_not_bad_inputs(input_shape, weight_shape, groups):
    """The boundary of "empty spatial dimension": empty batch or channels are valid (CASES.md 15)."""
    xx, ww = t(*input_shape), t(*weight_shape)
    out = convgen.conv2d(xx, ww, groups=groups)
    assert out.shape == torch.nn.functional.conv2d(xx, ww, groups=groups).shape
