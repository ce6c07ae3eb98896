"""ATen-style entry points: `convolution` and `convolution_backward`, same arguments as torch.ops.aten.

Each call becomes one ConvProblem per pass, all kernels still missing are built in one ninja
run, the operands are made dense in the layouts the plan asks for, and the results come back in
the memory format torch's CPU convolution would give.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

from .. import knobs
from ..devices import cpu
from ..dispatch import dispatch
from . import eager
from ..stats import bump
from ..codegen.errors import ConvSpecError
from ..codegen.ir import ConvProblem, Layout, Op
from ..dispatch.problem import base_problem, check_tensors, layout_of, memory_format


def dense(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """`t` dense in `layout` (a no-op when it already is)."""
    fmt = memory_format(layout, t.dim())
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


def _empty(shape, dtype, layout: Layout, device=None) -> torch.Tensor:
    """A result tensor (on the CPU, a large one on huge pages where the system offers them)."""
    out = torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format(layout, len(shape)))
    return cpu.advise_huge_pages(out) if device is None else out


# Below this many multiply-adds a call runs on one thread: waking a second one costs more.
SERIAL_MACS = 1 << 18


def _threads(problem: ConvProblem, n: int) -> int:
    macs = problem.macs // problem.n * n if problem.n else 0
    return 1 if macs < SERIAL_MACS else torch.get_num_threads()


def _run(entry: dispatch.Entry, tensors: dict, n: int, threads: int | None = None) -> None:
    """Run one plan: its kernel, or for an 'empty' plan the zeros (plus bias) it stands for."""
    if entry.kernel is not None:
        entry.kernel(tensors, n, _threads(entry.plan.problem, n) if threads is None else threads)
        return
    for role in ("output", "grad_input", "grad_weight", "grad_bias"):
        t = tensors.get(role)
        if t is not None:
            t.zero_()
    out, bias = tensors.get("output"), tensors.get("bias")
    if out is not None and bias is not None and out.numel():
        out.add_(bias.view(1, -1, *([1] * (out.dim() - 2))))


def _prepare(problems: list[ConvProblem], input: torch.Tensor) -> list[dispatch.Entry]:
    """dispatch.prepare for the device of `input` (the CPU's call keeps its one-argument form)."""
    return dispatch.prepare(problems) if input.is_cpu else dispatch.prepare(problems, input.device)


_SEQUENCES = (list, tuple, torch.Size)


def _signature(tensors, args) -> tuple | None:
    """Everything about a call that its problems depend on, cheap to compute and hashable; None
    for a call too odd to memoize (it takes the full path, which reports what is wrong).
    Arguments are frozen one level deep (lists of ints); deeper nesting does not hash: None.
    A tensor counts by type, dtype, device, layout, shape and strides: a call on a device or
    layout convgen does not serve is refused before it could be remembered. CONVGEN_SIM counts
    too (a simulated GPU kernel is another kernel), and torch's tf32 switch (an f32 problem on a
    GPU target, simulated or a device, is a tf32 one while torch.backends.cudnn.allow_tf32 is True)."""
    try:
        signature = (torch.get_num_threads(), knobs.sim(), bool(torch.backends.cudnn.allow_tf32),
                     *[tuple(a) if type(a) in _SEQUENCES else a for a in args],
                     *[None if t is None else (type(t), t.dtype, t.device, t.layout, t.shape, t.stride())
                       for t in tensors])
        hash(signature)
        return signature
    except (TypeError, AttributeError, RuntimeError):
        return None


# Calls seen before, by signature: their validated problems and dispatch entries. Bounded.
_calls: dict[tuple, tuple] = {}
MAX_CALLS = 4096


def forget_calls() -> None:
    """Forget the remembered calls, so the next of each decides again (after CONVGEN_LAUNCHER
    changes, or a launcher is built, in the same process)."""
    _calls.clear()


dispatch.tiers.on_swap(forget_calls)   # a remembered call holds the kernel it was bound to


def _remember(signature: tuple, value: tuple) -> tuple:
    if len(_calls) >= MAX_CALLS:
        _calls.clear()
    _calls[signature] = value
    return value


class Forward:
    """The decisions of one forward call signature, made once: its problem, kernel, output and
    conversions. `run(input, weight, bias)` computes the convolution of tensors of that signature;
    `args` are the call's (stride, padding, dilation, transposed, output_padding, groups)."""

    def __init__(self, input, weight, bias, args: tuple):
        self.args = args
        self.has_bias = bias is not None
        self.problem = p = base_problem(input, weight, bias, *args)
        self._device = device = None if input.is_cpu else input.device
        self._entry = dispatch.kernel_for(p) if device is None else dispatch.kernel_for(p, device)
        self._output = (p.output_shape, input.dtype, memory_format(p.output_layout, input.dim()))
        self._threads = _threads(p, p.n)
        # the signature fixes shapes and strides, so whether an operand needs converting does not change
        self._formats = tuple(None if t is None or t.is_contiguous(memory_format=f) else f for t, f in
                              ((input, memory_format(p.input_layout, input.dim())),
                               (weight, memory_format(p.weight_layout, weight.dim())),
                               (bias, torch.contiguous_format)))
        kernel = self._entry.kernel
        self._launcher = self._call = None
        if kernel is None:
            self._kernel = None
        else:
            roles = ("input", "weight", "bias", "output")
            live = [role for role, t in (("input", input), ("weight", weight), ("bias", bias)) if t is not None
                    and t.numel()]
            if math.prod(p.output_shape):
                live.append("output")
            self._kernel = kernel.bind(roles, live, p.n, self._threads)
            bound = None if device is not None else eager.bind(self, kernel, roles, live, *self._output,
                                                               self._formats)
            if bound is not None:
                self._launcher, self._call = bound

    def record(self, input, weight, bias):
        """The convolution with its autograd node recorded by the eager launcher (runtime/api/eager.py);
        NotImplemented without the launcher, or where the Python autograd Function must decide."""
        if self._call is None:
            return NotImplemented
        return self._launcher.run(self._call, input, weight, bias, True)

    def run(self, input, weight, bias) -> torch.Tensor:
        if self._call is not None:
            return self._launcher.run(self._call, input, weight, bias, False)
        shape, dtype, fmt = self._output
        out = torch.empty(shape, dtype=dtype, device=self._device, memory_format=fmt)
        if self._device is None:
            cpu.advise_huge_pages(out)
        f_input, f_weight, f_bias = self._formats
        if f_input is not None:
            input = input.contiguous(memory_format=f_input)
        if f_weight is not None:
            weight = weight.contiguous(memory_format=f_weight)
        if f_bias is not None:
            bias = bias.contiguous()
        if self._kernel is not None:
            self._kernel(input, weight, bias, out)
        else:   # an 'empty' plan, or an entry whose kernel was loaded after this Forward was made
            _run(self._entry, {"input": input, "weight": weight, "bias": bias, "output": out}, self.problem.n,
                 self._threads)
        return out


def forward(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
            prepare=None) -> Forward:
    """The Forward of a convolution call, memoized by the call's signature. With `prepare` (an
    output_mask), the kernels of the backward with that mask are built too, in the same ninja
    run as the forward's."""
    args = (stride, padding, dilation, transposed, output_padding, groups)
    signature = _signature((input, weight, bias), ("fwd", *args, prepare))
    known = _calls.get(signature) if signature is not None else None
    if known is not None:
        bump("memory_hits")
        return known
    if prepare is not None:
        _prepare(call_problems(input, weight, bias, *args, output_mask=prepare), input)
    known = Forward(input, weight, bias, args)
    if signature is not None:
        _remember(signature, known)
    return known


def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """torch.ops.aten.convolution computed by generated kernels. `padding` may also be 'same'/'valid'."""
    return forward(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                   groups).run(input, weight, bias)


def backward_problems(base: ConvProblem, grad_layout: Layout, output_mask: Sequence[bool]) -> dict[str, ConvProblem]:
    """The problems one convolution_backward call needs, by the gradient they produce.

    Produced gradients take the layout of torch's results (`base.output_layout`); consumed tensors
    keep theirs. The bias gradient rides along with the weight gradient when both are asked for.
    """
    result = base.output_layout
    common = dict(output_layout=grad_layout, bias=False)
    problems = {}
    if output_mask[0]:
        problems["grad_input"] = dataclasses.replace(base, op=Op.BWD_DATA, input_layout=result, **common)
    if output_mask[1]:
        problems["grad_weight"] = dataclasses.replace(base, op=Op.BWD_WEIGHT, weight_layout=result,
                                                      output_layout=grad_layout, bias=bool(output_mask[2]))
    elif output_mask[2]:
        problems["grad_bias"] = dataclasses.replace(base, op=Op.BWD_BIAS, input_layout=Layout.CONTIGUOUS,
                                                    weight_layout=Layout.CONTIGUOUS, **common)
    return problems


def _check_mask(output_mask) -> tuple[bool, bool, bool]:
    try:
        mask = tuple(bool(m) for m in output_mask)
    except TypeError:
        raise ConvSpecError(f"output_mask: expected 3 booleans, but got {output_mask!r}") from None
    if len(mask) != 3:
        raise ConvSpecError(f"output_mask: expected 3 booleans (input, weight, bias), but got {list(output_mask)}")
    return mask


def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    """torch.ops.aten.convolution_backward: (grad_input, grad_weight, grad_bias), None where masked off."""
    signature = _signature((grad_output, input, weight), ("bwd", bias_sizes, stride, padding, dilation,
                                                          transposed, output_padding, groups, output_mask))
    known = _calls.get(signature) if signature is not None else None
    if known is None:
        known = _backward_plans(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                output_padding, groups, output_mask)
        if signature is not None:
            _remember(signature, known)
    else:
        bump("memory_hits", len(known[2]))
    base, mask, problems, entries = known
    return _run_backward(base, mask, problems, entries, grad_output, input, weight, bias_sizes)


def checked_backward_problems(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                              groups, output_mask) -> tuple[ConvProblem, tuple[bool, bool, bool], dict]:
    """The checked base problem, mask and per-gradient problems of a convolution_backward call
    (nothing dispatched: the fake kernel of the registered op uses this too)."""
    mask = _check_mask(output_mask)
    check_tensors([("grad_output", grad_output), ("input", input), ("weight", weight)])
    if grad_output.dim() != input.dim():
        raise ConvSpecError(f"grad_output: expected {input.dim()} dimensions like input {list(input.shape)}, "
                            f"but got grad_output of size {list(grad_output.shape)}")
    base = base_problem(input, weight, None, stride, padding, dilation, transposed, output_padding, groups)
    if tuple(grad_output.shape) != base.output_shape:
        raise ConvSpecError(f"grad_output: expected size {list(base.output_shape)} (the forward output's size for "
                            f"input {list(input.shape)} and weight {list(weight.shape)}), but got "
                            f"{list(grad_output.shape)}")
    return base, mask, backward_problems(base, layout_of(grad_output), mask)


def _backward_plans(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                    groups, output_mask):
    """The checked base problem, mask, per-gradient problems and their dispatch entries."""
    # bias_sizes is accepted for ATen's signature; like ATen's CPU path, the bias gradient has one
    # element per output channel of the weight, whatever bias_sizes says (see grad_bias_size).
    base, mask, problems = checked_backward_problems(grad_output, input, weight, stride, padding, dilation,
                                                     transposed, output_padding, groups, output_mask)
    entries = dict(zip(problems, _prepare(list(problems.values()), input)))
    return base, mask, problems, entries


def grad_bias_size(base: ConvProblem, input, bias_sizes) -> list:
    """The bias gradient's size: one element per output channel; ATen gives an empty input's bias
    gradient the size bias_sizes asks for (zeros)."""
    return list(bias_sizes) if input.numel() == 0 and bias_sizes is not None else [base.k]


def _run_backward(base, mask, problems, entries, grad_output, input, weight, bias_sizes):
    gy = dense(grad_output, layout_of(grad_output))
    device = None if input.is_cpu else input.device
    grad_input = grad_weight = grad_bias = None
    if mask[2]:
        grad_bias = torch.empty(grad_bias_size(base, input, bias_sizes), dtype=input.dtype, device=device)
    if "grad_input" in problems:
        p = problems["grad_input"]
        grad_input = _empty(p.input_shape, input.dtype, p.input_layout, device)
        _run(entries["grad_input"], {"grad_output": gy, "weight": dense(weight, p.weight_layout),
                                     "grad_input": grad_input}, base.n)
    if "grad_weight" in problems:
        p = problems["grad_weight"]
        grad_weight = _empty(p.weight_shape, weight.dtype, p.weight_layout, device)
        _run(entries["grad_weight"], {"grad_output": gy, "input": dense(input, p.input_layout),
                                      "grad_weight": grad_weight, "grad_bias": grad_bias}, base.n)
    elif "grad_bias" in problems:
        _run(entries["grad_bias"], {"grad_output": gy, "grad_bias": grad_bias}, base.n)
    return grad_input, grad_weight, grad_bias


def call_problems(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                  output_mask=(True, True, True), grad_output=None) -> list[ConvProblem]:
    """The problems that a forward call and its backward (with `output_mask`) would dispatch.

    Lets callers build every kernel of many calls in one ninja run: `dispatch.prepare(problems)`.
    `grad_output` (or, if None, a gradient in the forward output's memory format) sets the
    gradient's layout.
    """
    base = base_problem(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    grad_layout = layout_of(grad_output) if grad_output is not None else base.output_layout
    plain = dataclasses.replace(base, bias=False)
    mask = _check_mask(output_mask)
    return [base, *backward_problems(plain, grad_layout, mask).values()]
