"""`convgen.enabled()`, `enable()`, `disable()`: convgen serves torch's own convolutions.

- a plain torch model that mixes modules and functional calls (Conv2d with bias, a stride-2
  grouped Conv2d without bias, a ConvTranspose2d, a Conv1d module and a functional conv1d) trains
  one SGD step inside the block: loss and gradients against torch's model in float64 (float64
  within the float64 bound; float32 within the larger of its bound and twice torch's own float32
  error, the rule of `convgen bench`), the counters prove that convgen served every forward and
  backward call and left none to torch, and outside the block torch computes again (its results
  bit for bit what torch gave before any block, no counter moves);
- second-order gradients (create_graph) inside the block;
- nesting: enabled(False) inside enabled() inside enabled(False), and an exception inside a
  block, restore the outer state;
- threads: a block serves its own thread only; enable()/disable() set every thread's default;
- the registration is withdrawn when the last block closes (single-threaded), and is there
  while a block is open;
- torch.compile (fullgraph; aot_eager and the default inductor backend) and torch.export inside
  the block trace torch's ops and run on convgen's kernels, with torch's results;
- torch.func transforms (vmap of grad) inside the block;
- collect() inside a block lets torch compute and builds nothing;
- a dtype convgen has no kernels for (int64) is left to torch inside the block;
- convgen's own calls of ATen (bench's torch side and reference) stay torch's inside a block.
"""

from __future__ import annotations

import copy
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import convgen
from convgen.api import serve_aten

from support.reference import assert_close, generator_for, randn, rel_err, tolerance

F64 = torch.float64
CALLS = 5   # convolutions per forward of MixedNet, each with a backward call


