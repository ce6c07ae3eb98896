"""convgen's operators in torch's dispatcher: `torch.ops.convgen.convolution` and `convolution_backward`.

They have the schemas of `aten::convolution` and `aten::convolution_backward`, so that
torch.compile (fullgraph, any backend), torch.export, torch.jit.trace and torch dispatch modes
see one opaque op per convolution and treat it as they treat ATen's:

- the CPU and CUDA kernels are runtime/api/ops.py's `convolution` and `convolution_backward`
  (generated kernels; a CUDA tensor's are its device arch's, runtime/devices/cuda.py); `convolution_backward` returns an empty tensor (shape [0]) for each gradient that
  `output_mask` turns off, since a registered op cannot return None;
- the fake (and meta) kernels compute shapes and memory formats with convgen's own rules
  (runtime/dispatch/problem.py `base_problem`, runtime/api/ops.py `backward_problems`), never a kernel, so
  fake and real results agree on shape and strides. With static shapes they make every check the
  real call makes (a bad call fails while tracing, with the same ConvSpecError); with symbolic
  shapes they only compute the result's shape and layout, and the real call checks at run time;
- autograd: both ops are differentiable, with formulas made of the two ops themselves, so
  gradients of any order come from generated kernels. The convolution F(x, w) is bilinear and
  its backward maps are its adjoints, the data gradient D(gy, w) and the weight gradient
  W(gy, x), both computed by one convolution_backward call (plus the bias gradient, a sum of gy):

      convolution:           (dx, dw, db) = convolution_backward(g, x, w, mask)   one call, only what is needed
      convolution_backward:  d_gy = F(g_dx, w, g_db) + F(x, g_dw)
                             d_x  = D(gy, g_dw)      d_w = W(gy, g_dx)

  (g_dx, g_dw, g_db being the incoming gradients of the three results). The formulas are written
  once (`convolution_grads`, `convolution_backward_grads`) against a pair of callables, `Calls`:
  here the registered ops; runtime/api/functional.py passes its eager autograd Functions instead.

Eager calls do not go through the dispatcher (its Python autograd wrapper costs several times a
tiny convolution); runtime/api/functional.py sends a call here only when it is being traced
(its `traced`). Registration happens at import and is declarative: it builds nothing and reads no
settings.
"""

from __future__ import annotations

import functools
import operator
from typing import Callable, NamedTuple, Sequence

import torch

from . import ops
from ..codegen.ir import ConvProblem, Op
from ..dispatch.problem import DTYPES, base_problem, layout_of, memory_format, result_layout

CONVOLUTION_SCHEMA = ("convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, "
                      "SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor")
CONVOLUTION_BACKWARD_SCHEMA = (
    "convolution_backward(Tensor grad_output, Tensor input, Tensor weight, SymInt[]? bias_sizes, SymInt[] stride, "
    "SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups, "
    "bool[3] output_mask) -> (Tensor, Tensor, Tensor)")

_lib = torch.library.Library("convgen", "DEF")
_lib.define(CONVOLUTION_SCHEMA)
_lib.define(CONVOLUTION_BACKWARD_SCHEMA)

convolution = torch.ops.convgen.convolution.default
convolution_backward = torch.ops.convgen.convolution_backward.default


# ---------------------------------------------------------------------------- CPU kernels


def masked_off(like: torch.Tensor) -> torch.Tensor:
    """What convolution_backward returns for a gradient that output_mask turns off."""
    return torch.empty(0, dtype=like.dtype, device=like.device)


def _convolution_cpu(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return ops.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


def _convolution_backward_cpu(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                              output_padding, groups, output_mask):
    results = ops.convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                       output_padding, groups, output_mask)
    return tuple(masked_off(input) if r is None else r for r in results)


