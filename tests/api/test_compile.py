"""convgen under torch.compile and torch.export, through its registered ops (runtime/api/library.py).

- torch.compile(fullgraph=True) of a converted small CNN (Conv2d with bias, a stride-2 grouped
  Conv2d without bias, a ConvTranspose2d, and a functional convgen.conv1d with 'same' padding and
  an even kernel), forward and backward, against torch's own model in float64: with aot_eager
  (its forward and backward graphs hold convgen's ops and no aten.convolution, and the kernels
  did run), with dynamic shapes (two batch sizes), and once with the default inductor backend;
- torch._dynamo.explain finds no graph break;
- a bad call fails while tracing, with convgen's message, before anything is built;
- convgen.convolution_backward traced, 'same' with an even kernel included;
- torch.export.export of the converted model: the graph holds convgen.convolution, and the
  exported program computes what torch's model does (also with a dynamic batch); likewise
  torch.jit.trace of the conv modules;
- torch.library.opcheck on both ops (schema, autograd registration, fake tensors, AOT dispatch
  with dynamic shapes): grouped and strided, channels-last input, transposed, 1-D;
- gradcheck and gradgradcheck through the ops in float64;
- the eager path (no dispatcher) and the ops compute the same values, gradients of first and
  second order included, and only traced calls take the ops.

The kernels of the model and of the op problems are built up front in one ninja run.
"""

from __future__ import annotations

import copy
import dataclasses
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import convgen
from convgen.api import functional, library, ops

from support.builds import prebuild
from support.reference import assert_close, generator_for, randn

F64 = torch.float64
CONVOLUTION = torch.ops.convgen.convolution.default
CONVOLUTION_BACKWARD = torch.ops.convgen.convolution_backward.default

# torch's own 'same' with an even kernel warns that it copies the input (convgen's traced path does too)
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")


# ---------------------------------------------------------------------------- the model


class SmallNet(nn.Module):
    """Conv2d + bias, stride-2 grouped Conv2d without bias, ConvTranspose2d, then a functional
    conv1d (`conv1d`: convgen's or torch's) over the flattened image with an even kernel and
    padding='same', which pads one more element on the high side than on the low one."""

    def __init__(self, conv1d):
        super().__init__()
        self.conv1d = conv1d
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2, bias=False)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.mix = nn.Parameter(torch.randn(4, 4, 2) / 3)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y))
        y = self.up(y)
        n, c, h, w = y.shape
        return self.conv1d(y.flatten(2), self.mix, padding="same").view(n, c, h, w)


def models():
    """torch's model and a converted copy with the same parameters, in float64."""
    torch.manual_seed(0)
    theirs = SmallNet(F.conv1d).double()
    ours = SmallNet(convgen.conv1d).double()
    ours.load_state_dict(theirs.state_dict())
    return theirs, convgen.convert(ours)


def model_input(batch: int = 2) -> torch.Tensor:
    return randn((batch, 3, 8, 8), F64, generator_for(f"small-net-{batch}")).requires_grad_()


def train_step(model, x):
    """The output and the gradients of input and parameters for a fixed random loss."""
    x = x.detach().clone().requires_grad_()
    for p in model.parameters():
        p.grad = None
    y = model(x)
    gy = randn(y.shape, F64, generator_for("small-net-loss"))
    (y * gy).sum().backward()
    params = getattr(model, "_orig_mod", model).named_parameters()   # a compiled model wraps the original
    return y.detach(), {"input": x.grad, **{n: p.grad for n, p in params}}


def assert_step_matches(got, want):
    y, grads = got
    y_t, grads_t = want
    assert_close(y, y_t, F64, "output")
    assert list(grads) == list(grads_t)
    for name in grads:
        assert_close(grads[name], grads_t[name], F64, f"gradient of {name}")


# ---------------------------------------------------------------------------- op problems


@dataclasses.dataclass(frozen=True)
class Problem:
    id: str
    input: tuple[int, ...]
    weight: tuple[int, ...]
    bias: bool
    stride: list[int]
    padding: list[int]
    dilation: list[int]
    transposed: bool
    output_padding: list[int]
    groups: int
    channels_last: bool = False

    def args(self) -> tuple:
        return (self.stride, self.padding, self.dilation, self.transposed, self.output_padding, self.groups)

    def bias_sizes(self) -> list[int]:
        return [self.weight[1] * self.groups if self.transposed else self.weight[0]]

    def operands(self, requires_grad: bool = True):
        gen = generator_for(self.id)
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        x = randn(self.input, F64, gen, memory_format=fmt).requires_grad_(requires_grad)
        w = randn(self.weight, F64, gen).requires_grad_(requires_grad)
        b = randn(self.bias_sizes(), F64, gen).requires_grad_(requires_grad) if self.bias else None
        return x, w, b

    def grad_output(self, x, w, b):
        y = torch.ops.aten.convolution(x.detach(), w.detach(), None, *self.args())
        return randn(y.shape, F64, generator_for(f"{self.id}-gy"), memory_format=torch.contiguous_format)


