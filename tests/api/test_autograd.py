"""convgen inside autograd and torch.nn: gradcheck, modules, convert, masks, unbatched input, batch size.

- gradcheck in float64 through the functional API (conv1d/2d/3d, conv_transpose1d/2d/3d), with
  and without bias, on tiny shapes;
- convgen.nn modules against torch's with the same state_dict (padding modes, output_size);
- convert(model) swaps classes in place and keeps the very same parameters;
- autograd asks convolution_backward only for the gradients it needs;
- gradients of second order (create_graph=True: a gradient penalty, gradgradcheck);
- unbatched inputs; a smaller last batch builds nothing.

Every kernel is built up front in one ninja run (`prebuilt`): the workloads run once in a dry
run that records the problems they dispatch instead of running kernels, then all of them build
together. Modules and functions are compared with torch in float64.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import convgen
from convgen.api import ops

from support.builds import prebuild_dry_run
from support.reference import assert_close, generator_for, randn

F64 = torch.float64

# torch's own 'same' with an even kernel warns that it copies the input; convgen does not.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")


# ---------------------------------------------------------------------------- gradcheck cases


@dataclasses.dataclass(frozen=True)
class Functional:
    id: str
    fn: str            # the name of the function in convgen and in torch.nn.functional
    input: tuple[int, ...]
    weight: tuple[int, ...]
    kwargs: dict

    def bias_size(self) -> int:
        groups = self.kwargs.get("groups", 1)
        return self.weight[1] * groups if self.fn.startswith("conv_transpose") else self.weight[0]


FUNCTIONALS = [
    Functional("conv1d-stride2-padding1-groups2", "conv1d", (2, 4, 7), (6, 2, 3),
               dict(stride=2, padding=1, groups=2)),
    Functional("conv1d-dilation2-valid", "conv1d", (1, 3, 9), (2, 3, 3), dict(dilation=2, padding="valid")),
    Functional("conv2d-groups2-stride-dilation", "conv2d", (2, 4, 6, 5), (4, 2, 3, 2),
               dict(stride=(2, 1), padding=1, dilation=(1, 2), groups=2)),
    # 'same' with an even kernel: padding (0, 1) on H and (2, 2) on W
    Functional("conv2d-same-asymmetric", "conv2d", (1, 2, 5, 6), (3, 2, 2, 3), dict(padding="same", dilation=(1, 2))),
    Functional("conv2d-depthwise-multiplier2", "conv2d", (1, 3, 5, 5), (6, 1, 3, 3), dict(groups=3, padding=1)),
    Functional("conv3d-stride2-padding1", "conv3d", (1, 2, 4, 3, 4), (2, 2, 2, 2, 3), dict(stride=2, padding=1)),
    Functional("conv_transpose1d-output_padding1", "conv_transpose1d", (2, 4, 5), (4, 3, 3),
               dict(stride=2, padding=1, output_padding=1)),
    Functional("conv_transpose2d-groups2-output_padding", "conv_transpose2d", (1, 4, 3, 4), (4, 1, 3, 2),
               dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2)),
    Functional("conv_transpose2d-dilation2", "conv_transpose2d", (1, 2, 3, 3), (2, 2, 2, 2),
               dict(stride=2, dilation=2, output_padding=1)),
    Functional("conv_transpose3d-output_padding1", "conv_transpose3d", (1, 2, 2, 2, 2), (2, 2, 2, 2, 2),
               dict(stride=2, padding=(0, 1, 0), output_padding=1)),
]


def functional_operands(case: Functional, bias: bool, requires_grad=(True, True, True)):
    gen = generator_for(f"{case.id}-{bias}")
    x = randn(case.input, F64, gen).requires_grad_(requires_grad[0])
    w = randn(case.weight, F64, gen).requires_grad_(requires_grad[1])
    b = randn((case.bias_size(),), F64, gen).requires_grad_(requires_grad[2]) if bias else None
    return x, w, b


def call(case: Functional, x, w, b):
    return getattr(convgen, case.fn)(x, w, b, **case.kwargs)


# ---------------------------------------------------------------------------- module cases


@dataclasses.dataclass(frozen=True)
class Module:
    id: str
    cls: str           # the class name in torch.nn and in convgen.nn
    kwargs: dict
    input: tuple[int, ...]
    forward_kwargs: dict = dataclasses.field(default_factory=dict)

    def make(self, namespace, seed: int = 0):
        torch.manual_seed(seed)   # the same seed gives torch's and convgen's modules the same init
        return getattr(namespace, self.cls)(**self.kwargs)


MODULES = [
    Module("Conv1d-groups2", "Conv1d", dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1,
                                            groups=2), (2, 4, 9)),
    Module("Conv2d-stride-dilation", "Conv2d", dict(in_channels=4, out_channels=6, kernel_size=(3, 2),
                                                    stride=(2, 1), padding=(1, 0), dilation=(1, 2)), (2, 4, 7, 8)),
    Module("Conv2d-same-no-bias", "Conv2d", dict(in_channels=4, out_channels=4, kernel_size=(2, 3), padding="same",
                                                 bias=False), (1, 4, 5, 6)),
    Module("Conv2d-reflect", "Conv2d", dict(in_channels=3, out_channels=4, kernel_size=3, padding=1,
                                            padding_mode="reflect"), (2, 3, 6, 6)),
    Module("Conv2d-reflect-same-dilation", "Conv2d", dict(in_channels=3, out_channels=2, kernel_size=(2, 3),
                                                          padding="same", dilation=(1, 2), padding_mode="reflect"),
           (1, 3, 6, 7)),
    Module("Conv2d-circular", "Conv2d", dict(in_channels=3, out_channels=4, kernel_size=3, padding=(1, 2),
                                             padding_mode="circular"), (2, 3, 6, 7)),
    Module("Conv2d-replicate-stride2", "Conv2d", dict(in_channels=3, out_channels=2, kernel_size=3, stride=2,
                                                      padding=1, padding_mode="replicate"), (1, 3, 7, 7)),
    Module("Conv3d", "Conv3d", dict(in_channels=2, out_channels=4, kernel_size=3, stride=(1, 2, 2), padding=1),
           (1, 2, 4, 5, 5)),
    Module("ConvTranspose1d", "ConvTranspose1d", dict(in_channels=4, out_channels=2, kernel_size=3, stride=2,
                                                      padding=1, output_padding=1), (2, 4, 5)),
    Module("ConvTranspose2d-groups2", "ConvTranspose2d", dict(in_channels=4, out_channels=6, kernel_size=(3, 2),
                                                              stride=2, padding=1, output_padding=1, groups=2),
           (1, 4, 4, 5)),
    # output_size picks output_padding (1, 0): 10x9 instead of the 9x9 that no output_padding gives
    Module("ConvTranspose2d-output_size", "ConvTranspose2d", dict(in_channels=4, out_channels=2, kernel_size=3,
                                                                  stride=2, padding=1), (1, 4, 5, 5),
           dict(output_size=[10, 9])),
    Module("ConvTranspose3d", "ConvTranspose3d", dict(in_channels=2, out_channels=2, kernel_size=3, stride=2,
                                                      padding=1, output_padding=1), (1, 2, 3, 3, 3)),
]


def small_model() -> nn.Sequential:
    """A torch model with conv modules at two depths, a padding mode and a transposed layer."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2, padding_mode="reflect"), nn.ReLU(),
        nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),
        nn.Sequential(nn.Conv2d(4, 2, 1, bias=False)),
    ).double()


