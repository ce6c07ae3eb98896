"""The normal convolution X (*) W -> Y that a problem's GPU kernels compute, in 3-D form, and the
stride phases of its data gradient.

A transposed problem's output is X and its input Y, as in codegen/passes/canonicalise.py; rank 1
and 2 problems take unit axes in front. Every GPU family reads its sizes from `Normal`.

Stride phases: along an axis with stride S and dilation D, an input position i receives the taps r
with r*D = i + P (mod S): the positions with the same residue q = (i + P) mod S share their taps,
which step by S / gcd(S, D). So there are S residues per axis; the S / gcd(S, D) of them that
gcd(S, D) divides have taps (the sub-problems), the others none (their positions receive nothing
and are written as zeros by the same kind of launch, with an empty reduction). Every residue with
any position is a phase: no slice of dx is left unwritten, and no zeros are inserted into the
gradient. The implicit GEMM launches a GEMM per phase, the depthwise kernel a launch per phase.
"""

from __future__ import annotations

import dataclasses
import math

from ..ir import ConvProblem, Layout


def three(values, fill: int) -> tuple[int, int, int]:
    """`values` of a rank 1-3 problem as three, `fill` in front."""
    return (fill,) * (3 - len(values)) + tuple(values)


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


@dataclasses.dataclass(frozen=True)
class Normal:
    """The normal convolution X (*) W -> Y that a problem's kernels compute (a transposed problem's
    output is X, its input Y, as in codegen/passes/canonicalise.py), in 3-D form."""

    channels: int               # X's
    filters: int                # Y's
    groups: int
    in_size: tuple[int, int, int]
    out_size: tuple[int, int, int]
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    pad: tuple[int, int, int]
    dilation: tuple[int, int, int]
    layouts: tuple[Layout, Layout, Layout]   # X, W, Y

    @classmethod
    def of(cls, p: ConvProblem) -> "Normal":
        x = (p.k, p.out_size, p.output_layout) if p.transposed else (p.c, p.in_size, p.input_layout)
        y = (p.c, p.in_size, p.input_layout) if p.transposed else (p.k, p.out_size, p.output_layout)
        return cls(x[0], y[0], p.groups, three(x[1], 1), three(y[1], 1), three(p.kernel, 1), three(p.stride, 1),
                   three([low for low, _ in p.padding], 0), three(p.dilation, 1), (x[2], p.weight_layout, y[2]))

    def axis_phases(self) -> list[list[AxisPhase]]:
        """Each axis's stride residues (depth, height, width)."""
        return [axis_phases(*args) for args in zip(self.in_size, self.out_size, self.kernel, self.stride,
                                                    self.pad, self.dilation)]

    def phases(self) -> tuple[Phase, ...]:
        per_axis = self.axis_phases()
        return tuple(Phase((d, h, w)) for d in per_axis[0] for h in per_axis[1] for w in per_axis[2])