PROBLEMS = [
    Problem("conv2d-grouped-strided-bias", (2, 4, 6, 5), (6, 2, 3, 3), True, [2, 1], [1, 1], [1, 1], False, [0, 0], 2),
    # ATen gives a channels-last input a channels-last output and input gradient
    Problem("conv2d-channels-last-input", (1, 3, 5, 5), (4, 3, 3, 2), False, [1, 1], [1, 0], [1, 2], False, [0, 0], 1,
            channels_last=True),
    Problem("conv_transpose2d-output_padding-groups", (1, 4, 3, 4), (4, 1, 3, 2), True, [2, 3], [1, 0], [1, 1], True,
            [1, 2], 2),
    Problem("conv1d-dilation-padding", (2, 3, 9), (2, 3, 3), True, [1], [2], [2], False, [0], 1),
]
PARTIAL_MASKS = [[True, False, False], [False, True, False], [False, False, True]]


def op_problems():
    """The convgen problems of the op tests: each problem's forward and backward for every mask."""
    problems = []
    for case in PROBLEMS:
        x, w, b = case.operands()
        for mask in ([True, True, case.bias], *PARTIAL_MASKS):
            problems += ops.call_problems(x, w, b, *case.args(), output_mask=mask)
    return problems


@pytest.fixture(scope="module")
def prebuilt():
    """Every kernel of the model's training step (as the traced path forms its problems:
    convgen.collect sees the registered ops) and of the op problems, in one ninja run."""
    _, ours = models()
    prebuild(convgen.collect(ours, model_input()) + op_problems())


@pytest.fixture
def counted(monkeypatch):
    """Counts the runs of ops.convolution and ops.convolution_backward (by output_mask): the
    registered ops' CPU kernels call them, so a compiled model that counts here ran convgen."""
    calls = {"convolution": 0, "convolution_backward": []}
    real_fwd, real_bwd = ops.convolution, ops.convolution_backward

    def fwd(*args):
        calls["convolution"] += 1
        return real_fwd(*args)

    def bwd(*args):
        calls["convolution_backward"].append(tuple(args[-1]))
        return real_bwd(*args)

    monkeypatch.setattr(ops, "convolution", fwd)
    monkeypatch.setattr(ops, "convolution_backward", bwd)
    return calls


def recording_backend(graphs: dict):
    """aot_eager that keeps the forward and backward graphs it is given."""
    def compiler(kind):
        def compile(gm, example_inputs):
            graphs.setdefault(kind, []).append(gm)
            return make_boxed_func(gm.forward)
        return compile
    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))


def targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


# ---------------------------------------------------------------------------- torch.compile


def test_compile_fullgraph_forward_backward(prebuilt, counted):
    theirs, ours = models()
    graphs = {}
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True, backend=recording_backend(graphs))
    x = model_input()
    assert_step_matches(train_step(compiled, x), train_step(theirs, x))

    forward, = graphs["forward"]
    backward, = graphs["backward"]
    assert targets(forward).count(CONVOLUTION) == 4
    assert targets(backward).count(CONVOLUTION_BACKWARD) == 4
    for gm in (forward, backward):
        assert torch.ops.aten.convolution.default not in targets(gm)
        assert torch.ops.aten.convolution_backward.default not in targets(gm)
    # the kernels ran: four forwards, and one backward per convolution asking all it needs
    assert counted["convolution"] == 4
    assert sorted(counted["convolution_backward"]) == sorted([(True, True, True), (True, True, False),
                                                               (True, True, True), (True, True, False)])


def test_no_graph_breaks(prebuilt):
    _, ours = models()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(ours)(model_input())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compile_dynamic_batch(prebuilt):
    """Symbolic sizes: the fake kernels compute shapes and layouts without concrete values."""
    theirs, ours = models()
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager", dynamic=True)
    for batch in (2, 3):
        x = model_input(batch)
        assert_step_matches(train_step(compiled, x), train_step(theirs, x))


