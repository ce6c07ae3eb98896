"""Property tests (hypothesis): random problems against torch; ATen decides which are valid.

- Random valid small problems over every axis of CASES.md (rank 1-3, batch 0-3, channels with
  groups and depthwise, kernel, stride, padding including 'same'/'valid', dilation, transposed
  with output_padding, bias, f32/f64, contiguous/channels-last/non-contiguous operands): the
  forward and the backward (every gradient, then one random output_mask) match torch's float64
  result within the dtype's tolerance. torch is asked first; a problem it refuses is skipped.
- Random invalid-looking problems (small random ints, zeros and negatives included, for every
  size and parameter): when torch refuses, convgen refuses with ConvSpecError (or a ValueError,
  TypeError, NotImplementedError) before building anything; when torch accepts, convgen agrees
  with it.
- `ConvProblem.validate()` on random garbage: ConvSpecError or a problem that lowers and emits.
- Bugs the properties found, pinned as strict expected failures with their minimal repro (their
  regions are kept out of the properties until fixed; see "known bugs").

Every new problem compiles its kernels (about half a second each), so the example counts are
modest; the whole file takes one to two minutes on two cores.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, assume, event, given, note, settings
from hypothesis import strategies as st

import convgen
from convgen.codegen.emit import emit
from convgen.codegen.errors import ConvSpecError
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import host_cpu
from reference import assert_close, assert_same_format, channels_last_format, non_contiguous

SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                      HealthCheck.data_too_large])
REFUSALS = (ValueError, TypeError, NotImplementedError)   # ConvSpecError is a ValueError

FUNCTIONAL = {
    (False, 1): F.conv1d, (False, 2): F.conv2d, (False, 3): F.conv3d,
    (True, 1): F.conv_transpose1d, (True, 2): F.conv_transpose2d, (True, 3): F.conv_transpose3d,
}


@dataclasses.dataclass(frozen=True)
class Call:
    """One convolution call: tensor shapes, ATen's arguments and how the operands are laid out."""

    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    bias: bool
    stride: list[int]
    padding: list[int] | str
    dilation: list[int]
    transposed: bool
    output_padding: list[int]
    groups: int
    dtype: torch.dtype = torch.float64
    formats: tuple[str, str, str] = ("contiguous", "contiguous", "contiguous")   # input, weight, grad_output
    mask: tuple[bool, bool, bool] = (True, True, True)                           # the random output_mask

    @property
    def rank(self) -> int:
        return len(self.input_shape) - 2

    @property
    def out_channels(self) -> int:
        return self.weight_shape[1] * self.groups if self.transposed else self.weight_shape[0]

    def torch_forward(self, x, w, b):
        """torch.nn.functional's convolution (it knows 'same', with its one-sided padding)."""
        fn = FUNCTIONAL[(self.transposed, self.rank)]
        if self.transposed:
            return fn(x, w, b, self.stride, self.padding, self.output_padding, self.groups, self.dilation)
        return fn(x, w, b, self.stride, self.padding, self.dilation, self.groups)

    def args(self):
        return (self.stride, self.padding, self.dilation, self.transposed, self.output_padding, self.groups)


def laid_out(t: torch.Tensor, how: str) -> torch.Tensor:
    if how == "channels_last" and channels_last_format(t.dim()) is not None:
        return t.contiguous(memory_format=channels_last_format(t.dim()))
    if how == "non_contiguous":
        return non_contiguous(t)
    return t


def tensors(call: Call, seed: int):
    g = torch.Generator().manual_seed(seed)

    def randn(shape):
        return torch.randn(shape, dtype=torch.float64, generator=g).to(call.dtype)

    x = laid_out(randn(call.input_shape), call.formats[0])
    w = laid_out(randn(call.weight_shape), call.formats[1])
    b = randn((max(call.out_channels, 0),)) if call.bias else None
    return x, w, b


def reference(call: Call, x, w, b, gy):
    """torch's forward and all three gradients in float64 (autograd through the functional call;
    without a bias, a zero bias stands in, so its gradient is there too)."""
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = (b.detach().double() if b is not None else torch.zeros(call.out_channels, dtype=torch.float64))
    b64.requires_grad_()
    y64 = call.torch_forward(x64, w64, b64)
    grads = torch.autograd.grad(y64, (x64, w64, b64), gy.double(), allow_unused=True)
    grads = tuple(torch.zeros_like(t) if gr is None else gr for gr, t in zip(grads, (x64, w64, b64)))
    return y64.detach(), grads