_lib.impl("convolution", _convolution_cpu, "CPU")
_lib.impl("convolution_backward", _convolution_backward_cpu, "CPU")
# CUDA devices (NVIDIA, or ROCm's 'cuda'): the same functions; ops.py dispatches by the tensors' device
_lib.impl("convolution", _convolution_cpu, "CUDA")
_lib.impl("convolution_backward", _convolution_backward_cpu, "CUDA")


# ---------------------------------------------------------------------------- fake kernels


def _static(tensors: Sequence[torch.Tensor], lists: Sequence[Sequence], groups) -> bool:
    """No symbolic size anywhere: every size, list element and `groups` is a plain int."""
    ints = [s for t in tensors for s in t.shape] + [v for value in lists for v in value] + [groups]
    return all(type(v) is int for v in ints)


def _expand(value: Sequence, rank: int) -> tuple:
    value = tuple(value)
    return value * rank if len(value) == 1 else value


def _symbolic_problem(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                      groups) -> ConvProblem:
    """The forward problem with symbolic sizes: shapes and layouts only (the real call checks)."""
    rank = input.dim() - 2
    stride, padding, dilation, output_padding = (_expand(v, rank) for v in (stride, padding, dilation,
                                                                             output_padding))
    k = weight.shape[1] * groups if transposed else weight.shape[0]
    pairs = tuple((p, p) for p in padding)
    return ConvProblem(op=Op.FWD, n=input.shape[0], c=input.shape[1], k=k, in_size=tuple(input.shape[2:]),
                       kernel=tuple(weight.shape[2:]), stride=stride, padding=pairs,
                       dilation=dilation, groups=groups, transposed=transposed, output_padding=output_padding,
                       dtype=DTYPES[input.dtype], input_layout=layout_of(input), weight_layout=layout_of(weight),
                       output_layout=result_layout(input, weight, stride, pairs, dilation, groups, transposed,
                                                   output_padding),
                       bias=bias is not None)


def _forward_problem(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                     groups) -> ConvProblem:
    args = (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if _static((input, weight), (stride, padding, dilation, output_padding), groups):
        return base_problem(*args)
    return _symbolic_problem(*args)


def _fake_empty(shape, like: torch.Tensor, layout) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=memory_format(layout, len(shape)))