def forward_backward(fn: Callable, inputs: list[torch.Tensor | None], gy_seed: str):
    """fn(*inputs) and the gradients of every input that requires one, for a random grad_output."""
    y = fn(*inputs)
    gy = randn(y.shape, y.dtype, generator_for(gy_seed))
    wanted = [t for t in inputs if t is not None and t.requires_grad]
    grads = torch.autograd.grad(y, wanted, gy) if wanted else ()
    return y, grads


def module_run(module: nn.Module, case: Module, x: torch.Tensor):
    params = [x, *module.parameters()]
    y = module(x, **case.forward_kwargs)
    gy = randn(y.shape, y.dtype, generator_for(case.id))
    return y, torch.autograd.grad(y, params, gy)


# (requires_grad of input, weight, bias; bias None when absent) → the output_mask autograd needs
MASK_CASES = [
    ((True, True, True), (True, True, True)),
    ((False, True, True), (False, True, True)),
    ((True, False, False), (True, False, False)),
    ((True, False, True), (True, False, True)),
    ((False, True, False), (False, True, False)),
    ((False, False, True), (False, False, True)),
    ((True, True, None), (True, True, False)),
    ((False, True, None), (False, True, False)),
]
MASK_CASE = FUNCTIONALS[2]   # conv2d with groups, stride, dilation

