"""The direct GPU kernel: every pass of a convolution, one GPU thread per result element,
rendered for CUDA or HIP from `templates/gpu/direct.cu.j2`.

It is the GPU side's reference kernel (clear, not fast): the first kernel the SIMT simulator and
the vendor compilers run, and what faster GPU kernels will be checked against. It takes normal
(not transposed) problems in the contiguous layout, f32 or f64 (every sum in double, rounded once),
rank 1-3 (as 3-D with unit axes in front); the batch size is a run-time argument. Not yet reached from `lower`/`emit`.
"""

from __future__ import annotations

import dataclasses

from .errors import ConvSpecError
from .ir import ConvProblem, DType, Layout
from .target import Target, TargetKind
from .version import generator_version

THREADS = 256   # threads per block: 8 warps (4 waves), enough for the simulator and any GPU
SCALARS = {DType.F32: "float", DType.F64: "double"}


@dataclasses.dataclass(frozen=True)
class DirectContext:
    version: str
    problem_name: str
    problem_key: str
    target: str
    vendor: str
    prefix: str
    scalar: str
    channels: int
    filters: int
    groups: int
    in_size: tuple[int, int, int]
    out_size: tuple[int, int, int]
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    pad: tuple[int, int, int]
    dilation: tuple[int, int, int]
    threads: int


def _three(values, fill: int) -> tuple[int, int, int]:
    return (fill,) * (3 - len(values)) + tuple(values)


def direct_context(problem: ConvProblem, target: Target, prefix: str) -> DirectContext:
    """The template context for `problem` on GPU `target`; entries are named `prefix`_fwd,
    _bwd_data, _bwd_weight and _bwd_bias. ConvSpecError for what this kernel does not take."""
    if target.kind is TargetKind.CPU:
        raise ConvSpecError(f"target {target.name()}: the direct GPU kernel needs a cuda or hip target")
    if problem.dtype not in SCALARS:
        raise ConvSpecError(f"dtype {problem.dtype.value}: the direct GPU kernel takes f32 or f64 so far")
    if problem.transposed:
        raise ConvSpecError("transposed=True: the direct GPU kernel takes normal convolutions so far "
                            "(a transposed one is the data gradient of a normal one)")
    if {problem.input_layout, problem.weight_layout, problem.output_layout} != {Layout.CONTIGUOUS}:
        raise ConvSpecError("layout: the direct GPU kernel takes contiguous tensors so far")
    if not prefix.isidentifier():
        raise ConvSpecError(f"prefix {prefix!r}: entry names must be C identifiers")
    return DirectContext(
        version=generator_version(), problem_name=problem.name(), problem_key=problem.kernel_key(),
        target=target.name(), vendor=target.kind.value, prefix=prefix, scalar=SCALARS[problem.dtype],
        channels=problem.c, filters=problem.k, groups=problem.groups,
        in_size=_three(problem.in_size, 1), out_size=_three(problem.out_size, 1),
        kernel=_three(problem.kernel, 1), stride=_three(problem.stride, 1),
        pad=_three([low for low, _ in problem.padding], 0), dilation=_three(problem.dilation, 1),
        threads=THREADS)


def render_direct(problem: ConvProblem, target: Target, prefix: str = "conv") -> str:
    """CUDA or HIP source (by `target`) of the direct kernels for `problem`, with their entries."""
    from .emit import environment

    return environment().get_template("gpu/direct.cu.j2").render(c=direct_context(problem, target, prefix))
