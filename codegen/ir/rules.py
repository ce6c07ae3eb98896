"""The shape and parameter rules of a convolution (what ATen accepts), with clear messages.

`check_problem` is the one gate every plan passes: kernels trust the plan, the plan trusts this.
Each message names the parameter, the values and the rule. (Each check takes a ConvProblem, problem.py,
whose `validate()` calls them: this module stays below it, so the type is not named here.)
"""

from __future__ import annotations

from ..errors import ConvSpecError
from .types import DType, Layout, Op

# Sizes are held in 64-bit integers by the kernels; any padded extent or element count past this
# bound is refused rather than allowed to wrap.
MAX_EXTENT = 2**31 - 1
MAX_ELEMENTS = 2**62


def _fmt(v) -> str:
    return "[" + ", ".join(str(x) for x in v) + "]"


def check_params(name: str, values, rank: int, *, minimum: int, rule: str) -> None:
    if len(values) != rank:
        raise ConvSpecError(
            f"{name}: expected {rank} value(s), one per spatial dimension of a {rank}-D convolution, "
            f"but got {name}={_fmt(values)}")
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConvSpecError(f"{name}: expected integers, but got {name}={_fmt(values)}")
        if v < minimum:
            raise ConvSpecError(f"{name}={_fmt(values)}: {rule}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_types(p) -> None:
    """Every field has the type the IR promises (a problem built by hand may not)."""
    for name, kind in (("op", Op), ("dtype", DType), ("input_layout", Layout), ("weight_layout", Layout),
                       ("output_layout", Layout)):
        if not isinstance(getattr(p, name), kind):
            raise ConvSpecError(f"{name}={getattr(p, name)!r}: expected one of {[m.value for m in kind]}")
    for name in ("n", "c", "k", "groups"):
        if not _is_int(getattr(p, name)):
            raise ConvSpecError(f"{name}={getattr(p, name)!r}: expected an integer")
    for name in ("transposed", "bias", "tf32"):
        if not isinstance(getattr(p, name), bool):
            raise ConvSpecError(f"{name}={getattr(p, name)!r}: expected a bool")
    for name in ("in_size", "kernel", "stride", "dilation", "output_padding"):
        value = getattr(p, name)
        if not isinstance(value, tuple) or not all(_is_int(v) for v in value):
            raise ConvSpecError(f"{name}={value!r}: expected a tuple of integers, one per spatial dimension")
    if not isinstance(p.padding, tuple) or not all(
            isinstance(pair, tuple) and len(pair) == 2 and all(_is_int(v) for v in pair) for pair in p.padding):
        raise ConvSpecError(f"padding={p.padding!r}: expected a tuple of (low, high) integer pairs, one per "
                            f"spatial dimension")


def check_problem(p) -> None:
    check_types(p)
    if p.tf32 and p.dtype.value != "f32":
        raise ConvSpecError(f"tf32=True with dtype {p.dtype.value}: tf32 matrix instructions compute f32 "
                            f"convolutions only; leave tf32 False for other dtypes")
    rank = p.rank
    if rank not in (1, 2, 3):
        raise ConvSpecError(f"input: convolutions have 1, 2 or 3 spatial dimensions, but the input has {rank} "
                            f"(input size {_fmt(p.input_shape)})")
    if len(p.kernel) != rank:
        raise ConvSpecError(f"weight: expected {rank} kernel dimensions to match the input's {rank} spatial "
                            f"dimensions, but got kernel {_fmt(p.kernel)}")
    for name, v in (("n", p.n), ("c", p.c), ("k", p.k)):
        if v < 0:
            raise ConvSpecError(f"{name}={v}: sizes must be non-negative")
    if p.groups <= 0:
        raise ConvSpecError(f"groups={p.groups}: non-positive groups is not supported")
    check_params("stride", p.stride, rank, minimum=1, rule="non-positive stride is not supported")
    check_params("dilation", p.dilation, rank, minimum=1, rule="dilation should be greater than zero")
    if len(p.padding) != rank or any(len(pair) != 2 for pair in p.padding):
        raise ConvSpecError(f"padding: expected {rank} (low, high) pairs, but got padding={p.padding}")
    flat = [x for pair in p.padding for x in pair]
    for x in flat:
        if not isinstance(x, int) or isinstance(x, bool):
            raise ConvSpecError(f"padding: expected integers, but got padding={p.padding}")
    if any(x < 0 for x in flat):
        raise ConvSpecError(f"padding={p.padding}: negative padding is not supported")
    check_params("output_padding", p.output_padding, rank, minimum=0,
                 rule="output_padding must be non-negative")
    if any(x == 0 for x in p.kernel) or any(x < 0 for x in p.kernel):
        raise ConvSpecError(f"weight: kernel size {_fmt(p.kernel)} has a zero-size dimension; every kernel "
                            f"dimension must be at least 1 (weight size {_fmt(p.weight_shape)})")
    if any(x <= 0 for x in p.in_size):
        raise ConvSpecError(f"input: spatial size {_fmt(p.in_size)} has an empty dimension; every spatial "
                            f"dimension must be at least 1 (input size {_fmt(p.input_shape)}); only the batch "
                            f"and channel dimensions may be zero")
    if max(p.in_size) > MAX_EXTENT or max(flat) > MAX_EXTENT or max(p.stride) > MAX_EXTENT \
            or max(p.dilation) > MAX_EXTENT or max(p.kernel) > MAX_EXTENT:
        raise ConvSpecError(f"sizes overflow: input {_fmt(p.in_size)}, padding {p.padding}, stride "
                            f"{_fmt(p.stride)}, dilation {_fmt(p.dilation)} exceed {MAX_EXTENT}")
    if p.transposed:
        _check_transposed(p)
    else:
        _check_normal(p)
    out = p.out_size
    if any(o > MAX_EXTENT for o in out):
        raise ConvSpecError(f"output size {_fmt(out)} overflows: each output dimension must be at most {MAX_EXTENT}")
    for shape, what in ((p.input_shape, "input"), (p.output_shape, "output"), (p.weight_shape, "weight")):
        count = 1
        for s in shape:
            count *= s
        if count > MAX_ELEMENTS:
            raise ConvSpecError(f"{what} size {_fmt(shape)} overflows: more than 2^62 elements")


def _check_channels(p) -> None:
    dim0 = p.c if p.transposed else p.k
    if dim0 < p.groups:
        raise ConvSpecError(
            f"Given groups={p.groups}, expected weight to be at least {p.groups} at dimension 0, but got weight "
            f"of size {_fmt(p.weight_shape)} instead")
    if p.transposed:
        # weight is (c, k/groups, ...): c must split into groups, k is groups * weight.size(1)
        if p.c % p.groups != 0:
            raise ConvSpecError(
                f"Given transposed=1, groups={p.groups}, expected weight to be divisible by {p.groups} at "
                f"dimension 0, but got weight of size {_fmt(p.weight_shape)} (input channels {p.c}) instead")
        if p.k % p.groups != 0:
            raise ConvSpecError(f"k={p.k}: output channels must be divisible by groups={p.groups}")
    else:
        if p.k % p.groups != 0:
            raise ConvSpecError(
                f"Given groups={p.groups}, expected weight to be divisible by {p.groups} at dimension 0 "
                f"(output channels), but got {p.k} output channels")
        if p.c % p.groups != 0:
            raise ConvSpecError(
                f"Given groups={p.groups}, expected input to have a multiple of {p.groups} channels, "
                f"but got {p.c} channels")


def _check_normal(p) -> None:
    _check_channels(p)
    if any(p.output_padding):
        raise ConvSpecError(f"output_padding={_fmt(p.output_padding)}: output_padding is only allowed for "
                            f"transposed convolutions (transposed=False here)")
    padded = [i + lo + hi for i, (lo, hi) in zip(p.in_size, p.padding)]
    dilated = [d * (kr - 1) + 1 for kr, d in zip(p.kernel, p.dilation)]
    if any(dk > pi for dk, pi in zip(dilated, padded)):
        raise ConvSpecError(
            f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). Kernel size: "
            f"({' x '.join(map(str, dilated))}) (dilation {_fmt(p.dilation)} applied). Kernel size can't be "
            f"greater than actual input size")


def _check_transposed(p) -> None:
    _check_channels(p)
    if p.k == 0:
        # ATen fails on these inside its kernels (an IndexError, or "non-empty weight expected")
        raise ConvSpecError(
            f"Given transposed=1, groups={p.groups}, expected weight to be at least 1 at dimension 1 (output "
            f"channels per group), but got weight of size {_fmt(p.weight_shape)} instead")
    for op, s, d in zip(p.output_padding, p.stride, p.dilation):
        if op >= s and op >= d:
            raise ConvSpecError(
                f"output_padding={_fmt(p.output_padding)}: output padding must be smaller than either stride "
                f"or dilation, but got stride={_fmt(p.stride)} and dilation={_fmt(p.dilation)}")
    out = p.out_size
    if any(o < 1 for o in out):
        raise ConvSpecError(
            f"Given input size {_fmt(p.in_size)}, kernel {_fmt(p.kernel)}, stride {_fmt(p.stride)}, padding "
            f"{p.padding}, dilation {_fmt(p.dilation)} and output_padding {_fmt(p.output_padding)}, the "
            f"calculated output size {_fmt(out)} is too small: every output dimension must be at least 1")
