"""The direct GPU kernel: every pass of a convolution, one GPU thread per result element,
rendered for CUDA or HIP from `templates/gpu/direct.cu.j2`.

It is the GPU side's reference kernel (clear, not fast): what the SIMT simulator and the vendor
compilers run first, and what faster GPU kernels are checked against. It takes every problem
convgen validates: rank 1-3 (as 3-D with unit axes in front), groups, stride, dilation,
asymmetric padding, transposed convolutions with output_padding (through the same equivalence as
the CPU passes: a transposed forward is the data gradient of the normal convolution with input
and output swapped, and so on; see codegen/passes/canonicalise.py), each tensor contiguous or
channels-last (compile-time strides per tensor), f32/f64/bf16/f16 (bf16 and f16 stored as their
16-bit patterns, converted by the generator's own round-to-nearest-even functions). Every sum
runs in double and is rounded once to the result's dtype. The batch size is a run-time argument.

Entries, one per user-level pass, with pointers by role (as the CPU entries), the batch and a
stream; each returns 0 when its kernels were launched:

    <prefix>_fwd(input, weight, bias, output, batch, stream)          bias may be null
    <prefix>_bwd_data(grad_output, weight, grad_input, batch, stream)
    <prefix>_bwd_weight(grad_output, input, grad_weight, batch, stream)
    <prefix>_bwd_weight_bias(grad_output, input, grad_weight, grad_bias, batch, stream)
    <prefix>_bwd_bias(grad_output, grad_bias, batch, stream)

The weight gradient with its bias gradient (`bwd_weight_bias`) is one launch: one thread per weight
element as `bwd_weight`, and past them one thread per bias channel summing grad_output over the
batch and that channel's pixels (in double, in a fixed order), as `bwd_bias` does alone.
"""

from __future__ import annotations

import dataclasses

from .errors import ConvSpecError
from .gpu_wrappers import vendor_wrappers
from .ir import ConvProblem, DType, Layout
from .target import Target, TargetKind
from .version import generator_version

THREADS = 256   # threads per block: 8 warps (4 waves), enough for the simulator and any GPU
ENTRIES = ("fwd", "bwd_data", "bwd_weight", "bwd_weight_bias", "bwd_bias")
STORAGE = {DType.F32: "float", DType.F64: "double", DType.BF16: "unsigned short", DType.F16: "unsigned short"}


@dataclasses.dataclass(frozen=True)
class Operand:
    """One activation tensor of the normal convolution (X or Y): channels, 3-D size and the
    element strides (n, c, d, h, w) of its caller's layout."""

    channels: int
    size: tuple[int, int, int]
    strides: tuple[int, int, int, int, int]


@dataclasses.dataclass(frozen=True)
class DirectContext:
    version: str
    problem_name: str
    problem_key: str
    target: str
    vendor: str
    wrappers: str          # the vendor's wrapper header, inline (the file is self-contained)
    prefix: str
    dtype: str             # f32, f64, bf16, f16
    storage: str           # the element type in memory
    transposed: bool
    groups: int
    x: Operand             # the normal convolution's input (a transposed problem's output)
    y: Operand             # its output (a transposed problem's input)
    w_strides: tuple[int, int, int, int, int]   # weight (Y channel, X channel in group, d, h, w)
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    pad: tuple[int, int, int]
    dilation: tuple[int, int, int]
    threads: int
    entries: tuple[str, ...]
    kernels: tuple[str, ...]   # the __global__ functions those entries launch (only these are rendered)


def _three(values, fill: int) -> tuple[int, int, int]:
    return (fill,) * (3 - len(values)) + tuple(values)


def strides(layout: Layout, channels: int, size: tuple[int, int, int]) -> tuple[int, int, int, int, int]:
    """Element strides (n, c, d, h, w) of a dense tensor of `channels` x `size` in `layout`."""
    d, h, w = size
    if layout is Layout.CHANNELS_LAST:
        return (d * h * w * channels, 1, h * w * channels, w * channels, channels)
    return (channels * d * h * w, d * h * w, h * w, w, 1)


def direct_context(problem: ConvProblem, target: Target, prefix: str, *, threads: int = THREADS,
                   entries: tuple[str, ...] = ENTRIES) -> DirectContext:
    """The template context for `problem` on GPU `target`: entries `prefix`_<entry> for each of
    `entries` (a subset of ENTRIES), `threads` per block. ConvSpecError for a CPU target, a bad
    prefix or entry, or a thread count that is not a multiple of the warp size."""
    if target.kind is TargetKind.CPU or target.gpu is None:
        raise ConvSpecError(f"target {target.name()}: the direct GPU kernel needs a cuda or hip target")
    if not prefix.isidentifier():
        raise ConvSpecError(f"prefix {prefix!r}: entry names must be C identifiers")
    unknown = [e for e in entries if e not in ENTRIES]
    if unknown or not entries:
        raise ConvSpecError(f"entries {list(entries)}: expected a non-empty subset of {list(ENTRIES)}")
    warp = target.gpu.warp_size
    if threads <= 0 or threads % warp or threads > target.gpu.max_threads_per_block:
        raise ConvSpecError(f"threads={threads}: threads per block must be a multiple of the warp size {warp} "
                            f"and at most {target.gpu.max_threads_per_block} on {target.name()}")
    p = problem
    if p.transposed:   # the normal convolution whose data gradient this transposed one is
        x = (p.k, _three(p.out_size, 1), p.output_layout)
        y = (p.c, _three(p.in_size, 1), p.input_layout)
    else:
        x = (p.c, _three(p.in_size, 1), p.input_layout)
        y = (p.k, _three(p.out_size, 1), p.output_layout)
    kernel = _three(p.kernel, 1)
    return DirectContext(
        version=generator_version(), problem_name=p.name(), problem_key=p.kernel_key(), target=target.name(),
        vendor=target.kind.value, wrappers=vendor_wrappers(target.kind.value), prefix=prefix, dtype=p.dtype.value,
        storage=STORAGE[p.dtype], transposed=p.transposed, groups=p.groups,
        x=Operand(x[0], x[1], strides(x[2], x[0], x[1])), y=Operand(y[0], y[1], strides(y[2], y[0], y[1])),
        w_strides=strides(p.weight_layout, x[0] // p.groups if p.groups else 0, kernel),
        kernel=kernel, stride=_three(p.stride, 1), pad=_three([low for low, _ in p.padding], 0),
        dilation=_three(p.dilation, 1), threads=threads, entries=tuple(entries),
        kernels=tuple(sorted({_launches(e, p.transposed) for e in entries})))


def _launches(entry: str, transposed: bool) -> str:
    """The kernel an entry launches: conv_y computes the normal convolution's output, conv_x its
    data gradient (a transposed convolution swaps the two), conv_w its weight gradient,
    sum_channels a bias gradient (conv_w too, fused, for bwd_weight_bias)."""
    return {"fwd": "conv_x" if transposed else "conv_y", "bwd_data": "conv_y" if transposed else "conv_x",
            "bwd_weight": "conv_w", "bwd_weight_bias": "conv_w", "bwd_bias": "sum_channels"}[entry]


def render_direct(problem: ConvProblem, target: Target, prefix: str = "conv", **options) -> str:
    """CUDA or HIP source (by `target`) of the direct kernels for `problem`, with their entries."""
    from .emit import environment

    return environment().get_template("gpu/direct.cu.j2").render(c=direct_context(problem, target, prefix, **options))
