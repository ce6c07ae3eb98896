"""The implicit-GEMM GPU kernel on matrix instructions: forward, data gradient and weight gradient
of bf16/f16 convolutions with f32 accumulation, rendered for CUDA or HIP from
`templates/gpu/igemm.cu.j2`.

Every pass is one GEMM per group, its operands gathered from the tensors while they are loaded
into shared memory (padding, stride and dilation are predicates, so channel counts need not be
multiples of anything). A block computes a BLOCK_M x BLOCK_N tile of the GEMM, BLOCK_K at a time;
each of its four warps (waves) a quarter of it from the target's matrix instruction (`mma.sync`
m16n8k16 on CUDA, `v_mfma_f32_16x16x16` on HIP, through the wrappers in cuda.h/hip.h).

- forward: M = batch x output pixels, N = filters per group, reduction = channels per group x taps.
- data gradient: one GEMM per *stride phase*. Along an axis with stride S and dilation D, an input
  position i receives the taps r with r*D = i + P (mod S): the positions with the same residue
  q = (i + P) mod S share their taps, which step by S / gcd(S, D). So there are S residues per
  axis; the S / gcd(S, D) of them that gcd(S, D) divides have taps (the sub-problems), the others
  none (their positions receive nothing and are written as zeros by the same kind of launch, with
  an empty reduction). Every residue with any position is launched: no slice of dx is left
  unwritten, and no zeros are inserted into the gradient.
- weight gradient: M = filters per group, N = channels per group x taps, reduction = batch x
  output pixels, split SPLIT ways; each split's f32 partial tile goes to a workspace and a second
  kernel sums the SPLIT partials of each weight in split order and rounds once. No atomics: the
  result is the same bits whatever order blocks and threads run in.

The workspace contract: `<prefix>_bwd_weight_workspace_bytes(batch)` says how many bytes the
caller passes to `<prefix>_bwd_weight(grad_output, input, grad_weight, workspace, batch, stream)`
(SPLIT x the weight's elements x 4 today, whatever the batch). The bias gradient
(`<prefix>_bwd_bias`) is a plain per-filter sum in f32. f32 and f64 problems stay on the direct
kernel (codegen/gpu_direct.py). Tensors may be contiguous or channels-last (each of input, weight
and output by its own layout: every access goes through its strides). Not yet reached from
`lower`/`emit`/dispatch.
"""

from __future__ import annotations

import dataclasses
import math

from .errors import ConvSpecError
from .gpu_target import GPU_ARCHS
from .ir import ConvProblem, DType
from .target import Target, TargetKind
from .version import generator_version

SCALARS = {DType.BF16: "convgen_bf16", DType.F16: "convgen_f16"}
BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 32   # 2 x 2 warps of 32 x 32; BLOCK_K: two 16-deep instructions
MAX_SPLIT = 64


@dataclasses.dataclass(frozen=True)
class AxisPhase:
    """One residue q = (i + P) mod S of one axis for the data gradient: the input positions
    first + S*t (t < count) and their taps tap0 + j*tap_step (j < taps), which read output
    position base + t - j*out_step."""

    residue: int
    first: int
    count: int
    tap0: int
    taps: int
    base: int
    tap_step: int
    out_step: int


@dataclasses.dataclass(frozen=True)
class Phase:
    """One data-gradient sub-problem: a residue per axis (depth, height, width)."""

    axes: tuple[AxisPhase, AxisPhase, AxisPhase]

    def name(self) -> str:
        return "q=(" + ",".join(str(a.residue) for a in self.axes) + ")"


@dataclasses.dataclass(frozen=True)
class IgemmContext:
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
    layouts: tuple[str, str, str]
    x_strides: tuple[int, ...]
    y_strides: tuple[int, ...]
    w_strides: tuple[int, ...]
    block_m: int
    block_n: int
    block_k: int
    phases: tuple[Phase, ...]
    split: int
    why: tuple[str, ...]


def _three(values, fill: int) -> tuple[int, int, int]:
    return (fill,) * (3 - len(values)) + tuple(values)