class MixedNet(nn.Module):
    """Modules and functional calls: Conv2d + bias, grouped stride-2 Conv2d without bias,
    ConvTranspose2d, then over the flattened image a Conv1d module and a functional conv1d."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=4, bias=False)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.line = nn.Conv1d(4, 6, 5, padding=2)
        self.w1 = nn.Parameter(torch.randn(5, 6, 3) * 0.3)
        self.b1 = nn.Parameter(torch.randn(5))

    def forward(self, x):
        y = torch.tanh(self.stem(x))
        y = torch.tanh(self.grouped(y))
        y = self.up(y).flatten(2)
        y = torch.tanh(self.line(y))
        return F.conv1d(y, self.w1, self.b1, stride=2, padding=1)


def make(dtype, test_id):
    """A fresh MixedNet (weights seeded from the test's id) and an input."""
    torch.manual_seed(generator_for(test_id).initial_seed())
    model = MixedNet().to(dtype)
    return model, randn((2, 3, 10, 10), dtype, generator_for(test_id))


def step(model, x, target):
    """One SGD step of mean-squared error: the loss and the gradients, in parameter order."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), target)
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    optimizer.step()
    return loss.detach(), grads


def served(before: dict) -> dict:
    after = convgen.stats()
    return {k: after[k] - before[k] for k in ("aten_forward", "aten_backward", "aten_fallbacks")}


@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=["f64", "f32"])
def test_training_step_served_and_equal_to_torch(dtype, request):
    model, x = make(dtype, request.node.nodeid)
    reference = copy.deepcopy(model).to(F64)
    torch_model = copy.deepcopy(model)
    target = randn((2, 5, 50), dtype, generator_for(request.node.nodeid + "target"))
    initial = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        before_any = torch_model(x)
    ref_loss, ref_grads = step(reference, x.to(F64), target.to(F64))
    torch_loss, torch_grads = step(torch_model, x, target)

    before = convgen.stats()
    with convgen.enabled():
        loss, grads = step(model, x, target)
    assert served(before) == {"aten_forward": CALLS, "aten_backward": CALLS, "aten_fallbacks": 0}

    names = [name for name, _ in reference.named_parameters()]
    for what, got, ref, theirs in [("loss", loss, ref_loss, torch_loss),
                                   *zip(names, grads, ref_grads, torch_grads)]:
        if dtype == F64:
            assert_close(got, ref, dtype, what, terms=4096)
        else:   # a whole model in float32: no worse than the bound, or than twice torch's own error
            bound = max(tolerance(dtype, 4096), 2 * rel_err(theirs, ref))
            err = rel_err(got, ref)
            assert err <= bound, f"{what}: relative error {err:.3e} > {bound:.1e} (torch's {rel_err(theirs, ref):.1e})"

    # outside the block torch computes again: the very bits it gave before any block, no counter moves
    before = convgen.stats()
    with torch.no_grad():
        model.load_state_dict(initial)
        after_block = model(x)
    assert served(before) == {"aten_forward": 0, "aten_backward": 0, "aten_fallbacks": 0}
    assert torch.equal(after_block, before_any)


def test_second_order_gradients(request):
    model, x = make(F64, request.node.nodeid)
    x.requires_grad_(True)
    reference = copy.deepcopy(model)

    def second_order(m, inp):
        out = m(inp).square().sum()
        (gx,) = torch.autograd.grad(out, inp, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), list(m.parameters()))

    expected = second_order(reference, x)
    before = convgen.stats()
    with convgen.enabled():
        got = second_order(model, x)
    counts = served(before)
    assert counts["aten_forward"] > CALLS and counts["aten_backward"] > CALLS and counts["aten_fallbacks"] == 0
    for (name, _), g, e in zip(model.named_parameters(), got, expected):
        assert_close(g, e, F64, f"second-order gradient of {name}", terms=4096)


def conv_served(x, w) -> bool:
    """Run one conv; whether convgen served it (and it equals torch's own)."""
    before = convgen.stats()["aten_forward"]
    y = F.conv2d(x, w, padding=1)
    with convgen.enabled(False):
        assert torch.allclose(y, F.conv2d(x, w, padding=1), rtol=1e-12, atol=1e-12)
    return convgen.stats()["aten_forward"] - before == 1


def tiny(request):
    gen = generator_for(request.node.nodeid)
    return randn((1, 2, 5, 5), F64, gen), randn((3, 2, 3, 3), F64, gen)


def test_nesting_and_exceptions_restore_the_outer_state(request):
    x, w = tiny(request)
    assert not convgen.is_enabled() and not conv_served(x, w)
    with convgen.enabled():
        assert convgen.is_enabled() and conv_served(x, w)
        with convgen.enabled(False):
            assert not convgen.is_enabled() and not conv_served(x, w)
            with convgen.enabled():
                assert conv_served(x, w)
            assert not conv_served(x, w)
        assert conv_served(x, w)
        with pytest.raises(ZeroDivisionError):
            with convgen.enabled(False):
                1 / 0
        assert convgen.is_enabled() and conv_served(x, w)
    with pytest.raises(KeyError):
        with convgen.enabled():
            raise KeyError("inside")
    assert not convgen.is_enabled() and not conv_served(x, w)

    @convgen.enabled()
    def decorated():
        return conv_served(x, w)
    assert decorated() and not conv_served(x, w)
    with pytest.raises(TypeError, match="on must be True or False"):
        convgen.enabled("yes")


def test_threads_blocks_are_per_thread_enable_is_global(request):
    x, w = tiny(request)
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def other():
        inside.wait(timeout=30)
        seen["other_in_block"] = conv_served(x, w)    # the main thread's block is not this thread's
        with convgen.enabled():
            seen["own_block"] = conv_served(x, w)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with convgen.enabled():
        inside.set()
        done.wait(timeout=30)
        assert conv_served(x, w)
    thread.join()
    assert seen == {"other_in_block": False, "own_block": True}

    try:
        convgen.enable()
        assert conv_served(x, w)
        worker = threading.Thread(target=lambda: seen.update(enabled_default=conv_served(x, w)))
        worker.start()
        worker.join()
        with convgen.enabled(False):
            assert not conv_served(x, w)
        assert seen["enabled_default"]
    finally:
        convgen.disable()
    assert not conv_served(x, w)


def test_registration_lives_while_needed():
    registered = lambda: torch._C._dispatch_has_kernel_for_dispatch_key("aten::convolution", "CPU")  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no "Overriding a previously registered kernel" or other noise
        with convgen.enabled():
            pass
    with convgen.enabled():
        assert registered() and serve_aten.registered()
        with convgen.enabled():
            assert registered()
        assert registered()
    # withdrawn when the last block closes, unless other Python threads run (then it stays)
    assert serve_aten.registered() == registered() == (threading.active_count() > 1)


def test_compile_and_export_inside_the_block(request):
    torch._dynamo.reset()
    model, x = make(F64, request.node.nodeid)
    x.requires_grad_(True)
    expected = model(x)
    expected_grads = torch.autograd.grad(expected.sum(), [x, *model.parameters()])
    with convgen.enabled():
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        before = convgen.stats()
        out = compiled(x)
        grads = torch.autograd.grad(out.sum(), [x, *model.parameters()])
        counts = served(before)
        exported = torch.export.export(model, (x.detach(),))
        before = convgen.stats()
        exported_out = exported.module()(x.detach())
        exported_counts = served(before)
    assert counts == {"aten_forward": CALLS, "aten_backward": CALLS, "aten_fallbacks": 0}
    assert exported_counts == {"aten_forward": CALLS, "aten_backward": 0, "aten_fallbacks": 0}
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert not any("convgen" in t for t in targets) and any("conv" in t for t in targets), targets
    assert_close(out, expected, F64, "compiled output", terms=4096)
    assert_close(exported_out, expected, F64, "exported output", terms=4096)
    for g, e in zip(grads, expected_grads):
        assert_close(g, e, F64, "compiled gradient", terms=4096)


def test_collect_inside_the_block_lets_torch_compute(request):
    model, x = make(torch.float32, request.node.nodeid)
    outside = convgen.collect(model, x)
    before = convgen.stats()
    with convgen.enabled():
        inside = convgen.collect(model, x)
    after = convgen.stats()
    assert {p.key() for p in inside} == {p.key() for p in outside}
    assert all(after[k] == before[k] for k in ("builds", "aten_forward", "aten_backward", "ninja_runs"))


def test_unsupported_dtype_is_left_to_torch():
    x = torch.randint(-3, 4, (1, 2, 5, 5))
    w = torch.randint(-3, 4, (3, 2, 3, 3))
    expected = F.conv2d(x, w, padding=1)
    before = convgen.stats()
    with convgen.enabled():
        got = F.conv2d(x, w, padding=1)
    assert served(before) == {"aten_forward": 0, "aten_backward": 0, "aten_fallbacks": 1}
    assert torch.equal(got, expected)


def test_torch_func_transforms_inside_the_block(request):
    """vmap of grad (functorch) unwraps to plain tensors before the CPU kernel: convgen serves."""
    gen = generator_for(request.node.nodeid)
    x, w = randn((3, 2, 6, 6), F64, gen), randn((4, 2, 3, 3), F64, gen)

    def loss(w_, x_):
        return F.conv2d(x_.unsqueeze(0), w_, padding=1).square().sum()

    per_sample = torch.vmap(torch.func.grad(loss), in_dims=(None, 0))
    expected = per_sample(w, x)
    before = convgen.stats()
    with convgen.enabled():
        got = per_sample(w, x)
    counts = served(before)
    assert counts["aten_forward"] >= 1 and counts["aten_backward"] >= 1 and counts["aten_fallbacks"] == 0
    assert_close(got, expected, F64, "per-sample weight gradients", terms=4096)


def test_bench_inside_the_block_times_torch_itself():
    """convgen's own calls of ATen (bench's torch side and reference) are torch's, even in a block."""
    from convgen.bench import bench, suites
    from convgen import cli
    from convgen.codegen.ir import DType, Layout

    shape = suites.BenchShape.from_problem(cli.problem_from_args(cli.parser().parse_args(
        ["show", "--input", "1,2,6,6", "--weight", "3,2,3,3", "--padding", "1"])))
    options = bench.Options(dtype=DType.F32, layout=Layout.CONTIGUOUS, repeat=1, min_time=0.0)
    before = convgen.stats()
    with convgen.enabled():
        report = bench.run([("problem", [shape])], options)
    assert served(before) == {"aten_forward": 0, "aten_backward": 0, "aten_fallbacks": 0}
    assert bench.ok(report)


def test_inductor_compiled_model_inside_the_block(request):
    """The default backend: inductor's CPU code calls aten.convolution(_backward) as extern kernels."""
    torch._dynamo.reset()
    model, x = make(F64, request.node.nodeid)
    expected = model(x)
    expected_grads = torch.autograd.grad(expected.square().sum(), list(model.parameters()))
    with convgen.enabled():
        compiled = torch.compile(model, fullgraph=True)
        before = convgen.stats()
        out = compiled(x)
        grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
        counts = served(before)
    assert counts == {"aten_forward": CALLS, "aten_backward": CALLS, "aten_fallbacks": 0}
    assert_close(out, expected, F64, "inductor output", terms=4096)
    for (name, _), g, e in zip(model.named_parameters(), grads, expected_grads):
        assert_close(g, e, F64, f"inductor gradient of {name}", terms=4096)