UNBATCHED = [
    Functional("conv1d-unbatched", "conv1d", (4, 9), (6, 2, 3), dict(padding=1, groups=2)),
    Functional("conv2d-unbatched", "conv2d", (3, 6, 5), (4, 3, 3, 3), dict(stride=2, padding=1)),
    Functional("conv3d-unbatched", "conv3d", (2, 3, 4, 4), (2, 2, 2, 2, 2), dict(padding=(1, 0, 1))),
    Functional("conv_transpose2d-unbatched", "conv_transpose2d", (4, 3, 3), (4, 2, 3, 3),
               dict(stride=2, output_padding=1)),
]

BATCH = Module("Conv2d-batch", "Conv2d", dict(in_channels=4, out_channels=8, kernel_size=3, padding=1), (8, 4, 9, 9))


# ---------------------------------------------------------------------------- prebuild


def workloads():
    """Every convgen call of this module's tests, as thunks (batch 3 of test_smaller_last_batch left out)."""
    for case in FUNCTIONALS:
        for bias in (True, False):
            yield lambda case=case, bias=bias: forward_backward(
                lambda *t: call(case, *t), list(functional_operands(case, bias)), case.id)
    for case in MODULES:
        yield lambda case=case: module_run(case.make(convgen.nn).double(), case,
                                           randn(case.input, F64, generator_for(case.id)).requires_grad_())
    yield lambda: small_model_run(convgen.convert(small_model()))
    yield frozen_module_run
    for requires, _ in MASK_CASES:
        yield lambda requires=requires: forward_backward(lambda *t: call(MASK_CASE, *t),
                                                         list(mask_operands(requires)), "mask")
    for case in UNBATCHED:
        yield lambda case=case: forward_backward(lambda *t: call(case, *t), list(functional_operands(case, True)),
                                                 case.id)
    yield lambda: gradient_penalty(convgen.conv2d)
    for case in SECOND_ORDER:
        yield lambda case=case: second_order_run(case, getattr(convgen, case.fn))
    yield lambda: module_run(BATCH.make(convgen.nn), BATCH,
                             randn(BATCH.input, torch.float32, generator_for(BATCH.id)).requires_grad_())


@pytest.fixture(scope="module")
def prebuilt():
    prebuild_dry_run(workloads())
    return convgen.stats()["builds"]


@pytest.fixture
def no_builds(prebuilt):
    """Asserts that the test built nothing: the prebuild covered it."""
    builds = convgen.stats()["builds"]
    yield
    assert convgen.stats()["builds"] == builds, "the test built a kernel that the prebuild did not"


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("case", FUNCTIONALS, ids=lambda c: c.id)
def test_gradcheck(case, bias, no_builds, one_thread):
    x, w, b = functional_operands(case, bias)
    inputs = (x, w, b) if bias else (x, w)
    assert torch.autograd.gradcheck(lambda x, w, b=None: call(case, x, w, b), inputs)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("case", FUNCTIONALS, ids=lambda c: c.id)
def test_functional_matches_torch(case, bias, no_builds):
    """The same values and gradients as torch.nn.functional (string padding included)."""
    inputs = list(functional_operands(case, bias))
    y, grads = forward_backward(lambda *t: call(case, *t), inputs, case.id)
    inputs_t = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    y_t, grads_t = forward_backward(lambda x, w, b: getattr(F, case.fn)(x, w, b, **case.kwargs), inputs_t, case.id)
    assert_close(y, y_t, F64, "output")
    for name, g, g_t in zip(("input", "weight", "bias"), grads, grads_t):
        assert_close(g, g_t, F64, f"gradient of {name}")


@pytest.mark.parametrize("case", MODULES, ids=lambda c: c.id)
def test_module_matches_torch(case, no_builds):
    theirs, ours = case.make(nn), case.make(convgen.nn)
    assert isinstance(ours, getattr(nn, case.cls)) and type(ours) is not getattr(nn, case.cls)
    state, state_t = ours.state_dict(), theirs.state_dict()
    assert list(state) == list(state_t)
    assert all(torch.equal(state[k], state_t[k]) for k in state)
    ours.load_state_dict(state_t)          # torch's state_dict loads as it is
    ours.double(), theirs.double()
    x = randn(case.input, F64, generator_for(case.id))
    y, grads = module_run(ours, case, x.clone().requires_grad_())
    y_t, grads_t = module_run(theirs, case, x.clone().requires_grad_())
    assert_close(y, y_t, F64, "output")
    names = ["input"] + [n for n, _ in ours.named_parameters()]
    for name, g, g_t in zip(names, grads, grads_t):
        assert_close(g, g_t, F64, f"gradient of {name}")


