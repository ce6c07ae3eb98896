"""The eager launcher (runtime/api/eager.py): a compiled module that runs forward kernels and records
their autograd nodes in C++.

It is built once, here into this session's cache (about 20-30 s). Then:
- every functional case of test_autograd gives, through the launcher, bit for bit the output
  and gradients the Python path gives, for every combination of operands that require grad,
  and passes gradcheck and gradgradcheck;
- its node behaves as the Python autograd Function does: errors raised in the backward reach
  the caller with their own type, in-place changes and a second backward are refused, forward-
  mode AD takes the Python path, no gradient flows where none is needed;
- CONVGEN_LAUNCHER=0 keeps calls on the Python path;
- a compile failure, a corrupt artifact and an unusable compiler are reported and lose nothing:
  eager calls keep working on the Python path.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import stat
import warnings
from pathlib import Path

import pytest
import torch

import convgen
from convgen.building import cache
from convgen.api import eager, library, ops
from convgen.codegen.errors import BuildError

from support.reference import assert_close, generator_for, randn
from test_autograd import FUNCTIONALS, call, functional_operands

F64 = torch.float64
REQUIRES = [r for r in itertools.product((False, True), repeat=3) if any(r)]

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")


@pytest.fixture(scope="module")
def launcher():
    """The launcher, built into this session's cache; calls remembered before it are forgotten."""
    eager.setup()
    ops.forget_calls()
    assert eager.module() is not None, eager.status()
    yield eager.module()
    ops.forget_calls()


@pytest.fixture
def python_path(monkeypatch):
    """Calls made inside `with python_path():` take the Python path."""
    @contextlib.contextmanager
    def use():
        ops.forget_calls()
        monkeypatch.setenv("CONVGEN_LAUNCHER", "0")
        try:
            yield
        finally:
            monkeypatch.delenv("CONVGEN_LAUNCHER")
            ops.forget_calls()
    return use


def _run(case, bias, requires, dtype=F64):
    x, w, b = functional_operands(case, bias, requires)
    x, w = x.detach().to(dtype).requires_grad_(requires[0]), w.detach().to(dtype).requires_grad_(requires[1])
    if b is not None:
        b = b.detach().to(dtype).requires_grad_(requires[2])
    y = call(case, x, w, b)
    grad = randn(y.shape, dtype, generator_for(f"{case.id}-grad"))
    y.backward(grad)
    grads = [t.grad if t is not None and t.requires_grad else None for t in (x, w, b)]
    return y, grads


@pytest.mark.parametrize("case", FUNCTIONALS, ids=lambda c: c.id)
@pytest.mark.parametrize("bias", [True, False])
def test_same_results_as_the_python_path(case, bias, launcher, python_path):
    for requires in REQUIRES:
        if requires[2] and not bias:
            continue
        for dtype in (F64, torch.float32):
            y, grads = _run(case, bias, requires, dtype)
            assert y.grad_fn.name() == "ConvgenConvolutionBackward"
            with python_path():
                y_ref, grads_ref = _run(case, bias, requires, dtype)
                assert "ConvgenConvolutionBackward" not in y_ref.grad_fn.name()
            assert torch.equal(y.detach(), y_ref.detach()), (case.id, requires, dtype)
            assert y.is_contiguous() == y_ref.is_contiguous() and y.stride() == y_ref.stride()
            for name, g, g_ref in zip(("input", "weight", "bias"), grads, grads_ref):
                assert (g is None) == (g_ref is None), (name, requires)
                if g is not None:
                    assert torch.equal(g, g_ref), (case.id, name, requires, dtype)


@pytest.mark.parametrize("case", FUNCTIONALS, ids=lambda c: c.id)
def test_gradcheck_and_gradgradcheck(case, launcher):
    x, w, b = functional_operands(case, True)
    fn = lambda x, w, b: call(case, x, w, b)   # noqa: E731
    assert call(case, x, w, b).grad_fn.name() == "ConvgenConvolutionBackward"
    assert torch.autograd.gradcheck(fn, (x, w, b))
    assert torch.autograd.gradgradcheck(fn, (x, w, b))


def test_matches_torch_channels_last_and_non_contiguous(launcher):
    gen = generator_for("launcher-formats")
    x = randn((2, 5, 9, 8), F64, gen).contiguous(memory_format=torch.channels_last).requires_grad_()
    w = randn((6, 5, 3, 3), F64, gen)[:, :, :, :].transpose(2, 3).requires_grad_()   # non-contiguous weight
    b = randn((6,), F64, gen).requires_grad_()
    y = convgen.conv2d(x, w, b, stride=2, padding=1)
    assert y.grad_fn.name() == "ConvgenConvolutionBackward"
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    ref = torch.nn.functional.conv2d(xr, wr, br, stride=2, padding=1)
    assert y.is_contiguous(memory_format=torch.channels_last) == ref.is_contiguous(memory_format=torch.channels_last)
    assert_close(y, ref, F64, "output")
    grad = randn(y.shape, F64, gen)
    y.backward(grad)
    ref.backward(grad)
    for name, t, r in (("input", x, xr), ("weight", w, wr), ("bias", b, br)):
        assert_close(t.grad, r.grad, F64, name)