def test_compile_inductor(prebuilt, counted):
    """The default backend: convgen's ops stay opaque calls in inductor's generated code."""
    theirs, ours = models()
    torch._dynamo.reset()
    start = time.monotonic()
    compiled = torch.compile(ours, fullgraph=True)
    x = model_input()
    assert_step_matches(train_step(compiled, x), train_step(theirs, x))
    assert counted["convolution"] == 4 and len(counted["convolution_backward"]) == 4
    assert time.monotonic() - start < 300, "inductor took unreasonably long (expected well under a minute)"


def test_bad_call_fails_while_tracing_before_building(prebuilt):
    x, w = randn((1, 4, 8, 8), F64, generator_for("bad")), randn((4, 4, 3, 3), F64, generator_for("bad-w"))
    before = convgen.stats()["builds"]
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"stride=\[0, 0\]"):
        torch.compile(lambda x, w: convgen.conv2d(x, w, stride=0), fullgraph=True, backend="aot_eager")(x, w)
    assert convgen.stats()["builds"] == before


@pytest.mark.parametrize("padding", [[1, 0], "same"], ids=["integers", "same-even-kernel"])
def test_compile_convolution_backward(padding, prebuilt):
    """convgen.convolution_backward traced: the registered op, None where masked off; 'same' with
    an even kernel pads the input and drops the padding's gradient."""
    gen = generator_for(f"traced-backward-{padding}")
    x, w = randn((2, 3, 6, 7), F64, gen), randn((4, 3, 3, 2), F64, gen)
    args = ([1, 1], padding, [1, 1], False, [0, 0], 1)
    gy = randn(convgen.convolution(x, w, None, *args).shape, F64, gen)

    def backward(gy, x, w, mask):
        return convgen.convolution_backward(gy, x, w, [4], *args, mask)

    torch._dynamo.reset()
    compiled = torch.compile(backward, fullgraph=True, backend="aot_eager")
    for mask in ([True, True, True], [True, False, True]):
        got, want = compiled(gy, x, w, mask), backward(gy, x, w, mask)
        for name, g, g_want in zip(("input", "weight", "bias"), got, want):
            if g_want is None:
                assert g is None, f"gradient of {name} is masked off"
            else:
                assert g.stride() == g_want.stride(), f"gradient of {name}: strides"
                assert_close(g, g_want, F64, f"gradient of {name}")


# ---------------------------------------------------------------------------- torch.export


def test_export(prebuilt):
    theirs, ours = models()
    x = model_input().detach()
    exported = torch.export.export(ours, (x,))
    found = targets(exported.graph_module)
    assert found.count(CONVOLUTION) == 4
    assert torch.ops.aten.convolution.default not in found
    assert_close(exported.module()(x), theirs(x), F64, "exported output")


def test_export_dynamic_batch(prebuilt):
    theirs, ours = models()
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(ours, (model_input().detach(),), dynamic_shapes={"x": {0: batch}})
    assert targets(exported.graph_module).count(CONVOLUTION) == 4
    x = model_input(3).detach()
    assert_close(exported.module()(x), theirs(x), F64, "exported output at batch 3")


@pytest.mark.filterwarnings("ignore:`torch.jit")
def test_jit_trace(prebuilt):
    """torch.jit.trace (integer padding: it sees sizes as tensors, which 'same' cannot resolve)
    records convgen's op, not the kernel call it cannot see."""
    theirs, _ = models()
    ours = convgen.convert(nn.Sequential(copy.deepcopy(theirs.c1), copy.deepcopy(theirs.c2),
                                         copy.deepcopy(theirs.up)))
    traced = torch.jit.trace(ours, (model_input().detach(),))
    assert str(traced.inlined_graph).count("convgen::convolution") == 3
    x = model_input(3).detach()
    assert_close(traced(x), theirs.up(theirs.c2(theirs.c1(x))), F64, "traced output at batch 3")


