"""torch.nn.functional-style convolutions backed by convgen, differentiable through autograd.

The convolution F(x, w) is bilinear, and its two backward maps are convolutions too: the data
gradient D(gy, w) is F's adjoint in x, the weight gradient W(gy, x) its adjoint in w. So each of
the three is an autograd Function whose backward is made of the other two, and gradients of any
order (create_graph=True, gradient penalties, gradgradcheck) come from generated kernels:

    F(x, w):   dx = D(g, w)         dw = W(g, x)
    D(gy, w):  dgy = F(g, w)        dw = W(gy, g)
    W(gy, x):  dgy = F(x, g)        dx = D(gy, g)

For first-order gradients (no graph to build) the forward's backward makes one
convolution_backward call that asks only for the gradients autograd needs, with the bias
gradient fused into the weight gradient's pass.
"""

from __future__ import annotations

import torch

from . import ops
from .codegen.errors import ConvSpecError


def _bias_sizes(weight, transposed, groups) -> list[int]:
    return [weight.shape[1] * groups if transposed else weight.shape[0]]


class ConvolutionFunction(torch.autograd.Function):
    """F(x, w) + b."""

    @staticmethod
    def forward(ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        ctx.save_for_backward(input, weight)
        ctx.args = (stride, padding, dilation, transposed, output_padding, groups)
        ctx.has_bias = bias is not None
        return ops.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        args = ctx.args
        mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        if not any(mask):
            return (None,) * 9
        if torch.is_grad_enabled():
            # create_graph=True: gradients that are themselves differentiable
            grad_input = DataGradFunction.apply(grad_output, weight, input, args) if mask[0] else None
            grad_weight = WeightGradFunction.apply(grad_output, input, weight, args) if mask[1] else None
            grad_bias = grad_output.sum([0, *range(2, grad_output.dim())]) if mask[2] else None
        else:
            grad_input, grad_weight, grad_bias = ops.convolution_backward(
                grad_output, input, weight, _bias_sizes(weight, args[3], args[5]), *args, mask)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


class DataGradFunction(torch.autograd.Function):
    """D(gy, w): the data gradient, shaped like `like` (the forward's input, for shape and layout only)."""

    @staticmethod
    def forward(ctx, grad_output, weight, like, args):
        ctx.save_for_backward(grad_output, weight, like)
        ctx.args = args
        return ops.convolution_backward(grad_output, like, weight, None, *args, (True, False, False))[0]

    @staticmethod
    def backward(ctx, g):
        grad_output, weight, like = ctx.saved_tensors
        d_gy = ConvolutionFunction.apply(g, weight, None, *ctx.args) if ctx.needs_input_grad[0] else None
        d_w = WeightGradFunction.apply(grad_output, g, weight, ctx.args) if ctx.needs_input_grad[1] else None
        return d_gy, d_w, None, None


class WeightGradFunction(torch.autograd.Function):
    """W(gy, x): the weight gradient, shaped like `like` (the forward's weight, for shape and layout only)."""

    @staticmethod
    def forward(ctx, grad_output, input, like, args):
        ctx.save_for_backward(grad_output, input, like)
        ctx.args = args
        return ops.convolution_backward(grad_output, input, like, None, *args, (False, True, False))[1]

    @staticmethod
    def backward(ctx, g):
        grad_output, input, like = ctx.saved_tensors
        d_gy = ConvolutionFunction.apply(input, g, None, *ctx.args) if ctx.needs_input_grad[0] else None
        d_x = DataGradFunction.apply(grad_output, g, input, ctx.args) if ctx.needs_input_grad[1] else None
        return d_gy, d_x, None, None


def _needs(t) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Differentiable ATen-style convolution (same argument order as torch.ops.aten.convolution).

    When autograd will need gradients, the backward kernels are built together with the forward
    one, in one ninja run, before the forward runs.
    """
    mask = (_needs(input), _needs(weight), _needs(bias))
    if torch.is_grad_enabled() and any(mask):
        ops.prepare_call(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, mask)
    return ConvolutionFunction.apply(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                     groups)


def _batchify(input, weight, rank: int, fn: str):
    if not isinstance(input, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError(f"{fn}(): input and weight must be tensors, but got {type(input).__name__} and "
                        f"{type(weight).__name__}")
    if input.dim() == rank + 1:
        return input.unsqueeze(0), True
    if input.dim() != rank + 2:
        raise ConvSpecError(f"Expected {rank + 1}D (unbatched) or {rank + 2}D (batched) input to {fn}, but got "
                            f"input of size: {list(input.shape)}")
    return input, False


def _conv(rank: int, fn: str, input, weight, bias, stride, padding, dilation, groups):
    x, unbatched = _batchify(input, weight, rank, fn)
    out = convolution(x, weight, bias, stride, padding, dilation, False, 0, groups)
    return out.squeeze(0) if unbatched else out


def _conv_transpose(rank: int, fn: str, input, weight, bias, stride, padding, output_padding, groups, dilation):
    if isinstance(padding, str):
        raise ConvSpecError(f"{fn}: padding={padding!r}: string padding is not supported for transposed "
                            f"convolutions; give the padding as integers")
    x, unbatched = _batchify(input, weight, rank, fn)
    out = convolution(x, weight, bias, stride, padding, dilation, True, output_padding, groups)
    return out.squeeze(0) if unbatched else out


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(1, "conv1d", input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(2, "conv2d", input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(3, "conv3d", input, weight, bias, stride, padding, dilation, groups)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _conv_transpose(1, "conv_transpose1d", input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _conv_transpose(2, "conv_transpose2d", input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _conv_transpose(3, "conv_transpose3d", input, weight, bias, stride, padding, output_padding, groups,
                           dilation)