def test_backward_errors_keep_their_type(launcher, monkeypatch):
    class Boom(Exception):
        pass

    def fail(*args, **kwargs):
        raise Boom("raised in the gradient formula")

    x, w, b = functional_operands(FUNCTIONALS[0], True)
    y = call(FUNCTIONALS[0], x, w, b)
    monkeypatch.setattr(library, "convolution_grads", fail)
    with pytest.raises(Boom, match="raised in the gradient formula"):
        y.sum().backward()


def test_in_place_change_and_second_backward_are_refused(launcher):
    x, w, b = functional_operands(FUNCTIONALS[2], True)
    y = call(FUNCTIONALS[2], x, w, b)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()
    y = call(FUNCTIONALS[2], x, w, b)
    with torch.no_grad():
        w.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_forward_mode_ad_takes_the_python_path(launcher, python_path):
    import torch.autograd.forward_ad as fwAD

    x, w, b = functional_operands(FUNCTIONALS[2], True)
    errors = []
    for path in ("launcher", "python"):
        with fwAD.dual_level(), (python_path() if path == "python" else contextlib.nullcontext()):
            dual = fwAD.make_dual(x.detach(), torch.ones_like(x))
            with pytest.raises(Exception) as info:
                call(FUNCTIONALS[2], dual, w, b)
            errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


def test_no_node_without_a_gradient(launcher):
    x, w, b = (t.detach() for t in functional_operands(FUNCTIONALS[2], True))
    y = call(FUNCTIONALS[2], x, w, b)
    assert y.grad_fn is None and not y.requires_grad
    with torch.no_grad():
        y = call(FUNCTIONALS[2], x, w.requires_grad_(), b)
    assert y.grad_fn is None and not y.requires_grad


def test_only_needed_gradients_are_computed(launcher, monkeypatch):
    asked = []
    real = library.convolution_grads

    def spy(calls, grad_output, input, weight, args, mask):
        asked.append(tuple(mask))
        return real(calls, grad_output, input, weight, args, mask)

    monkeypatch.setattr(library, "convolution_grads", spy)
    x, w, b = functional_operands(FUNCTIONALS[2], True, (False, True, False))
    call(FUNCTIONALS[2], x, w, b).sum().backward()
    assert asked == [(False, True, False)]
    assert x.grad is None and b.grad is None and w.grad is not None


def test_disabled_by_the_knob(launcher, monkeypatch):
    monkeypatch.setenv("CONVGEN_LAUNCHER", "0")
    ops.forget_calls()
    try:
        assert eager.module() is None and "CONVGEN_LAUNCHER=0" in eager.status()
        x, w, b = functional_operands(FUNCTIONALS[2], True)
        assert call(FUNCTIONALS[2], x, w, b).grad_fn.name() != "ConvgenConvolutionBackward"
    finally:
        monkeypatch.delenv("CONVGEN_LAUNCHER")
        ops.forget_calls()


def test_setup_cli_reports_the_launcher(launcher, capsys):
    from convgen import cli

    assert cli.main(["setup"]) == 0
    out = capsys.readouterr().out
    assert "convgen_eager" in out and "the eager launcher, built for torch" in out
    assert "shape-generic kernels: 16" in out   # four kernel ops in four dtypes (runtime/dispatch/tiers.py)


# ---------------------------------------------------------------------------- failures lose nothing


@pytest.fixture
def own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path / "cache"))
    ops.forget_calls()
    yield tmp_path / "cache"
    ops.forget_calls()


def _still_computes():
    x, w, b = functional_operands(FUNCTIONALS[2], True)
    y = call(FUNCTIONALS[2], x, w, b)
    assert y.grad_fn.name() != "ConvgenConvolutionBackward"
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    ref = torch.nn.functional.conv2d(xr, wr, br, **FUNCTIONALS[2].kwargs)
    assert_close(y, ref, F64, "output")
    y.sum().backward()
    ref.sum().backward()
    assert_close(w.grad, wr.grad, F64, "weight")


def test_compile_failure_is_reported_and_caches_nothing(own_cache, monkeypatch, tmp_path):
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'fake 1.0'; exit 0; fi\n"
                    "echo 'launcher.cpp:1:1: error: no torch here' >&2; exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(BuildError) as info:
        eager.setup()
    message = str(info.value)
    assert "eager launcher failed to build" in message and "no torch here" in message and "repro" in message
    assert cache.lookup(eager.key()) is None and eager.module() is None
    assert "convgen setup" in eager.status()
    monkeypatch.delenv("CXX")
    _still_computes()


def test_corrupt_artifact_is_reported_and_skipped(launcher, own_cache, session_cache_dir):
    target = cache.entry_dir(eager.key())
    shutil.copytree(Path(session_cache_dir) / target.relative_to(cache.root()), target)
    artifact = next(target.glob("*.so"))
    artifact.write_bytes(artifact.read_bytes()[:1000])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert eager.module() is None
    assert any("sha256" in str(w.message) and str(target) in str(w.message) for w in caught)
    _still_computes()


def test_no_compiler_means_the_python_path(own_cache, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-anywhere")
    assert eager.module() is None
    with pytest.raises(BuildError, match="no-such-compiler-anywhere"):
        eager.setup()
    monkeypatch.delenv("CXX")
    _still_computes()