def torch_refuses(call: Call) -> bool:
    """ATen decides validity: its forward and its backward (on a matching grad_output) must accept.

    torch.nn.functional's normal convolutions take no output_padding, so ATen's own rules for it
    are applied here: one value or one per spatial axis, and all zero unless transposed (ATen's
    convolution_backward refuses any other, and convgen refuses it in both passes)."""
    if len(call.output_padding) not in (1, call.rank) or (not call.transposed and any(call.output_padding)):
        note("ATen refuses the output_padding")
        return True
    x, w, b = tensors(call, 0)
    try:
        y = call.torch_forward(x, w, b)
        if call.padding not in ("same", "valid"):
            torch.ops.aten.convolution_backward(torch.ones_like(y), x, w, [call.out_channels], call.stride,
                                               call.padding, call.dilation, call.transposed, call.output_padding,
                                               call.groups, [True, True, True])
    except Exception as e:   # noqa: BLE001 - any refusal counts, whatever its type
        note(f"torch refuses: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return True
    return False


def cases_md_refuses(call: Call) -> bool:
    """CASES.md's rules that convgen applies whatever the batch, where ATen skips them for an empty
    input (zero batch or channels): an empty spatial dimension, a zero-size kernel dimension,
    dilation <= 0, and for transposed convolutions output_padding not smaller than stride or
    dilation, or an output size below 1."""
    if min(call.input_shape[2:], default=1) == 0 or min(call.dilation, default=1) <= 0:
        return True
    if min(call.weight_shape[2:], default=1) == 0:
        return True
    if call.transposed:
        expand = lambda v: list(v) * call.rank if len(v) == 1 else list(v)
        s, p, d, op = (expand(v) for v in (call.stride, call.padding, call.dilation, call.output_padding))
        for i, kr, si, pi, di, opi in zip(call.input_shape[2:], call.weight_shape[2:], s, p, d, op):
            if opi >= si and opi >= di:
                return True
            if (i - 1) * si - 2 * pi + di * (kr - 1) + opi + 1 < 1:
                return True
    return False


def check_against_torch(call: Call, masks) -> None:
    """convgen's forward and backward (for each mask) against torch's float64 results."""
    x, w, b = tensors(call, 1)
    y = convgen.convolution(x, w, b, *call.args())
    native = call.torch_forward(x, w, b)
    g = torch.Generator().manual_seed(2)
    gy = laid_out(torch.randn(native.shape, dtype=torch.float64, generator=g).to(call.dtype), call.formats[2])
    y64, grads64 = reference(call, x, w, b, gy)
    assert_close(y, y64, call.dtype, "forward")
    assert y.shape == native.shape
    assert_same_format(y, native, "forward")
    for mask in masks:
        got = convgen.convolution_backward(gy, x, w, [call.out_channels], *call.args(), list(mask))
        for name, grad, grad64, wanted in zip(("grad_input", "grad_weight", "grad_bias"), got, grads64, mask):
            if not wanted:
                assert grad is None, f"{name} computed although output_mask={list(mask)}"
            else:
                assert_close(grad, grad64, call.dtype, f"{name} (output_mask={list(mask)})")


# ------------------------------------------------------------------------------- valid problems


@st.composite
def valid_calls(draw, rank: int, transposed: bool, dtypes=(torch.float32, torch.float64)) -> Call:
    groups = draw(st.sampled_from([1, 1, 2, 3, 4]))
    depthwise = groups > 1 and draw(st.booleans())
    in_per_group = 1 if depthwise else draw(st.sampled_from([0, 1, 1, 2, 3]))
    out_per_group = draw(st.integers(1, 3))
    n = draw(st.integers(0, 3))
    kmax, smax = (3, 8) if rank < 3 else (2, 4)
    kernel = [draw(st.integers(1, kmax)) for _ in range(rank)]
    stride = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilation = [draw(st.integers(1, 3)) for _ in range(rank)]
    padding_kind = draw(st.sampled_from(["ints", "ints", "same", "valid"]))
    if transposed or padding_kind == "ints":
        padding = [draw(st.integers(0, 2)) for _ in range(rank)]
    else:
        padding = padding_kind
        if padding == "same":
            stride = [1] * rank
    if transposed:
        output_padding = [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation)]
    else:
        output_padding = [0] * rank
    pads = [0] * rank if isinstance(padding, str) else padding
    # at least as large as the padded, dilated kernel for a normal convolution
    low = [max(1, d * (k - 1) + 1 - 2 * p) if not transposed else 1 for k, d, p in zip(kernel, dilation, pads)]
    in_size = [draw(st.integers(lo, lo + smax)) for lo in low]
    c = groups * in_per_group
    if transposed:
        weight = (c, out_per_group, *kernel)
    else:
        weight = (groups * out_per_group, in_per_group, *kernel)
    formats = tuple(draw(st.sampled_from(["contiguous", "channels_last", "non_contiguous"])) for _ in range(3))
    mask = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    return Call((n, c, *in_size), weight, draw(st.booleans()), stride, padding, dilation, transposed,
                output_padding, groups, draw(st.sampled_from(list(dtypes))), formats, mask)


