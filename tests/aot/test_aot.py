"""Ahead of time: collect -> `convgen aot` -> a bundle that a fresh process uses with zero builds.

One bundle of tests/support/aot_models.py's Mixed model (conv with and without bias, strided depthwise,
a functional convgen call inside forward, transposed 2-D and 1-D, dilated 1-D, strided 3-D) is
generated and built once per module (it also serves the plain model inside `convgen.enabled()`);
the checks that load it run in fresh processes, so that
`convgen.stats()` counts only what that process did and no test's dispatch table leaks into another.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import convgen
from convgen.aot import aot
from convgen.dispatch import bundle
from convgen.codegen.errors import ConvSpecError
from convgen.api.shapes import problems_from_json

from support import aot_models
from support.paths import TESTS
from support.reference import rel_err, tolerance

MODELS = Path(aot_models.__file__)   # `convgen aot` loads it by path; the subprocesses import it from TESTS


@pytest.fixture(scope="module")
def built_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundles") / "mixed"
    problems = convgen.collect(aot_models.mixed(), aot_models.example_input())
    aot.generate(problems, out, name="mixed")
    aot.build(out)
    return out


def run_step(tmp_path, bundle_dir, *, env=None, batch=2, load="api", model="mixed", enabled=False) -> dict:
    """One training step of a converted tests/support/aot_models.py model in a fresh process with an
    empty cache (with `enabled`: of the plain torch model inside convgen.enabled())."""
    result = tmp_path / f"result-{os.urandom(4).hex()}.pt"
    load_line = f"convgen.load_bundle({str(bundle_dir)!r}, strict=True)" if bundle_dir and load == "api" else ""
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(TESTS)!r})
        import convgen
        from support import aot_models
        {load_line}
        with convgen.enabled({enabled}):
            grads = aot_models.step({"" if enabled else "convgen.convert"}(aot_models.{model}()), {batch},
                                    {model == "channels_last"})
        from convgen.devices import cpu
        torch.save({{"grads": grads, "stats": convgen.stats(), "pool": cpu._pool is not None}}, {str(result)!r})
    """)
    cache = tmp_path / f"cache-{os.urandom(4).hex()}"
    full_env = {**os.environ, "CONVGEN_CACHE_DIR": str(cache), **(env or {})}
    proc = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = torch.load(result)
    data["stderr"] = proc.stderr
    return data


# ---------------------------------------------------------------------------------- collect


def test_collect_finds_module_and_functional_convolutions_with_their_passes():
    problems = convgen.collect(aot_models.mixed(), aot_models.example_input())
    names = {p.name() for p in problems}
    # the first conv's input needs no gradient: forward and weight(+bias) gradient only
    assert "conv2d_fwdb_c3_k8_10x10_r3x3_p1_f32" in names
    assert "conv2d_bwdwb_c3_k8_10x10_r3x3_p1_f32" in names
    assert not any(n.startswith("conv2d_bwdd_c3_k8") for n in names)
    # the functional convgen.conv2d call inside forward: all three passes
    for op in ("fwd", "bwdd", "bwdw"):
        assert f"conv2d_{op}_c8_k8_5x5_r3x3_p1_f32" in names
    assert {"convT2d_fwdb_c8_k4_5x5_r4x4_s2_p1_f32", "conv1d_bwdd_c4_k6_100_r5_p4_d2_f32",
            "convT1d_bwdw_c6_k2_100_r4_s2_p1_f32", "conv3d_bwdwb_c2_k3_2x10x10_r3x3x3_s1x2x2_p1_f32"} <= names
    assert len(names) == len(problems)  # de-duplicated


def test_collect_sees_torch_functional_calls_and_leaves_the_model_as_it_was():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 2, 3))
            self.bn = torch.nn.BatchNorm1d(4)

        def forward(self, x):
            return self.bn(torch.nn.functional.conv1d(x, self.w, stride=2))

    model = Net()
    before = model.bn.running_mean.clone()
    x = torch.randn(3, 2, 11, requires_grad=True)
    names = {p.name() for p in convgen.collect(model, x)}
    assert names == {"conv1d_fwd_c2_k4_11_r3_s2_f32", "conv1d_bwdd_c2_k4_11_r3_s2_f32",
                     "conv1d_bwdw_c2_k4_11_r3_s2_f32"}
    assert model.w.grad is None and x.grad is None
    assert torch.equal(model.bn.running_mean, before)