def axis_phases(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> list[AxisPhase]:
    """The stride residues of one axis that hold input positions, with their taps (possibly none)."""
    common = math.gcd(stride, dilation)
    tap_step, out_step = stride // common, dilation // common
    phases = []
    for q in range(stride):
        first = (q - pad) % stride
        count = max(0, -(-(size - first) // stride))
        if count == 0:
            continue
        taps = [r for r in range(kernel) if (r * dilation - q) % stride == 0]
        tap0 = taps[0] if taps else 0
        base = (first + pad - tap0 * dilation) // stride
        phases.append(AxisPhase(q, first, count, tap0, len(taps), base, tap_step, out_step))
    return phases


def _split(problem: ConvProblem, target: Target, out_pixels: int) -> tuple[int, str]:
    units = target.gpu.sm_count if target.gpu else GPU_ARCHS[target.isa].sm_count
    kg, cg = problem.k // problem.groups, problem.c // problem.groups
    taps = math.prod(problem.kernel)
    tiles = -(-kg // BLOCK_M) * -(-(cg * taps) // BLOCK_N) * problem.groups
    by_units = -(-2 * units // tiles)
    by_depth = max(1, out_pixels // (4 * BLOCK_K))
    split = max(1, min(MAX_SPLIT, by_units, by_depth, 65535 // problem.groups))
    return split, (f"weight gradient: {tiles} output tiles; split the batch x {out_pixels} pixels reduction "
                   f"{split} ways (about two blocks per {'SM' if target.kind is TargetKind.CUDA else 'CU'} of "
                   f"{units}, at least {4 * BLOCK_K} pixels of one image per split), partials summed in order")


def igemm_context(problem: ConvProblem, target: Target, prefix: str) -> IgemmContext:
    """The template context for `problem` on GPU `target`; entries are named `prefix`_fwd,
    _bwd_data, _bwd_weight (+ _bwd_weight_workspace_bytes) and _bwd_bias. ConvSpecError for what
    this kernel does not take."""
    if target.kind is TargetKind.CPU:
        raise ConvSpecError(f"target {target.name()}: the implicit-GEMM GPU kernel needs a cuda or hip target")
    if problem.dtype not in SCALARS:
        raise ConvSpecError(f"dtype {problem.dtype.value}: the implicit-GEMM GPU kernel takes bf16 or f16 (matrix "
                            "instructions); f32 and f64 run on the direct GPU kernel")
    if problem.transposed:
        raise ConvSpecError("transposed=True: the implicit-GEMM GPU kernel takes normal convolutions so far "
                            "(a transposed one is the data gradient of a normal one)")
    if not prefix.isidentifier():
        raise ConvSpecError(f"prefix {prefix!r}: entry names must be C identifiers")
    if problem.groups > 65535:
        raise ConvSpecError(f"groups={problem.groups}: the implicit-GEMM GPU kernel launches a grid row per group; "
                            "at most 65535")
    too_big = {name: count for name, count in (("an input image", problem.c * math.prod(problem.in_size)),
                                               ("an output image", problem.k * math.prod(problem.out_size)),
                                               ("the weight", math.prod(problem.weight_shape))) if count >= 2**31}
    if too_big:
        raise ConvSpecError("size: the implicit-GEMM GPU kernel indexes within one image and the weight in 32 bits; "
                            + ", ".join(f"{name} has {count} elements" for name, count in too_big.items())
                            + " (at most 2^31 - 1)")
    from .emit import operand_strides   # the CPU kernels' strides per layout; emit imports this module's peers lazily

    in_size, out_size = _three(problem.in_size, 1), _three(problem.out_size, 1)
    kernel, stride = _three(problem.kernel, 1), _three(problem.stride, 1)
    pad, dilation = _three([low for low, _ in problem.padding], 0), _three(problem.dilation, 1)
    per_axis = [axis_phases(*args) for args in zip(in_size, out_size, kernel, stride, pad, dilation)]
    phases = tuple(Phase((d, h, w)) for d in per_axis[0] for h in per_axis[1] for w in per_axis[2])
    split, split_why = _split(problem, target, math.prod(out_size))
    with_taps = [p for p in phases if all(a.taps for a in p.axes)]
    why = (f"tiles {BLOCK_M}x{BLOCK_N}x{BLOCK_K}, 4 {'warps' if target.kind is TargetKind.CUDA else 'waves'} of "
           f"{BLOCK_M // 2}x{BLOCK_N // 2}, one shared-memory stage",
           f"data gradient: {len(phases)} stride phases ({len(with_taps)} with taps, the rest written as zeros): "
           + " ".join(p.name() for p in phases),
           split_why)
    return IgemmContext(
        version=generator_version(), problem_name=problem.name(), problem_key=problem.kernel_key(),
        target=target.name(), vendor=target.kind.value, prefix=prefix, scalar=SCALARS[problem.dtype],
        channels=problem.c, filters=problem.k, groups=problem.groups, in_size=in_size, out_size=out_size,
        kernel=kernel, stride=stride, pad=pad, dilation=dilation,
        layouts=tuple(layout.value for layout in (problem.input_layout, problem.weight_layout, problem.output_layout)),
        x_strides=operand_strides(problem.input_layout, problem.c, in_size),
        y_strides=operand_strides(problem.output_layout, problem.k, out_size),
        w_strides=operand_strides(problem.weight_layout, problem.c // problem.groups, kernel), block_m=BLOCK_M, block_n=BLOCK_N,
        block_k=BLOCK_K, phases=phases, split=split, why=why)


def render_igemm(problem: ConvProblem, target: Target, prefix: str = "conv") -> str:
    """CUDA or HIP source (by `target`) of the implicit-GEMM kernels for `problem`, with their entries."""
    from .emit import environment

    return environment().get_template("gpu/igemm.cu.j2").render(c=igemm_context(problem, target, prefix))