# parametrised by rank and kind, so that every run covers each with some examples (hypothesis
# alone favours some choices over others in a run of a few dozen examples)
@pytest.mark.parametrize("transposed", [False, True], ids=["normal", "transposed"])
@pytest.mark.parametrize("rank", [1, 2, 3], ids=["1d", "2d", "3d"])
@settings(SLOW, max_examples=8)
@given(data=st.data())
def test_valid_problems_match_torch(rank, transposed, data):
    call = data.draw(valid_calls(rank, transposed), label="call")
    assume(not torch_refuses(call) and not cases_md_refuses(call))
    event(f"groups {call.groups}, {call.input_shape[1] // call.groups} input channels per group")
    event(f"padding {call.padding if isinstance(call.padding, str) else 'ints'}")
    check_against_torch(call, [(True, True, True), call.mask])


# ------------------------------------------------------------------------------- any problems


BREAKABLE = ("n", "c", "in_size", "weight_out", "weight_in", "kernel", "weight_rank", "stride", "padding",
             "dilation", "output_padding", "groups")


@st.composite
def any_calls(draw) -> Call:
    """A plausible call with up to three of its parts broken by small random ints: zeros and
    negatives for the parameters, zeros for the sizes, lists of the wrong length, groups that
    divide nothing, a weight of another rank. Unbroken parts are drawn consistent with each
    other, so some calls are valid (ATen decides) and some break exactly one rule."""
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    broken = draw(st.sets(st.sampled_from(BREAKABLE), max_size=3))
    transposed = draw(st.booleans())

    def size(part, lo, hi):
        return draw(st.integers(0, 4) if part in broken else st.integers(lo, hi))

    def param(part, lo, hi):
        if part not in broken:
            return [draw(st.integers(lo, hi)) for _ in range(rank)]
        length = draw(st.sampled_from([rank, rank, 1, rank + 1, max(rank - 1, 0)]))
        return [draw(st.integers(-2, hi)) for _ in range(length)]

    groups = draw(st.integers(-1, 4) if "groups" in broken else st.integers(1, 3))
    g = max(groups, 1)
    c_per_group, k_per_group = size("c", 1, 3), size("weight_out", 1, 2)
    c = c_per_group * g if "c" not in broken else size("c", 0, 0)
    kernel = [size("kernel", 1, 3) for _ in range(rank)]
    if transposed:
        weight = [c if "weight_in" not in broken else size("weight_in", 0, 0), k_per_group, *kernel]
    else:
        weight = [k_per_group * g, c_per_group if "weight_in" not in broken else size("weight_in", 0, 0), *kernel]
    if "weight_rank" in broken:
        weight = weight[:-1] if draw(st.booleans()) and rank > 1 else [*weight, 1]
    stride, dilation = param("stride", 1, 2), param("dilation", 1, 2)
    padding = param("padding", 0, 2)
    if not transposed and "padding" not in broken and draw(st.sampled_from([False] * 4 + [True])):
        padding = draw(st.sampled_from(["same", "valid"]))
    output_padding = param("output_padding", 0, 1) if transposed or "output_padding" in broken else [0] * rank
    in_size = [size("in_size", 2, 7) for _ in range(rank)]
    return Call(input_shape=(size("n", 0, 2), c, *in_size), weight_shape=tuple(weight), bias=draw(st.booleans()),
                stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                output_padding=output_padding, groups=groups)


@settings(SLOW, max_examples=100)
@given(call=any_calls())
def test_any_problem_is_refused_like_torch_or_matches_it(call):
    refused_by = "torch" if torch_refuses(call) else "CASES.md" if cases_md_refuses(call) else None
    if refused_by is None:
        event("torch accepts")
        check_against_torch(call, [(True, True, True)])
        return
    event(f"{refused_by} refuses")
    before = convgen.stats()
    x, w, b = tensors(call, 0)
    with pytest.raises(REFUSALS):
        convgen.convolution(x, w, b, *call.args())
    gy = torch.randn([max(s, 0) for s in call.input_shape], dtype=torch.float64)
    with pytest.raises(REFUSALS):
        convgen.convolution_backward(gy, x, w, [call.out_channels], *call.args(), [True, True, True])
    assert convgen.stats()["builds"] == before["builds"], "refused only after building a kernel"


