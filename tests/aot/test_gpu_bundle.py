"""Ahead-of-time GPU bundles (runtime/aot/gpu.py, runtime/dispatch/gpu_bundle.py), proven in the simulator.

`convgen aot MODEL --target cpu,cuda-sm_90,hip-gfx90a` writes the CPU and the GPU sources and
manifests into one bundle and builds the CPU module, each GPU target's device library (nvcc,
hipcc) and the simulator's libraries. Then a fresh process with no compiler reachable (PATH
stripped, CXX, CONVGEN_NVCC and CONVGEN_HIPCC pointing nowhere, an empty kernel cache) loads the
bundle and runs a training step of the model under CONVGEN_SIM=cuda (and hip): forward and
backward match ATen in float64, with zero builds, bundle hits and simulated launches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import convgen

from support.reference import TF32_TOLERANCE

MODEL = '''
import torch
from torch import nn

class Tiny(nn.Module):
    """A conv with bias, a strided depthwise conv, a pointwise conv with bias."""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8, bias=False)
        self.pw = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.pw(torch.relu(self.dw(torch.relu(self.conv(x)))))
'''

STEP = '''
import json, sys, torch, convgen
sys.path.insert(0, sys.argv[2])
from tiny import Tiny
torch.backends.cudnn.allow_tf32 = sys.argv[3] == "tf32"   # torch's own default is True
torch.manual_seed(0)
model, reference = Tiny(), Tiny()
reference.load_state_dict(model.state_dict())
reference = reference.double()
convgen.load_bundle(sys.argv[1], strict=True)
convgen.convert(model)
x = torch.randn(2, 3, 8, 8, requires_grad=True)
y = model(x)
g = torch.randn_like(y)
y.backward(g)
x64 = x.detach().double().requires_grad_()
y64 = reference(x64)
y64.backward(g.double())
def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()
errors = {"output": rel(y, y64), "grad_input": rel(x.grad, x64.grad)}
for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
    errors[name] = rel(p.grad, q.grad)
print(json.dumps({"errors": errors, "stats": convgen.stats()}))
'''

TARGETS = ["cuda-sm_90", "hip-gfx90a"]


def _device_compilers() -> bool:
    return convgen.knobs.nvcc() is not None and convgen.knobs.hipcc() is not None


@pytest.fixture(scope="module")
def gpu_bundle(tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu-bundle")
    (work / "tiny.py").write_text(MODEL)
    out = work / "tiny_bundle"
    argv = [sys.executable, "-m", "convgen", "aot", f"{work / 'tiny.py'}:Tiny", "--input-shape", "2,3,8,8",
            "--input-grad", "--target", ",".join(["cpu", *TARGETS]), "--out", str(out)]
    if not _device_compilers():   # said by test_the_device_libraries_export_every_entry's skip
        argv.append("--sim-only")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    return work, out, done.stdout


def test_the_bundle_holds_cpu_and_gpu_sources_and_manifests(gpu_bundle):
    _, out, summary = gpu_bundle
    manifest = json.loads((out / "gpu-manifest.json").read_text())
    assert manifest["format"] == "convgen-gpu-bundle/1" and sorted(manifest["targets"]) == sorted(TARGETS)
    assert (out / "manifest.json").is_file() and (out / "bundle.cpp").is_file()   # the CPU part, as before
    for name, part in manifest["targets"].items():
        assert part["kernels"], name
        for k in part["kernels"]:
            text = (out / k["file"]).read_text()
            assert k["file"].startswith(f"kernels/{name}/") and f'extern "C" int {k["entry"]}(' in text
            assert (out / "build" / "sim" / name / f"{k['name']}.so").is_file()
    assert "cuda-sm_90:" in summary and "hip-gfx90a:" in summary


def test_the_device_libraries_export_every_entry(gpu_bundle):
    if not _device_compilers():
        pytest.skip("nvcc and hipcc are needed to build the device libraries; the bundle was built --sim-only")
    _, out, _ = gpu_bundle
    manifest = json.loads((out / "gpu-manifest.json").read_text())
    for name, part in manifest["targets"].items():
        library = out / part["library"]
        symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
        for k in part["kernels"]:
            assert f" T {k['entry']}\n" in symbols, (name, k["entry"])


@pytest.mark.parametrize("vendor", ["cuda", "hip"])
@pytest.mark.parametrize("tf32", ["tf32", "f32"])
def test_a_fresh_process_without_compilers_runs_a_training_step_from_the_bundle_in_the_simulator(gpu_bundle, vendor,
                                                                                                 tf32):
    """Either way torch's tf32 switch is set, the bundle serves every call: on CUDA it carries the f32
    kernels with tf32 and without (their keys differ), HIP computes f32 either way."""
    work, out, _ = gpu_bundle
    (work / "step.py").write_text(STEP)
    env = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": "/nonexistent", "CXX": "/nonexistent/c++",
           "CONVGEN_NVCC": "/nonexistent/nvcc", "CONVGEN_HIPCC": "/nonexistent/hipcc",
           "CONVGEN_CACHE_DIR": str(work / f"empty-cache-{vendor}-{tf32}"), "CONVGEN_SIM": vendor,
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(work / "step.py"), str(out), str(work), tf32], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    stats = result["stats"]
    assert stats["builds"] == 0 and stats["bundle_hits"] > 0 and stats["sim_launches"] > 0, stats
    for name, error in result["errors"].items():
        # float32 against float64, reductions of at most 72 terms; tf32 operands (CUDA): 2^-10 more
        assert error < 1e-5 + (TF32_TOLERANCE if tf32 == "tf32" and vendor == "cuda" else 0.0), (name, error)


def test_a_stale_gpu_build_is_refused_and_the_jit_takes_over(gpu_bundle, tmp_path):
    import shutil

    _, out, _ = gpu_bundle
    copy = tmp_path / "stale"
    shutil.copytree(out, copy, symlinks=True)
    (copy / "manifest.json").unlink()   # the GPU part alone
    record = json.loads((copy / "build" / "gpu-build.json").read_text())
    record["cuda-sm_90"]["kernel_set"] = "0" * 64
    (copy / "build" / "gpu-build.json").write_text(json.dumps(record))
    with pytest.warns(RuntimeWarning, match="cuda-sm_90 build is older than its manifest"):
        assert convgen.load_bundle(copy) is None
    with pytest.raises(convgen.ConvgenError, match="stale"):
        convgen.load_bundle(copy, strict=True)