# ---------------------------------------------------------------------------- the ops themselves

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("case", PROBLEMS, ids=lambda c: c.id)
def test_opcheck_convolution(case, prebuilt):
    x, w, b = case.operands()
    torch.library.opcheck(CONVOLUTION, (x, w, b, *case.args()), test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("case", PROBLEMS, ids=lambda c: c.id)
def test_opcheck_convolution_backward(case, prebuilt):
    x, w, b = case.operands()
    gy = case.grad_output(x, w, b).requires_grad_()
    for mask in ([True, True, case.bias], PARTIAL_MASKS[0]):
        torch.library.opcheck(CONVOLUTION_BACKWARD, (gy, x, w, case.bias_sizes(), *case.args(), mask),
                              test_utils=OPCHECK_TESTS)


def test_ops_fake_results_match_real_strides(prebuilt):
    """The fake kernels give the real kernels' shapes and strides (channels-last case: the
    output and the input gradient are channels-last)."""
    case = PROBLEMS[1]
    x, w, b = case.operands(requires_grad=False)
    gy = case.grad_output(x, w, b)
    real = (CONVOLUTION(x, w, b, *case.args()),
            *CONVOLUTION_BACKWARD(gy, x, w, case.bias_sizes(), *case.args(), [True, True, False]))
    with FakeTensorMode() as mode:
        fx, fw, fgy = (mode.from_tensor(t) for t in (x, w, gy))
        fake = (CONVOLUTION(fx, fw, None, *case.args()),
                *CONVOLUTION_BACKWARD(fgy, fx, fw, case.bias_sizes(), *case.args(), [True, True, False]))
    assert real[0].is_contiguous(memory_format=torch.channels_last)
    assert real[1].is_contiguous(memory_format=torch.channels_last)
    for r, f in zip(real, fake):
        assert (tuple(f.shape), f.stride(), f.dtype) == (tuple(r.shape), r.stride(), r.dtype)


@pytest.mark.parametrize("case", [PROBLEMS[0], PROBLEMS[2]], ids=lambda c: c.id)
def test_gradcheck_through_ops(case, prebuilt, one_thread):
    x, w, b = case.operands()
    fn = lambda x, w, b: CONVOLUTION(x, w, b, *case.args())
    assert torch.autograd.gradcheck(fn, (x, w, b))
    assert torch.autograd.gradgradcheck(fn, (x, w, b))


@pytest.mark.parametrize("path", ["op", "eager"])
def test_gradcheck_through_backward(path, prebuilt, one_thread):
    """convolution_backward is differentiable in grad_output, input and weight: the registered op
    and convgen.convolution_backward on the eager path."""
    case = PROBLEMS[0]
    x, w, _ = case.operands()
    gy = case.grad_output(x, w, None).requires_grad_()
    backward = CONVOLUTION_BACKWARD if path == "op" else convgen.convolution_backward
    fn = lambda gy, x, w: backward(gy, x, w, case.bias_sizes(), *case.args(), [True, True, True])
    assert torch.autograd.gradcheck(fn, (gy, x, w))


# ---------------------------------------------------------------------------- eager path and ops agree


def second_order(conv, case: Problem):
    """Output, first-order gradients (create_graph) and the gradients of a loss made of them."""
    x, w, b = case.operands()
    y = conv(x, w, b)
    gy = randn(y.shape, F64, generator_for(f"{case.id}-second")).requires_grad_()
    first = torch.autograd.grad(y, (x, w, b), gy, create_graph=True)
    loss = sum(g.square().sum() for g in first) + (y * y).sum()
    return (y, *first, *torch.autograd.grad(loss, (x, w, b, gy)))


@pytest.mark.parametrize("case", [p for p in PROBLEMS if p.bias], ids=lambda c: c.id)
def test_eager_path_and_ops_agree(case, prebuilt):
    """The same kernels behind both paths: equal bit for bit, to the second order."""
    eager = second_order(lambda x, w, b: convgen.convolution(x, w, b, *case.args()), case)
    registered = second_order(lambda x, w, b: CONVOLUTION(x, w, b, *case.args()), case)
    for i, (e, r) in enumerate(zip(eager, registered)):
        assert torch.equal(e, r), f"result {i} differs"
    x, w, b = case.operands(requires_grad=False)
    assert torch.equal(convgen.convolution(x, w, b, *case.args()), CONVOLUTION(x, w, b, *case.args()))


class _Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_only_traced_calls_take_the_ops(prebuilt):
    case = PROBLEMS[0]
    x, w, b = case.operands(requires_grad=False)
    assert not functional.traced(x, w, b)
    with FakeTensorMode() as mode:
        assert functional.traced(mode.from_tensor(x))
    with _Seen() as seen:
        assert functional.traced(x, w, b)
        y = convgen.convolution(x, w, b, *case.args())
    assert seen.ops == [CONVOLUTION]
    assert torch.equal(y, convgen.convolution(x, w, b, *case.args()))