# ------------------------------------------------------------------------------- bugs found here


# Found by test_valid_problems_match_torch: the bias gradient alone (output_mask [*, False, True]) of a
# normal convolution whose input has no channels. ATen returns zeros; convgen's bias-reduction kernel
# reads a grad_output that has no channels (ATen's output for such an input) and segfaults. Run in a
# child process, since the crash would end the test session.
SEGFAULT_REPRO = """
import torch, convgen
x = torch.randn(3, 0, 5, dtype=torch.float64)
w = torch.randn(2, 0, 3, dtype=torch.float64)
gy = torch.randn(3, 0, 3, dtype=torch.float64)
for mask in ([False, False, True], [True, False, True]):
    ref = torch.ops.aten.convolution_backward(gy, x, w, [2], [1], [0], [1], False, [0], 1, mask)
    got = convgen.convolution_backward(gy, x, w, [2], [1], [0], [1], False, [0], 1, mask)
    assert torch.equal(got[2], ref[2]), (got, ref)
print("ok")
"""


# Once a segfault: the bias gradient of a normal convolution whose input has no channels (ATen
# gives grad_output zero channels then), with output_mask [*, False, True]. Run in a child process.
def test_bias_gradient_without_input_channels():
    child = subprocess.run([sys.executable, "-c", SEGFAULT_REPRO], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0 and child.stdout.strip() == "ok", \
        f"exit status {child.returncode}: {child.stderr[-2000:]}"


# Found by test_valid_problems_match_torch: for 3-D convolutions in float32 with a channels-last input,
# ATen's CPU result is contiguous unless it hands the problem to oneDNN (grouped, batch > 1, large
# kernels or inputs); convgen once returned channels-last for all of them.
@pytest.mark.parametrize("transposed", [False, True], ids=["normal", "transposed"])
def test_3d_channels_last_result_format(transposed):
    x = torch.randn(1, 2, 3, 3, 3).contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(2, 2, 3, 3, 3)
    fn, ours = (F.conv_transpose3d, convgen.conv_transpose3d) if transposed else (F.conv3d, convgen.conv3d)
    native = fn(x, w, padding=1)
    assert native.is_contiguous()   # ATen's choice for this call
    assert_same_format(ours(x, w, padding=1), native, "forward")


# Found by test_valid_problems_match_torch: the depthwise weight gradient summed its rows' partial
# sums in float32 straight into its totals, which drifted with the number of rows (here 3 images of
# 15 one-vector rows: 1.2e-6 off against the 1e-6 bound; torch's own float32 result 4.9e-7). Its
# totals are now in double, from runs of up to 8 rows.
def test_depthwise_weight_gradient_of_many_short_rows():
    call = Call(input_shape=(3, 1, 7, 5), weight_shape=(1, 1, 2, 1), bias=False, stride=[2, 1], padding=[0, 1],
                dilation=[2, 1], transposed=True, output_padding=[0, 0], groups=1, dtype=torch.float32,
                formats=("contiguous", "contiguous", "contiguous"), mask=(False, True, False))
    check_against_torch(call, [(True, True, True)])


# Found by test_any_problem_is_refused_like_torch_or_matches_it: a zero-size kernel dimension with an
# empty input. ATen returns an empty output; CASES.md asks for a clear error whatever the batch, as
# convgen gives, but the test's list of such rules (cases_md_refuses) lacked this one.
def test_zero_size_kernel_dimension_is_refused_even_for_an_empty_input():
    x, w = torch.randn(0, 0, 2, dtype=torch.float64), torch.randn(1, 0, 0, dtype=torch.float64)
    torch.ops.aten.convolution(x, w, None, [1], [0], [1], False, [0], 1)   # ATen accepts it
    with pytest.raises(ConvSpecError, match=r"weight: kernel size \[0\] has a zero-size dimension"):
        convgen.convolution(x, w, None, [1], [0], [1], False, [0], 1)


# ------------------------------------------------------------------------------- the IR on garbage


EXTREMES = (0, -1, -3, 2**31, 2**62, -(2**40))
GARBLED = ("n", "c", "k", "in_size", "kernel", "stride", "padding", "dilation", "groups", "output_padding")


@st.composite
def garbage_problems(draw) -> ConvProblem:
    """A plausible problem with up to three fields garbled: negative, zero or far too large
    values, one value too many or too few, padding pairs of one or three values, rank 0 or 4."""
    rank = draw(st.sampled_from([1, 2, 3]))
    garbled = draw(st.sets(st.sampled_from(GARBLED), max_size=3))
    if draw(st.sampled_from([False] * 9 + [True])):
        rank = draw(st.sampled_from([0, 4]))

    def scalar(field, lo, hi):
        return draw(st.sampled_from(EXTREMES)) if field in garbled else draw(st.integers(lo, hi))

    def axes(field, lo, hi, pair=False):
        length = rank
        if field in garbled and draw(st.booleans()):
            length = draw(st.sampled_from([max(rank - 1, 0), rank + 1]))
        if pair:
            sizes = [2] * length
            if field in garbled and draw(st.booleans()):
                sizes = [draw(st.sampled_from([1, 3])) for _ in range(length)]
            return tuple(tuple(scalar(field, lo, hi) for _ in range(size)) for size in sizes)
        return tuple(scalar(field, lo, hi) for _ in range(length))

    return ConvProblem(
        op=draw(st.sampled_from(Op)), n=scalar("n", 0, 3), c=scalar("c", 0, 6), k=scalar("k", 0, 6),
        in_size=axes("in_size", 1, 9), kernel=axes("kernel", 1, 4), stride=axes("stride", 1, 3),
        padding=axes("padding", 0, 3, pair=True), dilation=axes("dilation", 1, 3), groups=scalar("groups", 1, 3),
        transposed=draw(st.booleans()), output_padding=axes("output_padding", 0, 2),
        dtype=draw(st.sampled_from(DType)), input_layout=draw(st.sampled_from(Layout)),
        weight_layout=draw(st.sampled_from(Layout)), output_layout=draw(st.sampled_from(Layout)),
        bias=draw(st.booleans()))


@settings(max_examples=300, deadline=None)
@given(p=garbage_problems())
def test_validate_refuses_garbage_with_conv_spec_error(p):
    """validate() either raises ConvSpecError or passes a problem every pass and the emitter accept."""
    try:
        p.validate()
    except ConvSpecError:
        return
    rank = p.rank
    assert 1 <= rank <= 3
    assert all(len(v) == rank for v in (p.kernel, p.stride, p.dilation, p.padding, p.output_padding))
    assert min(p.in_size) >= 1 and min(p.kernel) >= 1 and min(p.stride) >= 1 and min(p.dilation) >= 1
    assert min(x for pair in p.padding for x in pair) >= 0 and min(p.output_padding) >= 0
    assert p.groups >= 1 and p.c % p.groups == 0 and p.k % p.groups == 0 and min(p.n, p.c, p.k) >= 0
    assert min(p.out_size) >= 1
    assert math.prod(p.output_shape) >= 0
    plan = lower(p, host_cpu())
    emit(plan)


# Values of the wrong type for one field of a valid problem: validate() must say ConvSpecError.
# Today it checks the element types of stride, dilation, output_padding and padding pairs only:
# other wrong types escape as a TypeError from a comparison, or pass (float sizes, strings where
# an enum belongs) and reach the emitter.
VALID = ConvProblem(Op.FWD, 1, 4, 4, (8, 8), (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1))
WRONG_TYPES = [
    # field, value, what validate() once did with it
    ("n", None, "TypeError"),
    ("c", "4", "TypeError"),
    ("k", 4.0, "passes"),
    ("groups", 2.0, "passes"),
    ("in_size", (8.0, 8), "passes"),
    ("kernel", (None, 3), "TypeError"),
    ("padding", (1, 1), "TypeError: padding as ints instead of (low, high) pairs"),
    ("stride", 1, "TypeError: an int instead of a tuple"),
    ("op", "forward", "passes"),
    ("dtype", "int8", "passes"),
]


@pytest.mark.parametrize("field, value", [
    pytest.param(field, value, id=f"{field}={value!r}",
                 )
    for field, value, _ in WRONG_TYPES])
def test_validate_refuses_a_wrong_type(field, value):
    with pytest.raises(ConvSpecError, match=field):
        dataclasses.replace(VALID, **{field: value}).validate()


@settings(max_examples=50, deadline=None, derandomize=True, database=None, phases=[Phase.generate])
@given(field=st.sampled_from([f for f, _, _ in WRONG_TYPES]),
       value=st.none() | st.floats(allow_nan=False) | st.text(max_size=3))
def test_validate_refuses_wrong_types_with_conv_spec_error(field, value):
    with pytest.raises(ConvSpecError):
        dataclasses.replace(VALID, **{field: value}).validate()
