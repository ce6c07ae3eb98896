"""torch.nn.functional-style convolutions backed by convgen, differentiable through autograd.

Every public function takes one of two paths to the same kernels (runtime/api/ops.py):

- traced (torch.compile, torch.export, torch.jit.trace, make_fx, fake tensors, dispatch modes;
  see `traced`): the registered ops `torch.ops.convgen.convolution` and
  `convolution_backward` (runtime/api/library.py), which carry their own fake kernels and autograd.
  The ops take ATen's arguments, so string padding is resolved to integers first; an
  asymmetric 'same' padding (an even kernel) becomes its symmetric part plus zeros appended to
  the input, as torch's own 'same' does;
- eager (everything else): straight to runtime/api/ops.py, without the dispatcher's Python autograd
  wrapper (which costs several times a tiny convolution). When nothing needs a gradient the call
  records no autograd node at all; otherwise two autograd Functions mirror the registered ops
  and use the very same gradient formulas (library.convolution_grads and
  convolution_backward_grads): the first-order backward is one convolution_backward call that
  asks only for the gradients autograd needs, and since convolution_backward is itself
  differentiable, gradients of any order (create_graph=True, gradgradcheck) come from generated
  kernels. When autograd will need gradients, the backward kernels are built together with the
  forward one, in one ninja run, before the forward runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import eager, library, ops
from ..codegen.errors import ConvSpecError
from ..dispatch.problem import expand_param, layout_of, memory_format, padding_pairs


# ---------------------------------------------------------------------------- when to dispatch

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def traced(*tensors: torch.Tensor | None) -> bool:
    """Whether a call on `tensors` is being traced or transformed rather than simply run:
    torch.compile (dynamo), torch.export, make_fx, fake tensors, a torch dispatch mode,
    torch.jit.trace (integer padding only), a tensor subclass. Such a call must go through the
    registered ops. So do the wrapped tensors of torch.func transforms, which have no memory of
    their own for a kernel to read: the dispatcher then reports what the transform lacks
    (convgen's ops have no vmap rule, and functorch's grad does not take autograd formulas
    registered this way) instead of a kernel reading garbage."""
    if torch.compiler.is_compiling():
        return True
    if torch._C._len_torch_dispatch_stack() or torch._C._get_tracing_state() is not None:
        return True
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or torch._C._functorch.is_functorch_wrapped_tensor(t)):
            return True
    return False


# ---------------------------------------------------------------------------- the eager path


class ConvolutionFunction(torch.autograd.Function):
    """convolution(input, weight, bias, *forward.args) on the eager path (as
    torch.ops.convgen.convolution), where `forward` is the call's ops.Forward."""

    @staticmethod
    def forward(ctx, input, weight, bias, forward):
        ctx.save_for_backward(input, weight)
        ctx.forward = forward
        ctx.set_materialize_grads(False)
        return forward.run(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        if grad_output is None:
            return None, None, None, None
        input, weight = ctx.saved_tensors
        return (*forward_grads(ctx.forward, grad_output, input, weight, ctx.needs_input_grad[:3]), None)


def forward_grads(forward, grad_output, input, weight, needs):
    """The gradients of an eager forward call (its ops.Forward) that autograd needs (`needs`: of
    input, weight, bias), None for the others: the registered op's formula, for this module's
    autograd Function and the eager launcher's node (runtime/api/eager.py) alike."""
    mask = (needs[0], needs[1], forward.has_bias and needs[2])
    return library.convolution_grads(EAGER, grad_output, input, weight, forward.args, mask)


eager.set_gradients(forward_grads)   # the launcher's nodes (api/eager.py) call it for their gradients


class ConvolutionBackwardFunction(torch.autograd.Function):
    """convolution_backward on the eager path (as torch.ops.convgen.convolution_backward: an
    empty tensor where `output_mask` is off), differentiable in grad_output, input and weight."""

    @staticmethod
    def forward(ctx, grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                groups, output_mask):
        results = ops.convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                           transposed, output_padding, groups, output_mask)
        ctx.save_for_backward(grad_output, input, weight)
        ctx.args = (stride, padding, dilation, transposed, output_padding, groups)
        ctx.mask = tuple(bool(m) for m in output_mask)
        ctx.set_materialize_grads(False)
        results = tuple(library.masked_off(input) if r is None else r for r in results)
        ctx.mark_non_differentiable(*(r for r, m in zip(results, ctx.mask) if not m))
        return results

    @staticmethod
    def backward(ctx, g_dx, g_dw, g_db):
        grad_output, input, weight = ctx.saved_tensors
        grads = library.convolution_backward_grads(EAGER, grad_output, input, weight, ctx.args, ctx.mask,
                                                   (g_dx, g_dw, g_db), ctx.needs_input_grad[:3])
        return (*grads, *(None,) * 8)