def _convolution_fake(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    p = _forward_problem(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    return _fake_empty(p.output_shape, input, p.output_layout)


def _convolution_backward_fake(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                               output_padding, groups, output_mask):
    if _static((grad_output, input, weight), (stride, padding, dilation, output_padding), groups):
        base, mask, problems = ops.checked_backward_problems(grad_output, input, weight, stride, padding, dilation,
                                                             transposed, output_padding, groups, output_mask)
    else:
        mask = tuple(bool(m) for m in output_mask)
        base = _symbolic_problem(input, weight, None, stride, padding, dilation, transposed, output_padding, groups)
        problems = ops.backward_problems(base, layout_of(grad_output), mask)
    grad_input, grad_weight, grad_bias = (masked_off(input) for _ in range(3))
    if "grad_input" in problems:
        p = problems["grad_input"]
        grad_input = _fake_empty(p.input_shape, input, p.input_layout)
    if "grad_weight" in problems:
        p = problems["grad_weight"]
        grad_weight = _fake_empty(p.weight_shape, weight, p.weight_layout)
    if mask[2]:
        grad_bias = input.new_empty(ops.grad_bias_size(base, input, bias_sizes))
    return grad_input, grad_weight, grad_bias


torch.library.register_fake("convgen::convolution", _convolution_fake, lib=_lib)
torch.library.register_fake("convgen::convolution_backward", _convolution_backward_fake, lib=_lib)


# ---------------------------------------------------------------------------- gradient formulas


class Calls(NamedTuple):
    """The two convolutions the gradient formulas call, with the registered ops' contract
    (convolution_backward gives an empty tensor where masked off)."""
    convolution: Callable
    convolution_backward: Callable


def bias_sizes(weight: torch.Tensor, transposed: bool, groups) -> list:
    """The bias size of a convolution: its output channels."""
    return [weight.shape[1] * groups if transposed else weight.shape[0]]


def convolution_grads(calls: Calls, grad_output, input, weight, args: tuple, mask: Sequence[bool]):
    """(dx, dw, db) of convolution(input, weight, bias, *args): one convolution_backward call that
    asks only for `mask`; None where masked off. `args` = (stride, padding, dilation, transposed,
    output_padding, groups)."""
    mask = [bool(m) for m in mask]
    if not any(mask):
        return None, None, None
    results = calls.convolution_backward(grad_output, input, weight, bias_sizes(weight, args[3], args[5]), *args,
                                         mask)
    return tuple(r if m else None for r, m in zip(results, mask))


def convolution_backward_grads(calls: Calls, grad_output, input, weight, args: tuple, mask: Sequence[bool],
                               grads: Sequence[torch.Tensor | None], needs: Sequence[bool]):
    """(d_grad_output, d_input, d_weight) of convolution_backward(grad_output, input, weight, ...,
    mask), given the incoming gradients `grads` of its three results; None where not needed or zero."""
    g_dx, g_dw, g_db = (g if m and g is not None else None for g, m in zip(grads, mask))
    d_gy = d_x = d_w = None
    if needs[0]:
        terms = []
        if g_dx is not None:
            terms.append(calls.convolution(g_dx, weight, g_db, *args))
            g_db = None
        if g_dw is not None:
            terms.append(calls.convolution(input, g_dw, g_db, *args))
            g_db = None
        if g_db is not None:
            terms.append(g_db.view(1, -1, *[1] * (grad_output.dim() - 2)).expand(grad_output.shape))
        d_gy = functools.reduce(operator.add, terms) if terms else None
    if needs[1] and g_dw is not None:
        d_x = calls.convolution_backward(grad_output, input, g_dw, None, *args, [True, False, False])[0]
    if needs[2] and g_dx is not None:
        d_w = calls.convolution_backward(grad_output, g_dx, weight, None, *args, [False, True, False])[1]
    return d_gy, d_x, d_w


REGISTERED = Calls(convolution, convolution_backward)


# ---------------------------------------------------------------------------- autograd of the ops


def _convolution_setup(ctx, inputs, output):
    input, weight, bias, *args = inputs
    ctx.save_for_backward(input, weight)
    ctx.args = tuple(args)
    ctx.has_bias = bias is not None
    ctx.set_materialize_grads(False)


def _convolution_autograd(ctx, grad_output):
    input, weight = ctx.saved_tensors
    needs = ctx.needs_input_grad
    mask = (needs[0], needs[1], ctx.has_bias and needs[2])
    if grad_output is None:
        return (None,) * 9
    return (*convolution_grads(REGISTERED, grad_output, input, weight, ctx.args, mask), *(None,) * 6)


def _convolution_backward_setup(ctx, inputs, output):
    grad_output, input, weight, _bias_sizes, *args, output_mask = inputs
    ctx.save_for_backward(grad_output, input, weight)
    ctx.args = tuple(args)
    ctx.mask = tuple(bool(m) for m in output_mask)
    ctx.set_materialize_grads(False)


def _convolution_backward_autograd(ctx, g_dx, g_dw, g_db):
    grad_output, input, weight = ctx.saved_tensors
    grads = convolution_backward_grads(REGISTERED, grad_output, input, weight, ctx.args, ctx.mask,
                                       (g_dx, g_dw, g_db), ctx.needs_input_grad[:3])
    return (*grads, *(None,) * 8)


torch.library.register_autograd("convgen::convolution", _convolution_autograd, setup_context=_convolution_setup,
                                lib=_lib)
torch.library.register_autograd("convgen::convolution_backward", _convolution_backward_autograd,
                                setup_context=_convolution_backward_setup, lib=_lib)
