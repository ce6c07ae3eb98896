"""From torch tensors and ATen-style arguments to `ConvProblem`s, with the tensor-level checks.

The shape and parameter rules live in the compiler (convgen.codegen.ir.rules); here are the rules
only tensors can break (rank, dtype, device, bias shape, grad_output shape) and the parsing of
torch's argument spellings (ints or lists, 'same' and 'valid').
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
from torch._prims_common import suggest_memory_format

from ..codegen.errors import ConvSpecError
from ..codegen.ir import ConvProblem, DType, Layout, Op
from ..codegen.target import TargetKind

DTYPES = {torch.float32: DType.F32, torch.float64: DType.F64, torch.bfloat16: DType.BF16, torch.float16: DType.F16}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}
DEVICES = ("cpu", "cuda")   # torch device types served (a cuda device's arch picks its target: devices/cuda.py)


def _shape(t) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def expand_param(name: str, value, rank: int) -> tuple[int, ...]:
    """An int, or a list of one or `rank` ints, as a tuple of `rank` ints (ATen's rule)."""
    if isinstance(value, bool):
        raise ConvSpecError(f"{name}: expected an integer or a list of integers, but got {name}={value!r}")
    if isinstance(value, int):
        return (value,) * rank
    if isinstance(value, torch.Size):
        value = tuple(value)
    try:
        values = tuple(value)
    except TypeError:
        raise ConvSpecError(f"{name}: expected an integer or a list of integers, but got {name}={value!r}") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConvSpecError(f"{name}: expected integers, but got {name}={list(values)}")
    if len(values) == 1:
        return values * rank
    if len(values) != rank:
        raise ConvSpecError(f"expected {name} to be a single integer value or a list of {rank} values to match "
                            f"the convolution dimensions, but got {name}={list(values)}")
    return values


def padding_pairs(padding, rank: int, kernel: Sequence[int], stride: Sequence[int],
                  dilation: Sequence[int], transposed: bool) -> tuple[tuple[int, int], ...]:
    """torch's padding spellings as (low, high) pairs: ints, lists, 'valid' and 'same'."""
    if isinstance(padding, str):
        if transposed:
            raise ConvSpecError(f"padding={padding!r}: string padding is not supported for transposed "
                                f"convolutions; give the padding as integers")
        if padding == "valid":
            return ((0, 0),) * rank
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ConvSpecError(f"padding='same' is not supported for strided convolutions "
                                    f"(stride={list(stride)}); use stride 1 or integer padding")
            pairs = []
            for kr, d in zip(kernel, dilation):
                total = d * (kr - 1)
                pairs.append((total // 2, total - total // 2))   # the odd element goes to the high side
            return tuple(pairs)
        raise ConvSpecError(f"Invalid padding string: {padding!r}; expected 'same', 'valid' or integers")
    return tuple((p, p) for p in expand_param("padding", padding, rank))


def check_dtype(t: torch.Tensor, name: str) -> DType:
    if t.dtype not in DTYPES:
        kind = "complex" if t.is_complex() else "integer or bool" if not t.is_floating_point() else "this float"
        raise NotImplementedError(f"{name}: dtype {t.dtype} is not supported (no {kind} dtype is); "
                                  f"convgen supports float32, float64, bfloat16 and float16")
    return DTYPES[t.dtype]


def check_tensors(named: Sequence[tuple[str, torch.Tensor | None]]) -> DType:
    """Same dtype and device for every present tensor; supported dtype; the CPU or a CUDA device."""
    present = [(n, t) for n, t in named if t is not None]
    for n, t in present:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{n}: expected a torch.Tensor, but got {type(t).__name__}")
    first_name, first = present[0]
    for n, t in present[1:]:
        if t.dtype != first.dtype:
            raise ConvSpecError(f"{first_name} type ({first.dtype}) and {n} type ({t.dtype}) should be the same")
        if t.device != first.device:
            raise ConvSpecError(f"Expected all tensors to be on the same device, but {first_name} is on "
                                f"{first.device} and {n} is on {t.device}")
    for n, t in present:
        if t.layout != torch.strided:
            raise ConvSpecError(f"{n} has layout {t.layout}: convgen takes dense (strided) tensors; convert it "
                                f"with .to_dense()")
        if t.device.type not in DEVICES:
            raise ConvSpecError(f"{n} is on device {t.device}: convgen runs its kernels on the CPU and on CUDA "
                                f"devices (NVIDIA, or AMD through a ROCm build of torch); move the tensors to "
                                f"one of those")
    return check_dtype(first, first_name)


def layout_of(t: torch.Tensor) -> Layout:
    """The layout a tensor is (or will be made) dense in: channels-last when torch suggests it."""
    if t.dim() in (4, 5) and suggest_memory_format(t) in (torch.channels_last, torch.channels_last_3d):
        return Layout.CHANNELS_LAST
    return Layout.CONTIGUOUS


def _backend_input(input: torch.Tensor, padding) -> torch.Tensor:
    """The input ATen's backend choice sees: asymmetric padding ('same' with an even dilated kernel)
    is given to ATen as a copy padded on the high side by the difference, in the input's memory
    format, plus the low side's symmetric padding (as ATen's _convolution_mode does)."""
    extra = [high - low for low, high in padding]
    if not any(extra):
        return input
    shape = list(input.shape[:2]) + [s + e for s, e in zip(input.shape[2:], extra)]
    return torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=suggest_memory_format(input))


def result_layout(input: torch.Tensor, weight: torch.Tensor, stride: Sequence[int],
                  padding: Sequence[tuple[int, int]], dilation: Sequence[int], groups: int, transposed: bool,
                  output_padding: Sequence[int]) -> Layout:
    """The memory format torch's CPU convolution gives its results, as ATen itself decides it: the
    backend ATen would pick for these tensors and arguments (oneDNN, the native 2-D or 3-D paths,
    ..., which depends on the host: bf16 goes to oneDNN only on CPUs with AVX-512 BF16 support, and
    oneDNN keeps 5-D tensors channels-last where the native 3-D path does not), then that backend's
    memory format. Asked of ATen rather than mirrored, so it holds on every host class."""
    backend = torch._C._select_conv_backend(_backend_input(input, padding), weight, None, list(stride),
                                            [low for low, _ in padding], list(dilation), transposed,
                                            list(output_padding), groups)
    if backend == torch._C._ConvBackend.Empty:
        # An empty problem's results are zeros_like its operands: only the weight gradient has
        # elements (batch 0), and it keeps the weight's memory format.
        return layout_of(weight)
    fmt = torch._C._conv_determine_backend_memory_format(input, weight, backend)
    return Layout.CHANNELS_LAST if fmt in (torch.channels_last, torch.channels_last_3d) else Layout.CONTIGUOUS


def memory_format(layout: Layout, dim: int) -> torch.memory_format:
    if layout is Layout.CHANNELS_LAST:
        return torch.channels_last if dim == 4 else torch.channels_last_3d
    return torch.contiguous_format


def base_problem(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride, padding,
                 dilation, transposed: bool, output_padding, groups: int) -> ConvProblem:
    """The forward problem of an ATen-style call, after the tensor-level checks."""
    if not isinstance(transposed, bool):
        raise ConvSpecError(f"transposed: expected a bool, but got transposed={transposed!r}")
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise ConvSpecError(f"groups: expected an integer, but got groups={groups!r}")
    dtype = check_tensors([("input", input), ("weight", weight), ("bias", bias)])
    if weight.dim() < 3:
        raise ConvSpecError(f"weight should have at least three dimensions, but got weight of size {_shape(weight)}")
    if input.dim() != weight.dim():
        raise ConvSpecError(f"Expected {weight.dim()}-dimensional input for {weight.dim()}-dimensional weight "
                            f"{_shape(weight)}, but got {input.dim()}-dimensional input of size {_shape(input)} instead")
    if weight.dim() > 5:
        raise ConvSpecError(f"weight of size {_shape(weight)}: convolutions have 1, 2 or 3 spatial dimensions, "
                            f"so weight must have 3, 4 or 5 dimensions")
    rank = input.dim() - 2
    if groups <= 0:
        raise ConvSpecError(f"groups={groups}: non-positive groups is not supported")
    n, c = input.shape[0], input.shape[1]
    kernel = tuple(weight.shape[2:])
    if transposed:
        if weight.shape[0] != c:
            raise ConvSpecError(f"Given transposed=1, weight of size {_shape(weight)}, expected input {_shape(input)} "
                                f"to have {weight.shape[0]} channels, but got {c} channels instead")
        k = weight.shape[1] * groups
    else:
        if weight.shape[1] * groups != c:
            raise ConvSpecError(f"Given groups={groups}, weight of size {_shape(weight)}, expected input "
                                f"{_shape(input)} to have {weight.shape[1] * groups} channels, but got {c} channels instead")
        k = weight.shape[0]
        if k % groups != 0:
            raise ConvSpecError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                                f"but got weight of size {_shape(weight)} instead")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != k):
        raise ConvSpecError(f"Given weight of size {_shape(weight)}, expected bias to be 1-dimensional with {k} "
                            f"elements, but got bias of size {_shape(bias)} instead")
    stride_t = expand_param("stride", stride, rank)
    dilation_t = expand_param("dilation", dilation, rank)
    output_padding_t = expand_param("output_padding", output_padding, rank)
    if not transposed and any(output_padding_t):
        raise ConvSpecError(f"output_padding={list(output_padding_t)}: output_padding is only allowed for "
                            f"transposed convolutions (transposed=False)")
    pairs = padding_pairs(padding, rank, kernel, stride_t, dilation_t, transposed)
    problem = ConvProblem(op=Op.FWD, n=n, c=c, k=k, in_size=tuple(input.shape[2:]), kernel=kernel,
                          stride=stride_t, padding=pairs, dilation=dilation_t, groups=groups,
                          transposed=transposed, output_padding=output_padding_t, dtype=dtype,
                          input_layout=layout_of(input), weight_layout=layout_of(weight),
                          output_layout=Layout.CONTIGUOUS, bias=bias is not None)
    problem.validate()   # before ATen's backend choice is asked: it trusts valid arguments
    lay = result_layout(input, weight, stride_t, pairs, dilation_t, groups, transposed, output_padding_t)
    return problem if lay is Layout.CONTIGUOUS else dataclasses.replace(problem, output_layout=lay)


def gpu_problem(problem: ConvProblem, kind: TargetKind = TargetKind.CUDA) -> ConvProblem:
    """`problem` as a GPU target of `kind` computes it: on CUDA an f32 problem takes tf32 from
    torch's switch for convolutions, torch.backends.cudnn.allow_tf32 (True by default), read on
    every call as torch reads it -- a permission, as in torch: kernels without a tf32 path
    (depthwise, stem) still compute in f32. Other dtypes, and HIP (no tf32 kernel: f32 runs in
    f32 there), are unchanged; CPU problems never come here, so their keys and kernels stay."""
    if problem.dtype is not DType.F32 or kind is not TargetKind.CUDA:
        return problem
    allowed = bool(torch.backends.cudnn.allow_tf32)
    return problem if problem.tf32 == allowed else dataclasses.replace(problem, tf32=allowed)