def _apply(function: type[torch.autograd.Function], *args):
    """`function.apply(*args)` on the eager path. Function.apply first walks its arguments as a
    pytree to unwrap dead functorch wrappers, which costs about half a tiny convolution; eager
    calls have no functorch-wrapped tensors (traced() sends those to the registered ops), so
    unless a functorch transform is active this goes straight to autograd's own apply."""
    if torch._C._are_functorch_transforms_active():
        return function.apply(*args)
    return super(torch.autograd.Function, function).apply(*args)


def _eager_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """convolution on the eager path: an autograd node only where a gradient is needed. When one
    is, the backward's kernels are built with the forward's, in one ninja run."""
    mask = (_needs(input), _needs(weight), _needs(bias))
    if torch.is_grad_enabled() and any(mask):
        forward = ops.forward(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                              mask)
        output = forward.record(input, weight, bias)
        if output is NotImplemented:
            output = _apply(ConvolutionFunction, input, weight, bias, forward)
        return output
    return ops.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


def _eager_convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                output_padding, groups, output_mask):
    """convolution_backward on the eager path, with the registered op's results (an empty tensor
    where `output_mask` is off); an autograd node only where a gradient is needed."""
    args = (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
            output_mask)
    if torch.is_grad_enabled() and any(_needs(t) for t in (grad_output, input, weight)):
        return _apply(ConvolutionBackwardFunction, *args)
    return tuple(library.masked_off(input) if r is None else r for r in ops.convolution_backward(*args))


EAGER = library.Calls(_eager_convolution, _eager_convolution_backward)


def _needs(t) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


# ---------------------------------------------------------------------------- the traced path


def _aten_args(input, weight, stride, padding, dilation, transposed, output_padding):
    """ATen-style arguments as the registered ops take them: (input, stride, padding, dilation,
    output_padding, extra), lists of ints. A string padding is resolved; where 'same' pads more
    on the high side (`extra` per axis), the input gets those zeros appended and the padding is
    the symmetric rest. Bad values raise here or in the op's fake kernel, with convgen's messages."""
    rank = max(weight.dim() - 2, 1)
    stride = list(expand_param("stride", stride, rank))
    dilation = list(expand_param("dilation", dilation, rank))
    output_padding = list(expand_param("output_padding", output_padding, rank))
    if not isinstance(padding, str):
        return input, stride, list(expand_param("padding", padding, rank)), dilation, output_padding, None
    pairs = padding_pairs(padding, rank, tuple(weight.shape[2:]), tuple(stride), tuple(dilation), transposed)
    extra = [high - low for low, high in pairs]
    if any(extra):
        input = F.pad(input, [p for e in reversed(extra) for p in (0, e)])
    return input, stride, [low for low, _ in pairs], dilation, output_padding, extra if any(extra) else None


def _traced_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    input, stride, padding, dilation, output_padding, _ = _aten_args(input, weight, stride, padding, dilation,
                                                                     transposed, output_padding)
    return library.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


def _traced_convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                 output_padding, groups, output_mask):
    size = input.shape
    input, stride, padding, dilation, output_padding, extra = _aten_args(input, weight, stride, padding, dilation,
                                                                         transposed, output_padding)
    mask = [bool(m) for m in output_mask]
    results = library.convolution_backward(grad_output, input, weight, None if bias_sizes is None else list(bias_sizes),
                                           stride, padding, dilation, transposed, output_padding, groups, mask)
    grad_input = results[0]
    if extra is not None and mask[0]:   # the gradient of the appended zeros is not the input's
        for axis, e in enumerate(extra):
            if e:
                grad_input = grad_input.narrow(axis + 2, 0, size[axis + 2])
        grad_input = grad_input.contiguous(memory_format=memory_format(layout_of(results[0]), grad_input.dim()))
    return tuple(r if m else None for r, m in zip((grad_input, *results[1:]), mask))


# ---------------------------------------------------------------------------- the public functions


def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Differentiable ATen-style convolution (same argument order as torch.ops.aten.convolution);
    `padding` may also be 'same' or 'valid'."""
    if traced(input, weight, bias):
        return _traced_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                   groups)
    return _eager_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    """torch.ops.aten.convolution_backward's (grad_input, grad_weight, grad_bias), None where
    `output_mask` is off; differentiable in grad_output, input and weight (as ATen's)."""
    args = (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
            output_mask)
    if traced(grad_output, input, weight):
        return _traced_convolution_backward(*args)
    results = _eager_convolution_backward(*args)
    return tuple(r if m else None for r, m in zip(results, output_mask))


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