def small_model_run(model: nn.Module):
    x = randn((2, 3, 8, 8), F64, generator_for("small-model")).requires_grad_()
    y = model(x)
    gy = randn(y.shape, F64, generator_for("small-model-grad"))
    return y, torch.autograd.grad(y, [x, *model.parameters()], gy)


def test_convert_swaps_in_place_and_keeps_parameters(no_builds):
    model = small_model()
    original = copy.deepcopy(model)
    params = list(model.named_parameters())
    buffers = list(model.buffers())
    converted = convgen.convert(model)

    assert converted is model
    swapped = {name: type(m) for name, m in model.named_modules() if isinstance(m, nn.modules.conv._ConvNd)}
    assert swapped == {"0": convgen.nn.Conv2d, "2": convgen.nn.Conv2d, "4": convgen.nn.ConvTranspose2d,
                       "5.0": convgen.nn.Conv2d}
    assert isinstance(model[1], nn.ReLU) and type(model[5]) is nn.Sequential
    after = list(model.named_parameters())
    assert [n for n, _ in after] == [n for n, _ in params]
    assert all(p is q for (_, p), (_, q) in zip(params, after)), "convert must keep the same Parameter objects"
    assert all(p is q for p, q in zip(buffers, model.buffers()))
    state, state_t = model.state_dict(), original.state_dict()
    assert list(state) == list(state_t) and all(torch.equal(state[k], state_t[k]) for k in state)

    y, grads = small_model_run(model)
    y_t, grads_t = small_model_run(original)
    assert_close(y, y_t, F64, "output")
    for (name, _), g, g_t in zip([("input", None), *after], grads, grads_t):
        assert_close(g, g_t, F64, f"gradient of {name}")


def test_convert_leaves_subclasses_alone():
    """A subclass of a torch conv module may do more in its forward: convert keeps its class."""
    class Custom(nn.Conv2d):
        pass

    model = nn.Sequential(Custom(2, 2, 1), nn.Conv1d(2, 2, 1))
    convgen.convert(model)
    assert type(model[0]) is Custom and type(model[1]) is convgen.nn.Conv1d


def mask_operands(requires):
    x, w, b = functional_operands(MASK_CASE, requires[2] is not None)
    x.requires_grad_(requires[0])
    w.requires_grad_(requires[1])
    if b is not None:
        b.requires_grad_(requires[2])
    return x, w, b


@pytest.mark.parametrize("requires, mask", MASK_CASES,
                         ids=[f"requires-x{r[0]:d}-w{r[1]:d}-b{'-' if r[2] is None else int(r[2])}"
                              for r, _ in MASK_CASES])