def test_collect_builds_nothing():
    before = convgen.stats()["builds"]
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.ReLU(), torch.nn.Conv2d(3, 5, 1))
    assert len(convgen.collect(convgen.convert(model), torch.randn(1, 2, 6, 6))) == 5
    assert convgen.stats()["builds"] == before


def test_collect_follows_channels_last_models():
    model = torch.nn.Conv2d(4, 8, 3).to(memory_format=torch.channels_last)
    x = torch.randn(2, 4, 9, 9).contiguous(memory_format=torch.channels_last).requires_grad_()
    problems = convgen.collect(model, x)
    assert problems and all(p.name().endswith("nhwc") for p in problems)


def test_shape_list_expands_like_collect():
    entries = [{"input": [2, 8, 10, 10], "weight": [8, 8, 3, 3], "padding": 1, "bias": True},
               {"input": [2, 8, 10, 10], "weight": [8, 1, 3, 3], "groups": 8, "stride": 2, "padding": 1,
                "requires_grad": {"input": False}}]
    names = [p.name() for p in problems_from_json(json.dumps(entries))]
    assert names == ["conv2d_fwdb_c8_k8_10x10_r3x3_p1_f32", "conv2d_bwdd_c8_k8_10x10_r3x3_p1_f32",
                     "conv2d_bwdwb_c8_k8_10x10_r3x3_p1_f32", "conv2d_fwd_c8_k8_10x10_r3x3_s2_p1_g8_f32",
                     "conv2d_bwdw_c8_k8_10x10_r3x3_s2_p1_g8_f32"]


@pytest.mark.parametrize("entry, words", [
    ({"input": [2, 8, 10], "weight": [4, 8, 3], "strides": 2}, "unknown field"),
    ({"input": [2, 8, 10], "weight": [4, 8, 3], "dtype": "f8"}, "dtype"),
    ({"input": "2,8,10", "weight": [4, 8, 3]}, "input must be a list"),
    ({"input": [2, 8, 10], "weight": [4, 7, 3]}, "channels"),
])
def test_bad_shape_lists_are_refused_by_name(entry, words):
    with pytest.raises(ConvSpecError, match=words):
        problems_from_json([entry])


# ---------------------------------------------------------------------------------- generate and build


def test_bundle_layout_and_manifest(built_bundle):
    manifest = json.loads((built_bundle / "manifest.json").read_text())
    assert manifest["format"] == aot.FORMAT and manifest["module"] == "convgen_bundle_mixed"
    assert manifest["target"]["isa"] == convgen.codegen.target.host_cpu().isa
    assert manifest["toolchain"]["version"]
    for k in manifest["kernels"]:
        text = (built_bundle / k["file"]).read_text()
        assert text.startswith("// Generated by convgen") and f"entry:   {k['entry']}" in text
        assert aot.sha256(text) == k["sha256"] and k["algorithm"] in k["candidates"]
        assert " -c " in k["command"] and f" {k['file']} -o {k['object']}" in k["command"]
    assert {p["kernel"] for p in manifest["problems"]} == {k["name"] for k in manifest["kernels"]}
    assert (built_bundle / "build" / json.loads((built_bundle / "build" / "build.json").read_text())["module"]).exists()


def test_rerunning_with_nothing_changed_writes_and_compiles_nothing(built_bundle):
    files = sorted(p for p in built_bundle.rglob("*") if p.is_file())
    stamps = {p: p.stat().st_mtime_ns for p in files}
    manifest = json.loads((built_bundle / "manifest.json").read_text())
    problems = [convgen.codegen.ir.ConvProblem.from_dict(e["problem"]) for e in manifest["problems"]]
    generated = aot.generate(problems, built_bundle, name="mixed")
    assert generated.written == 0 and generated.removed == 0
    assert aot.build(built_bundle).compiled == 0
    changed = [p for p in files if p.name != ".ninja_log" and p.stat().st_mtime_ns != stamps[p]]
    assert changed == []


