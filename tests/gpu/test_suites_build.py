"""Every default kernel of the bench suites (`convgen bench`'s default, "all": standard then weak;
runtime/bench/suites.py), as the GPU targets plan them for every pass (forward with bias, data, weight and
bias gradients), built by the vendor compilers for sm_80, sm_90a (nvcc) and gfx90a (hipcc) with
spills as errors, in one parallel ninja run.

Two configurations per shape: f32 contiguous (bench's default: the direct and depthwise kernels)
and bf16 channels-last (the tensor-core path: implicit GEMM with cp.async, depthwise, stem).
Identical sources are built once. Tensors are never allocated: problems come from their shapes.

Every such kernel for sm_90a (the 16-bit GEMMs on warpgroup MMA; the others as sm_90's, whose every
configuration builds in tests/gpu/test_cases_build.py), one per kernel configuration for sm_80 and
gfx90a (REPRESENTED):
the whole set took about 30 minutes of CPU on a 2-core AMD EPYC (family 23), too much of CI's
budget there. 360 kernel files for all three (after removing identical sources). Measured on this project's shared 2-core machine
(four sessions compiling at once): 25.5 min wall, 8.5 min of compiler CPU time (453 s user + 58 s
system), so about 4.5 min on two idle cores; again on issue 20d: 45 min wall under heavier sharing,
533 s of CPU (473 s user + 60 s system). Set CONVGEN_SKIP_SUITE_BUILD=1 to skip it locally.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess

import pytest

from convgen import knobs
from convgen.bench import suites
from convgen.codegen.emit import emit
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import parse_target

from test_cases_build import configuration

ARCHS = {"cuda-sm_80": "nvcc", "cuda-sm_90a": "nvcc", "hip-gfx90a": "hipcc"}
# every kernel for sm_90a; for these, the first kernel of each configuration (the same algorithm,
# pass, dtype, layouts, rank, transposition and tiling; test_cases_build.configuration), which
# differ in compile-time sizes only: 48 and 51 files of 120 each
REPRESENTED = ("cuda-sm_80", "hip-gfx90a")
CONFIGS = ((DType.F32, Layout.CONTIGUOUS), (DType.BF16, Layout.CHANNELS_LAST))
OPS = (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT, Op.BWD_BIAS)


def suite_problems() -> list[ConvProblem]:
    """Each shape's problems per configuration and pass (1-D shapes stay contiguous, as in bench)."""
    problems = []
    for _, shapes in suites.select("all"):
        for shape in shapes:
            stride, padding, dilation, transposed, output_padding, groups = shape.conv_args()
            for dtype, layout in CONFIGS:
                layout = layout if shape.rank in (2, 3) else Layout.CONTIGUOUS
                c_in = shape.input[1]
                k_out = shape.out_channels
                for op in OPS:
                    problem = ConvProblem(op, shape.input[0], c_in, k_out, tuple(shape.input[2:]),
                                          tuple(shape.weight[2:]), tuple(stride), tuple((p, p) for p in padding),
                                          tuple(dilation), groups=groups, transposed=transposed,
                                          output_padding=tuple(output_padding), dtype=dtype,
                                          bias=shape.bias and op in (Op.FWD, Op.BWD_BIAS),
                                          input_layout=layout, weight_layout=layout, output_layout=layout)
                    problems.append(problem.validate())
    return problems


def _ninja_rules(nvcc: str | None, hipcc: str | None) -> str:
    rules = []
    if nvcc:
        rules.append(f"rule nvcc\n  command = {nvcc} -cubin -arch=$arch -Xptxas -v -Xptxas -warn-spills "
                     f"-Xptxas -Werror $in -o $out > $out.log 2>&1 || (cat $out.log; exit 1)\n")
    if hipcc:
        # (the device code alone, to assembly: no host compile -- tests/gpu/test_igemm.py's hipcc_functions)
        rules.append(f"rule hipcc\n  command = HIP_PLATFORM=amd {hipcc} -x hip --offload-arch=$arch --cuda-device-only -S -O3 "
                     f"-Wno-unused-command-line-argument "
                     f"-Rpass-analysis=kernel-resource-usage $in -o $out > $out.log 2>&1 || (cat $out.log; exit 1)\n")
    return "\n".join(rules)


def test_every_default_suite_kernel_builds_for_sm_80_sm_90a_and_gfx90a_without_spills(tmp_path):
    if os.environ.get("CONVGEN_SKIP_SUITE_BUILD"):
        pytest.skip("CONVGEN_SKIP_SUITE_BUILD is set")
    ninja = shutil.which("ninja")
    nvcc = knobs.nvcc() if knobs.nvcc() and shutil.which(knobs.nvcc()) else None
    hipcc = knobs.hipcc() if knobs.hipcc() and shutil.which(knobs.hipcc()) else None
    if ninja is None or not (nvcc or hipcc):
        pytest.skip("needs ninja and nvcc or hipcc")
    builds, seen, names = [], set(), {}
    for target_name, compiler in ARCHS.items():
        if (compiler == "nvcc" and not nvcc) or (compiler == "hipcc" and not hipcc):
            continue
        target = parse_target(target_name)
        configurations = set()
        for problem in suite_problems():
            plan = lower(problem, target)
            source = emit(plan)
            if source is None:
                continue
            if target_name in REPRESENTED:   # one kernel per configuration (tests/gpu/test_cases_build.py)
                config = configuration(plan)
                if config in configurations:
                    continue
                configurations.add(config)
            digest = hashlib.sha256((target_name + source.text).encode()).hexdigest()[:16]
            if digest in seen:
                continue
            seen.add(digest)
            path = tmp_path / f"{target.isa}_{digest}.cu"
            path.write_text(source.text)
            names[path.stem] = (target.isa, problem.name())
            suffix = ".cubin" if compiler == "nvcc" else ".o"
            builds.append(f"build {path.stem}{suffix}: {compiler} {path.name}\n  arch = {target.isa}\n")
    assert builds
    (tmp_path / "build.ninja").write_text(_ninja_rules(nvcc, hipcc) + "\n" + "".join(builds))
    jobs = str(max(1, min(os.cpu_count() or 1, int(os.environ.get("CONVGEN_TEST_JOBS", "2")))))
    done = subprocess.run([ninja, "-j", jobs, "-k", "0"], cwd=tmp_path, capture_output=True, text=True)
    failed = {stem: (tmp_path / f"{stem}{'.o' if isa.startswith('gfx') else '.cubin'}.log").read_text()
              for stem, (isa, _) in names.items()
              if not (tmp_path / f"{stem}{'.o' if isa.startswith('gfx') else '.cubin'}").is_file()}
    spilled = sorted(names[stem] for stem, log in failed.items() if "Registers are spilled" in log)
    assert not spilled, spilled
    others = {names[stem]: log[-1500:] for stem, log in failed.items()}
    assert not others, others
    assert done.returncode == (1 if failed else 0), done.stdout[-3000:]
    for log in tmp_path.glob("*.log"):
        if log.name.removesuffix(".o.log").removesuffix(".cubin.log") in failed:
            continue
        text = log.read_text()
        assert "warning" not in text.lower(), (log.name, text[:2000])
        assert set(re.findall(r"(\d+) bytes spill stores", text)) <= {"0"}, (log.name, text)
        for field in ("ScratchSize \\[bytes/lane\\]", "VGPRs Spill", "SGPRs Spill"):
            assert set(re.findall(rf"{field}: (\d+)", text)) <= {"0"}, (log.name, field, text)