def test_backward_asks_only_needed_gradients(requires, mask, monkeypatch, no_builds):
    asked = []
    real = ops.convolution_backward

    def recording(*args):
        asked.append(tuple(args[-1]))
        return real(*args)

    monkeypatch.setattr(ops, "convolution_backward", recording)
    inputs = list(mask_operands(requires))
    y, grads = forward_backward(lambda *t: call(MASK_CASE, *t), inputs, "mask")
    assert asked == [mask]

    monkeypatch.undo()
    inputs_t = [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    y_t, grads_t = forward_backward(lambda x, w, b: F.conv2d(x, w, b, **MASK_CASE.kwargs), inputs_t, "mask")
    assert len(grads) == len(grads_t) == sum(mask)
    for g, g_t in zip(grads, grads_t):
        assert_close(g, g_t, F64, "gradient")


def frozen_module_run():
    """A module whose weight is frozen, fed an input that needs no gradient."""
    case = MODULES[1]
    module = case.make(convgen.nn).double()
    module.weight.requires_grad_(False)
    y = module(randn(case.input, F64, generator_for(case.id)))
    y.backward(torch.ones_like(y))
    return module, y


def test_frozen_module_asks_only_bias_gradient(monkeypatch, no_builds):
    asked = []
    real = ops.convolution_backward
    monkeypatch.setattr(ops, "convolution_backward", lambda *a: asked.append(tuple(a[-1])) or real(*a))
    module, y = frozen_module_run()
    assert asked == [(False, False, True)]
    assert module.weight.grad is None
    assert_close(module.bias.grad, torch.ones_like(y).sum((0, 2, 3)), F64, "bias gradient")


def test_no_backward_without_gradients(monkeypatch, no_builds):
    """Nothing requires a gradient: autograd records nothing and convgen's backward never runs."""
    monkeypatch.setattr(ops, "convolution_backward", lambda *a: pytest.fail("convolution_backward was called"))
    x, w, b = functional_operands(MASK_CASE, True, requires_grad=(False, False, False))
    y = call(MASK_CASE, x, w, b)
    assert not y.requires_grad and y.grad_fn is None


@pytest.mark.parametrize("case", UNBATCHED, ids=lambda c: c.id)
def test_unbatched_input(case, no_builds):
    inputs = list(functional_operands(case, True))
    y, grads = forward_backward(lambda *t: call(case, *t), inputs, case.id)
    inputs_t = [t.detach().clone().requires_grad_() for t in inputs]
    y_t, grads_t = forward_backward(lambda x, w, b: getattr(F, case.fn)(x, w, b, **case.kwargs), inputs_t, case.id)
    assert y.shape == y_t.shape and y.dim() == len(case.input)
    assert_close(y, y_t, F64, "output")
    for name, g, g_t in zip(("input", "weight", "bias"), grads, grads_t):
        assert_close(g, g_t, F64, f"gradient of {name}")


def test_smaller_last_batch_builds_nothing(prebuilt):
    """Batch 8 then a last batch of 3: the batch size is a run-time argument, so no new kernel."""
    module = BATCH.make(convgen.nn)
    x8 = randn(BATCH.input, torch.float32, generator_for(BATCH.id))
    module_run(module, BATCH, x8.requires_grad_())
    builds = convgen.stats()["builds"]
    x3 = randn((3, *BATCH.input[1:]), torch.float32, generator_for("batch3"))
    y, grads = module_run(module, BATCH, x3.clone().requires_grad_())
    assert convgen.stats()["builds"] == builds, "a smaller batch built a new kernel"
    assert y.shape == (3, *y.shape[1:])
    # against torch's module in float64 (the float32 values upcast exactly)
    y64, grads64 = module_run(BATCH.make(nn).double(), BATCH, x3.double().requires_grad_())
    for name, got, want in zip(["output", "input", "weight", "bias"], [y, *grads], [y64, *grads64]):
        assert_close(got, want, torch.float32, name)


def gradient_penalty(conv):
    """A loss with a gradient penalty (as WGAN-GP's): its weight gradient needs the second
    derivative of the convolution, reached through create_graph=True."""
    gen = generator_for("gradient-penalty")
    x = randn((1, 2, 5, 5), F64, gen).requires_grad_()
    w = randn((3, 2, 3, 3), F64, gen).requires_grad_()
    y = conv(x, w, None, padding=1)
    grad_x, = torch.autograd.grad(y.sum(), x, create_graph=True)
    loss = y.square().mean() + grad_x.square().sum()
    loss.backward()
    return w.grad


def test_gradient_penalty_is_never_silently_wrong(prebuilt):
    """DESIGN.md: never a silently wrong answer. Either convgen differentiates its backward, or it
    refuses create_graph=True with an error."""
    try:
        got = gradient_penalty(convgen.conv2d)
    except RuntimeError as e:   # a clear refusal is acceptable
        assert "differentiable" in str(e) or "double backward" in str(e), str(e)
        return
    assert_close(got, gradient_penalty(F.conv2d), F64, "weight gradient of a loss with a gradient penalty")


# Gradients of second order: normal and transposed, 1-D and 2-D, grouped, strided, 'same'.
SECOND_ORDER = [FUNCTIONALS[0], FUNCTIONALS[2], FUNCTIONALS[3], FUNCTIONALS[7]]


def second_order_run(case: Functional, fn: Callable):
    """The gradients of a loss made of first-order gradients (taken with create_graph=True) with
    respect to input, weight, bias and the first grad_output."""
    x, w, b = functional_operands(case, True)
    y = fn(x, w, b, **case.kwargs)
    gy = randn(y.shape, F64, generator_for(f"{case.id}-second-order")).requires_grad_()
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), gy, create_graph=True)
    loss = gx.square().sum() + (gw * w).sum() + gb.square().sum() + (y * y).sum()
    return torch.autograd.grad(loss, (x, w, b, gy))


@pytest.mark.parametrize("case", SECOND_ORDER, ids=lambda c: c.id)
def test_second_order_gradients_match_torch(case, no_builds):
    got = second_order_run(case, getattr(convgen, case.fn))
    want = second_order_run(case, getattr(F, case.fn))
    for name, g, g_t in zip(("input", "weight", "bias", "grad_output"), got, want):
        assert_close(g, g_t, F64, f"second-order gradient of {name}")


@pytest.mark.parametrize("case", SECOND_ORDER, ids=lambda c: c.id)
def test_gradgradcheck(case, no_builds, one_thread):
    x, w, b = functional_operands(case, True)
    assert torch.autograd.gradgradcheck(lambda x, w, b: call(case, x, w, b), (x, w, b))
