"""ConvProblems for the tests that plan, emit or run one kernel directly (not through the API).

`conv_problem` takes the few numbers a kernel test varies and fills in the rest, per axis; the
tests state whatever else their cases fix (an op, a dtype, a layout) at the call or in a
`functools.partial`. `case_problem` reads the case tuples of the GPU kernel tests.
"""

from __future__ import annotations

from collections.abc import Sequence

from convgen.codegen.ir import ConvProblem, DType, Layout, Op

Layouts = tuple[Layout, Layout, Layout]   # of (input, weight, output)


def per_axis(value, rank: int) -> tuple:
    """One value for every axis, or a sequence of one per axis."""
    return tuple(value) if isinstance(value, Sequence) else (value,) * rank


def padding_pairs(pad, rank: int) -> tuple[tuple[int, int], ...]:
    """(low, high) per axis from one value for both sides of every axis, or from one entry per
    axis: a value for both sides, or a (low, high) pair."""
    return tuple(p if isinstance(p, Sequence) else (p, p) for p in per_axis(pad, rank))


def conv_problem(n: int, c: int, k: int, size, kernel, stride=1, pad=1, dil=1, groups: int = 1, *,
                 op: Op = Op.FWD, transposed: bool = False, output_padding=0, dtype: DType = DType.F32,
                 layout: Layout | Layouts = Layout.CONTIGUOUS, bias: bool | None = None) -> ConvProblem:
    """A problem of kernel op `op`: `n` images of `c` channels of `size` (an int for 1-D, or one
    per axis) to `k` channels, through `kernel`.

    kernel, stride, dil and output_padding: one value for every axis, or one per axis; pad: see
    `padding_pairs`; layout: of every operand, or (input, weight, output); bias: by default the
    op's own (the forward adds one, the weight gradient computes its gradient too)."""
    size = per_axis(size, 1)
    rank = len(size)
    x_layout, w_layout, y_layout = layout if isinstance(layout, tuple) else (layout,) * 3
    return ConvProblem(op=op, n=n, c=c, k=k, in_size=size, kernel=per_axis(kernel, rank),
                       stride=per_axis(stride, rank), padding=padding_pairs(pad, rank), dilation=per_axis(dil, rank),
                       groups=groups, transposed=transposed, output_padding=per_axis(output_padding, rank),
                       dtype=dtype, input_layout=x_layout, weight_layout=w_layout, output_layout=y_layout,
                       bias=op in (Op.FWD, Op.BWD_WEIGHT) if bias is None else bias)


# The GPU kernel tests' names of the operands' layouts, (input, weight, output): "nchw" all contiguous,
# "cl" all channels-last, "x_cl" the input only; "nchw_staged" is NCHW too (gpu/test_igemm.py stages
# every GEMM operand that can be staged channels-last), and so are "nchw_w" (it stages the weight alone) and "nchw_x" (the input
# alone).
GPU_LAYOUTS = {"nchw": (Layout.CONTIGUOUS,) * 3, "cl": (Layout.CHANNELS_LAST,) * 3,
               "x_cl": (Layout.CHANNELS_LAST, Layout.CONTIGUOUS, Layout.CONTIGUOUS),
               "nchw_staged": (Layout.CONTIGUOUS,) * 3, "nchw_w": (Layout.CONTIGUOUS,) * 3,
               "nchw_x": (Layout.CONTIGUOUS,) * 3, "cl_staged": (Layout.CHANNELS_LAST,) * 3}


def case_problem(case: tuple, dtype: DType, layout: str = "nchw") -> ConvProblem:
    """The forward, with a bias, of a GPU kernel test's case (name, input N,C,*spatial, K, kernel,
    stride, (low, high) padding per axis, dilation, groups) in the GPU_LAYOUTS named `layout`,
    validated (a ConvSpecError where the kernel does not fit the padded input)."""
    _, shape, k, kernel, stride, padding, dilation, groups = case
    x_layout, w_layout, y_layout = GPU_LAYOUTS[layout]
    return ConvProblem(Op.FWD, shape[0], shape[1], k, tuple(shape[2:]), kernel, stride, padding, dilation,
                       groups=groups, dtype=dtype, bias=True, input_layout=x_layout, weight_layout=w_layout,
                       output_layout=y_layout).validate()
