"""Shape collection: the convolution problems one training step of a model dispatches (convgen.collect).

`collect(model, *example_inputs)` runs the model once forward and once backward under a torch
dispatch mode that sees every convolution at the ATen level, so `nn.Conv*` modules, calls of
`torch.nn.functional.conv*` inside `forward`, and convgen's own registered ops are all found
(module hooks would miss the functional calls). The convolutions themselves are computed by
torch while collecting: nothing is built.

Each forward call contributes the problems convgen dispatches for it (the forward, and when
autograd will need them the data, weight and bias gradients its first-order backward asks for),
and each backward call the problems of its `output_mask` and gradient layout, exactly as
runtime/api/ops.py forms them. The model's parameters get no `.grad` and its buffers (batch-norm
statistics) are restored afterwards.

`problems_from_json` reads the same list from a JSON file for users who cannot run their model
on this machine; its format is documented on that function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..codegen.errors import ConvSpecError
from ..codegen.ir import ConvProblem, DType, Layout
from .ops import backward_problems, call_problems
from ..dispatch.problem import TORCH_DTYPES, base_problem, layout_of, memory_format
from .serve_aten import enabled

# Ops with aten.convolution's and aten.convolution_backward's schemas, by qualified name.
FORWARD_OPS = ("aten::convolution", "convgen::convolution")
BACKWARD_OPS = ("aten::convolution_backward", "convgen::convolution_backward")


class _Recorder(TorchDispatchMode):
    """Records the problems of every convolution it sees; torch computes the results."""

    def __init__(self):
        super().__init__()
        self.problems: dict[str, ConvProblem] = {}

    def _add(self, problems: Iterable[ConvProblem]) -> None:
        for p in problems:
            self.problems.setdefault(p.key(), p)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in FORWARD_OPS:
            # convgen's op runs inside its autograd wrapper, where grad mode is always off
            self._forward(*args, **kwargs, grad_mode=torch.is_grad_enabled() or name.startswith("convgen::"))
            return torch.ops.aten.convolution.default(*args, **kwargs)
        if name in BACKWARD_OPS:
            self._backward(*args, **kwargs)
            result = torch.ops.aten.convolution_backward.default(*args, **kwargs)
            if name.startswith("convgen::"):  # convgen's op returns empty tensors where masked off
                result = tuple(torch.empty(0, dtype=args[1].dtype) if r is None else r for r in result)
            return result
        return func(*args, **kwargs)

    def _forward(self, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *,
                 grad_mode: bool):
        mask = (input.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
        if grad_mode and any(mask):
            # what functional.convolution prepares: the forward and its backward, in one ninja run
            self._add(call_problems(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                    groups, output_mask=mask))
        else:
            self._add([base_problem(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                    groups)])

    def _backward(self, grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                  output_padding, groups, output_mask):
        base = base_problem(input, weight, None, stride, padding, dilation, transposed, output_padding, groups)
        self._add(backward_problems(base, layout_of(grad_output), output_mask).values())


def collect(model: torch.nn.Module, *example_inputs: Any) -> list[ConvProblem]:
    """The de-duplicated problems one training step of `model` on `example_inputs` dispatches.

    The model runs forward once (in the mode it is in: call `model.train()` first for a training
    step) and backward once, from a random gradient of every floating-point output that needs
    one (a random gradient has the output's memory format, as a loss's gradient would). Inputs
    that require grad get data gradients; others do not. Any batch size works later: kernels
    take the batch as an argument.
    """
    if not isinstance(model, torch.nn.Module) and not callable(model):
        raise TypeError(f"collect(): expected an nn.Module or a callable, but got {type(model).__name__}")
    buffers = ([(b, b.detach().clone()) for b in model.buffers()] if isinstance(model, torch.nn.Module) else [])
    recorder = _Recorder()
    try:
        with torch.enable_grad(), enabled(False), recorder:   # torch computes, even inside convgen.enabled()
            outputs = model(*example_inputs)
            leaves, _ = tree_flatten(outputs)
            grads_of = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad
                        and t.is_floating_point()]
            wrt = [t for t in _leaves(model, example_inputs) if t.requires_grad]
            if grads_of and wrt:
                torch.autograd.grad(grads_of, wrt, [torch.randn_like(t) for t in grads_of], allow_unused=True)
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    return list(recorder.problems.values())


def _leaves(model, example_inputs) -> list[torch.Tensor]:
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    inputs, _ = tree_flatten(list(example_inputs))
    return params + [t for t in inputs if isinstance(t, torch.Tensor)]


# ---------------------------------------------------------------------------------- JSON


_DTYPES = {d.value: d for d in DType}
_CALL_KEYS = {"input", "weight", "bias", "stride", "padding", "dilation", "groups", "transposed",
              "output_padding", "dtype", "layout", "requires_grad"}


def problems_from_json(source: str | Path | Sequence[dict]) -> list[ConvProblem]:
    """Problems from a JSON shape list (a path, JSON text, or the parsed list).

    Each entry is either one convolution call, expanded like `collect` expands a forward call:

        {"input": [8, 64, 56, 56], "weight": [128, 64, 3, 3], "bias": true, "stride": 2,
         "padding": 1, "dilation": 1, "groups": 1, "transposed": false, "output_padding": 0,
         "dtype": "f32", "layout": "nchw" | "channels_last",
         "requires_grad": {"input": true, "weight": true, "bias": true}}

    (only input and weight are required; requires_grad defaults to true for all three, i.e. a
    training step of a layer inside a network; dtype to f32, layout to nchw), or one problem as
    `ConvProblem.to_json` writes it (an object with an "op" field, as in a bundle's manifest).
    """
    entries = _load_json(source)
    problems: dict[str, ConvProblem] = {}
    for i, entry in enumerate(entries):
        where = f"shape list entry {i}"
        if not isinstance(entry, dict):
            raise ConvSpecError(f"{where}: expected an object, but got {type(entry).__name__}")
        if "op" in entry:
            try:
                found = [ConvProblem.from_dict(entry).validate()]
            except (KeyError, TypeError, ValueError) as e:
                raise ConvSpecError(f"{where}: not a valid problem: {e}") from None
        else:
            found = _call_problems(entry, where)
        for p in found:
            problems.setdefault(p.key(), p)
    return list(problems.values())


def _load_json(source) -> list:
    if isinstance(source, (list, tuple)):
        return list(source)
    text = str(source)
    if isinstance(source, Path) or not text.lstrip().startswith("["):
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as e:
            raise ConvSpecError(f"shape list {str(source)!r}: cannot read it ({e.strerror or e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConvSpecError(f"shape list: not valid JSON ({e})") from None
    if not isinstance(data, list):
        raise ConvSpecError(f"shape list: expected a JSON list of convolutions, but got {type(data).__name__}")
    return data


def _call_problems(entry: dict, where: str) -> list[ConvProblem]:
    unknown = set(entry) - _CALL_KEYS
    if unknown:
        raise ConvSpecError(f"{where}: unknown field(s) {sorted(unknown)}; expected some of {sorted(_CALL_KEYS)}")
    for field in ("input", "weight"):
        value = entry.get(field)
        if not (isinstance(value, list) and value and all(isinstance(v, int) and v >= 0 for v in value)):
            raise ConvSpecError(f"{where}: {field} must be a list of sizes (non-negative integers), but got {value!r}")
    dtype_name = entry.get("dtype", "f32")
    if dtype_name not in _DTYPES:
        raise ConvSpecError(f"{where}: dtype {dtype_name!r} is not one of {sorted(_DTYPES)}")
    layout_name = entry.get("layout", "nchw")
    layouts = {"nchw": Layout.CONTIGUOUS, "contiguous": Layout.CONTIGUOUS, "channels_last": Layout.CHANNELS_LAST,
               "nhwc": Layout.CHANNELS_LAST}
    if layout_name not in layouts:
        raise ConvSpecError(f"{where}: layout {layout_name!r} is not one of {sorted(layouts)}")
    needs = {"input": True, "weight": True, "bias": True, **(entry.get("requires_grad") or {})}
    dtype = TORCH_DTYPES[_DTYPES[dtype_name]]
    fmt = memory_format(layouts[layout_name], len(entry["input"]))
    # Tensors of the right shapes, strides and dtype; never written or read (empty pages stay unmapped).
    x = torch.empty(entry["input"], dtype=dtype).contiguous(memory_format=fmt)
    w = torch.empty(entry["weight"], dtype=dtype).contiguous(memory_format=fmt)
    transposed = bool(entry.get("transposed", False))
    groups = entry.get("groups", 1)
    b = None
    if entry.get("bias", False):
        channels = w.shape[1] * groups if transposed and isinstance(groups, int) else w.shape[0]
        b = torch.empty(channels, dtype=dtype)
    x.requires_grad_(bool(needs["input"]))
    w.requires_grad_(bool(needs["weight"]))
    if b is not None:
        b.requires_grad_(bool(needs["bias"]))
    mask = (x.requires_grad, w.requires_grad, b is not None and b.requires_grad)
    return call_problems(x, w, b, entry.get("stride", 1), entry.get("padding", 0), entry.get("dilation", 1),
                         transposed, entry.get("output_padding", 0), groups, output_mask=mask)