# ---------------------------------------------------------------------------------- using a bundle


def torch_gradients(dtype, monkeypatch) -> dict:
    """torch's own gradients for aot_models.step (its functional convgen call done by torch)."""
    monkeypatch.setattr(aot_models.convgen, "conv2d", torch.nn.functional.conv2d)
    model = aot_models.mixed().to(dtype)
    out = model(aot_models.example_input().to(dtype))
    (out * out).sum().backward()
    monkeypatch.undo()
    return {"out": out.detach(), **{n: p.grad for n, p in model.named_parameters()}}


def test_a_bundle_serves_a_training_step_with_zero_builds_and_the_jit_results(built_bundle, tmp_path, monkeypatch):
    jit = run_step(tmp_path, None)
    assert jit["stats"]["builds"] > 0
    served = run_step(tmp_path, built_bundle)
    assert served["stats"]["builds"] == 0 and served["stats"]["ninja_runs"] == 0
    assert served["stats"]["bundle_hits"] == jit["stats"]["builds"]
    for name, g in jit["grads"].items():
        assert torch.equal(g, served["grads"][name]), name
    # and torch's answer: a whole network's float32 gradients are as close to float64 as torch's
    # own float32 run is (batch norm amplifies rounding), and within float32's tolerance or better
    exact, single = torch_gradients(torch.float64, monkeypatch), torch_gradients(torch.float32, monkeypatch)
    for name, ref in exact.items():
        ours, theirs = rel_err(served["grads"][name], ref), rel_err(single[name], ref)
        assert ours <= max(2 * theirs, tolerance(torch.float32)), f"{name}: {ours:.1e} vs torch f32 {theirs:.1e}"


def test_a_bundle_serves_a_plain_model_inside_enabled(built_bundle, tmp_path):
    """collect sees the aten calls that convgen.enabled() serves: the bundle has every kernel."""
    jit = run_step(tmp_path, None)
    served = run_step(tmp_path, built_bundle, enabled=True)
    assert served["stats"]["builds"] == 0 and served["stats"]["bundle_hits"] == jit["stats"]["builds"] > 0
    assert served["stats"]["aten_forward"] > 0 and served["stats"]["aten_backward"] > 0
    assert served["stats"]["aten_fallbacks"] == 0
    for name, g in jit["grads"].items():
        assert torch.equal(g, served["grads"][name]), name


def test_a_bundle_runs_without_a_compiler(built_bundle, tmp_path):
    served = run_step(tmp_path, built_bundle, env={"CXX": str(tmp_path / "no-such-compiler"), "PATH": "/nonexistent"})
    assert served["stats"]["builds"] == 0 and served["stats"]["bundle_hits"] > 0
    assert served["pool"], "the bundle's kernels did not share their pool of large buffers"


def test_a_bundle_serves_any_batch_size(built_bundle, tmp_path):
    assert run_step(tmp_path, built_bundle, batch=5)["stats"]["builds"] == 0


def test_bundles_named_in_the_environment_load_by_themselves(built_bundle, tmp_path):
    served = run_step(tmp_path, None, env={"CONVGEN_BUNDLES": str(built_bundle)})
    assert served["stats"]["builds"] == 0 and served["stats"]["bundle_hits"] > 0


def test_a_channels_last_model_is_served_entirely(tmp_path):
    out = tmp_path / "cl"
    problems = convgen.collect(aot_models.channels_last(), aot_models.example_input(channels_last=True))
    aot.generate(problems, out)
    aot.build(out)
    jit = run_step(tmp_path, None, model="channels_last")
    served = run_step(tmp_path, out, model="channels_last")
    assert served["stats"]["builds"] == 0 and served["stats"]["bundle_hits"] == jit["stats"]["builds"] > 0
    for name, g in jit["grads"].items():
        assert torch.equal(g, served["grads"][name]), name


# ---------------------------------------------------------------------------------- refusals


def _copy(built_bundle, tmp_path, edit=None) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(built_bundle, copy)
    if edit is not None:
        manifest = json.loads((copy / "manifest.json").read_text())
        edit(manifest)
        (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def _refused(path, words):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert convgen.load_bundle(path) is None
    messages = " ".join(str(w.message) for w in caught)
    assert "refused" in messages and "JIT builds take over" in messages and words in messages, messages
    with pytest.raises(bundle.BundleError, match=words):
        convgen.load_bundle(path, strict=True)
    assert bundle.loaded() == []


def test_a_bundle_for_another_isa_is_refused(built_bundle, tmp_path):
    other = "avx512" if convgen.codegen.target.host_cpu().isa != "avx512" else "avx2"

    def edit(m):
        m["target"].update(isa=other, name=f"cpu-{other}")
    _refused(_copy(built_bundle, tmp_path, edit), f"generated for cpu-{other}")


def test_a_bundle_for_another_isa_this_cpu_runs_names_convgen_isa(built_bundle, tmp_path):
    assert "generic" in convgen.codegen.target.host_isas() and convgen.codegen.target.host_cpu().isa != "generic"

    def edit(m):
        m["target"].update(isa="generic", name="cpu-generic")
    _refused(_copy(built_bundle, tmp_path, edit), "set CONVGEN_ISA=generic")


def test_a_bundle_for_another_isa_this_cpu_runs_serves_where_no_compiler_is_reachable(tmp_path, monkeypatch):
    """A bundle generated for a narrower ISA level (here generic x86-64) on a CPU that runs it, with no
    compiler to JIT with: the bundle is the only way to run, so it serves, its own kernels."""
    from convgen.codegen.target import cpu_target
    out = tmp_path / "generic"
    problems = convgen.collect(aot_models.mixed(), aot_models.example_input())
    aot.generate(problems, out, name="mixed_generic", target=cpu_target("generic"))
    aot.build(out)
    assert json.loads((out / "manifest.json").read_text())["target"]["isa"] == "generic"
    _refused(out, "set CONVGEN_ISA=generic")   # a compiler here: the JIT's kernels stay in charge
    no_cxx = {"CXX": str(tmp_path / "no-such-compiler"), "PATH": "/nonexistent"}
    served = run_step(tmp_path, out, env=no_cxx)
    assert served["stats"]["builds"] == 0 and served["stats"]["bundle_hits"] > 0
    assert "refused" not in served["stderr"]
    exact, single = torch_gradients(torch.float64, monkeypatch), torch_gradients(torch.float32, monkeypatch)
    for name, ref in exact.items():
        ours, theirs = rel_err(served["grads"][name], ref), rel_err(single[name], ref)
        assert ours <= max(2 * theirs, tolerance(torch.float32)), f"{name}: {ours:.1e} vs torch f32 {theirs:.1e}"


def test_a_bundle_with_vdpbf16ps_kernels_is_refused_where_the_cpu_lacks_it(built_bundle, tmp_path, monkeypatch):
    """A bundle generated on an AVX512-BF16 host (bf16 pairs in vdpbf16ps) would fault elsewhere."""
    from convgen.codegen import target as target_mod

    def edit(m):
        m["target"].update(bf16_dot=True, name=m["target"]["name"] + "+bf16")
    copy = _copy(built_bundle, tmp_path, edit)
    monkeypatch.setattr(target_mod, "host_bf16_dot", lambda: False)
    monkeypatch.setattr(bundle, "host_bf16_dot", lambda: False)
    monkeypatch.setenv("CONVGEN_BF16_DOT", "0")   # the host target itself without pairs, as on such a CPU
    _refused(copy, "whose bf16 kernels use vdpbf16ps, which this CPU does not run")


def test_a_bundle_from_another_toolchain_is_refused(built_bundle, tmp_path, monkeypatch):
    wrapper = tmp_path / "other-c++"
    wrapper.write_text('#!/bin/sh\nexec c++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    _refused(built_bundle, "this process would JIT with")


def test_a_bundle_from_another_convgen_version_is_refused(built_bundle, tmp_path):
    _refused(_copy(built_bundle, tmp_path, lambda m: m.update(generator_version="0.0.1")), "convgen 0.0.1")


def test_an_unbuilt_or_stale_bundle_is_refused(built_bundle, tmp_path):
    copy = _copy(built_bundle, tmp_path)
    (copy / "build" / "build.json").unlink()
    _refused(copy, "has not been built")
    copy2 = _copy(built_bundle, tmp_path / "b", lambda m: m.update(kernel_set="0" * 64))
    _refused(copy2, "stale")


def test_a_directory_without_a_bundle_is_an_error(tmp_path):
    with pytest.raises(bundle.BundleError, match="no bundle manifest"):
        convgen.load_bundle(tmp_path)


def test_a_wrong_path_in_the_environment_warns_and_leaves_the_jit_in_charge(tmp_path):
    served = run_step(tmp_path, None, env={"CONVGEN_BUNDLES": str(tmp_path / "no-bundle-here")})
    assert served["stats"]["bundle_hits"] == 0 and served["stats"]["builds"] > 0
    assert "not a usable bundle" in served["stderr"]


def test_a_refused_bundle_leaves_the_jit_in_charge(built_bundle, tmp_path):
    other = "avx512" if convgen.codegen.target.host_cpu().isa != "avx512" else "avx2"
    copy = _copy(built_bundle, tmp_path, lambda m: m["target"].update(isa=other))
    served = run_step(tmp_path, None, env={"CONVGEN_BUNDLES": str(copy)})
    assert served["stats"]["bundle_hits"] == 0 and served["stats"]["builds"] > 0
    assert "refused" in served["stderr"]


# ---------------------------------------------------------------------------------- command line


def test_aot_command_line(tmp_path):
    out = tmp_path / "cli"
    argv = [sys.executable, "-m", "convgen", "aot", f"{MODELS}:mixed", "--input-shape", "2,3,10,10",
            "--out", str(out), "--no-build"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "convgen aot: cli" in proc.stdout and "distinct kernels" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["origin"]["input_shapes"] == [[2, 3, 10, 10]] and len(manifest["kernels"]) >= 18
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert "0 file(s) written" in again.stdout


def test_aot_command_line_channels_last_with_2d_and_3d_convolutions(tmp_path):
    out = tmp_path / "cl"
    proc = subprocess.run([sys.executable, "-m", "convgen", "aot", f"{MODELS}:mixed", "--input-shape", "2,3,10,10",
                           "--layout", "channels_last", "--out", str(out), "--no-build"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    names = [p["name"] for p in json.loads((out / "manifest.json").read_text())["problems"]]
    assert any(n.startswith("conv2d_") and n.endswith("nhwc") for n in names)
    assert any(n.startswith("conv3d_") and "ndhwc" in n for n in names)


def test_aot_command_line_from_a_shape_list(tmp_path):
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps([{"input": [1, 4, 8], "weight": [4, 4, 3], "padding": 1}]))
    proc = subprocess.run([sys.executable, "-m", "convgen", "aot", "--shapes", str(shapes), "--out",
                           str(tmp_path / "s"), "--no-build"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["name"] == "s"


@pytest.mark.parametrize("args, words", [
    (["nosuchmodule:x", "--input-shape", "1,2,3"], "cannot import nosuchmodule"),
    ([f"{MODELS}:nothing", "--input-shape", "1,2,3"], "no attribute"),
    ([f"{MODELS}:mixed"], "--input-shape"),
    ([f"{MODELS}:mixed", "--input-shape", "2,x"], "comma-separated integers"),
    (["--input-shape", "1,2,3"], "either MODULE:CALLABLE"),
])
def test_aot_command_line_refuses_bad_requests_in_one_line(args, words, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "convgen", "aot", *args, "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
