"""The default GPU kernels of the CASES.md cases, one per kernel configuration, compiled by the
vendors' compilers: nvcc for
sm_80 and sm_90 with ptxas spills as errors (`-Xptxas -v -Xptxas -warn-spills -Xptxas -Werror`, the
flags of runtime/building/gpu_build.py), hipcc for gfx90a (HIP_PLATFORM=amd, `-O3`, no SGPR or VGPR spills
in `-Rpass-analysis=kernel-resource-usage`).

What: every case of tests/support/cases.py (CASES.md items 1-22) in f32, f64, bf16 and f16, every
operand layout variant, the forward pass and the backward pass under each output_mask -- the
problems the runtime dispatches for those calls (`ops.call_problems`) -- lowered for each target
and emitted as `convgen show --target ...` prints them (empty problems have no kernel).

How it fits CI's 2 cores (measured on one, see the figures in the issue-17 report):
- one file per kernel configuration and target: the problems that share the algorithm, pass,
  dtype, operand layouts, rank, transposition and tiling (threads and warps per block, each
  thread's share of the block tile) differ in compile-time sizes only, so the first (in case order)
  stands for the others: about 300 files per target of the 1,306 distinct ones. Compiling all of
  them took about 80 minutes of CPU on a 2-core AMD EPYC (family 23), more than CI's whole budget
  there beside the rest of the suite. sm_80 and sm_90 (both mma.sync, ldmatrix and cp.async; their
  tiles' stages and the SM counts differ) take turns by kind -- algorithm, pass, dtype, layouts,
  rank, transposition: every kind is compiled by nvcc for one of them, about 150 files each (a
  third of the sweep's 1,000 s of compile CPU on Zen 4 saved); sm_90a's warpgroup path is
  tests/gpu/test_suites_build.py's and test_igemm.py's. Every case, dtype and layout still runs in the simulator
  (tests/sim/test_runtime.py, on one vendor each), and every bench-suite kernel builds with nvcc for
  sm_90 (tests/gpu/test_suites_build.py).
- dedupe: files that differ only in full-line `//` comments (their header: problem name, key and
  reasons) compile to the same code, so each distinct one is compiled once.
- batches: a vendor compiler's fixed cost per invocation (its driver, the vendor headers parsed,
  cicc/ptxas or clang started: an empty file takes about 0.35 s of CPU with nvcc and 0.8 s with
  hipcc) outweighs most kernel files' own (0.2-0.6 s), so BATCH distinct files go to one compile
  through a generated file that #includes them unchanged: the vendor wrappers inlined in each are
  include-guarded, and the plan entry's helper struct `convgen_pointer` is renamed per file by a
  macro; files whose entry names coincide go to different batches. That each file also compiles
  on its own is checked by tests/cli/test_gpu_commands.py (`show`'s files, one per algorithm and pass) and
  the kernels' own tests; here each file must inline its vendor's wrappers and include nothing else.
- one ninja run over the batches of all three targets, CONVGEN_BUILD_JOBS compiles at a time.
- a failed batch is compiled again file by file, to name the failing kernels with a repro command.
- the units: every GEMM kernel of every implicit-GEMM file holds, in the sm_80/sm_90 machine code
  (read with nvdisasm, when it is installed), its dtype's instructions: HMMA.16816.F32 for
  bf16/f16, HMMA.1688.F32.TF32 for f32 as tf32, DMMA (sm_80: DMMA.884, sm_90: DMMA.8x8x4) and no
  DFMA for f64, and FFMA and no HMMA for f32 on the FMA path; and in the gfx90a assembly (hipcc `--cuda-device-only -S`, each batch's output) its
  MFMA: v_mfma_f32_16x16x16 bf16/f16, v_mfma_f32_16x16x4 f32, and v_mfma_f64_16x16x4 and no v_fma(c)_f64 for f64.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from convgen import knobs
from convgen.building import gpu_build
from convgen.building.build import find_ninja, write_if_changed
from convgen.codegen.gpu.entry import emit_gpu
from convgen.codegen.gpu.wrappers import vendor_wrappers
from convgen.codegen.ir import Layout
from convgen.codegen.pipeline import lower
from convgen.codegen.target import TargetKind, parse_target
from convgen.api.ops import call_problems

from support import cases
from support.reference import channels_last_format, non_contiguous

TARGETS = ("cuda-sm_80", "cuda-sm_90", "hip-gfx90a")
CUDA_TURNS = ("cuda-sm_80", "cuda-sm_90")   # each kind of kernel on one of them (distinct_kernels)
BATCH = 24   # distinct kernel files per compiler invocation


def _memory_format(layout: Layout, dim: int) -> torch.memory_format:
    return channels_last_format(dim) if layout is Layout.CHANNELS_LAST else torch.contiguous_format


def _zeros(shape, dtype: torch.dtype, memory_format: torch.memory_format) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype).contiguous(memory_format=memory_format)


def case_problems() -> dict:
    """Every problem the CASES.md calls dispatch (tests/support/cases.py's cases, dtypes, layout variants
    and output masks), by key. The operands are zeros with the variant's layout; grad_output takes
    the memory format the forward's result has (as support/cases.py's operands, whose check asserts that
    format against torch's own) or, for noncontig_grad, a strided view of it."""
    problems = {}
    for case in cases.CASES:
        cl = channels_last_format(len(case.input))
        for dtype in cases.DTYPES.values():
            for variant in cases.variants_of(case):
                x = _zeros(case.input, dtype, cl if variant == "channels_last" else torch.contiguous_format)
                w = _zeros(case.weight, dtype, cl if variant == "channels_last_weight" else torch.contiguous_format)
                b = torch.zeros(case.k, dtype=dtype)
                if variant == "noncontig_input":
                    x = non_contiguous(x)
                forward = call_problems(x, w, b, *case.args(), output_mask=(False, False, True))[0]
                gy = _zeros(forward.output_shape, dtype, _memory_format(forward.output_layout, len(forward.output_shape)))
                if variant == "noncontig_grad":
                    gy = non_contiguous(gy)
                for mask in cases.MASKS:
                    for p in call_problems(x, w, b, *case.args(), output_mask=mask, grad_output=gy):
                        problems[p.key()] = p
    return problems


def _code(text: str) -> str:
    """The text without its full-line `//` comments (none continues onto the next line): what the
    compiler sees."""
    return "\n".join(line for line in text.splitlines()
                     if not (line.lstrip().startswith("//") and not line.endswith("\\")))


def configuration(plan) -> tuple:
    """What a kernel file's code depends on besides its compile-time sizes: the algorithm, pass,
    dtype, operand layouts, rank and transposition, and the tiling."""
    p, t = plan.problem, plan.tiling
    return (plan.algorithm, p.op.value, p.dtype.value, p.input_layout.value, p.weight_layout.value,
            p.output_layout.value, p.rank, p.transposed, t.threads_per_block, t.warps_per_block, t.per_thread)


def kind(plan) -> tuple:
    """A configuration's arch-independent part: the algorithm, pass, dtype, operand layouts, rank and
    transposition (the tiling, stages aside, is the arch's)."""
    return configuration(plan)[:8]


def distinct_kernels(problems) -> tuple[dict, dict]:
    """Per target: {sha256 of the file's code: (entry, text)} for the first problem of each
    configuration; and per target the number of files (every problem's). The two CUDA targets take
    turns by kind (CUDA_TURNS): sm_80 the kinds first met at an even place in the cases' order, sm_90
    the odd ones, so every kind builds with nvcc once, on one arch, at half the compiles."""
    kernels, files, kinds = {}, {}, {}
    for name in TARGETS:
        target = parse_target(name)
        kernels[name], files[name], seen = {}, 0, set()
        for problem in problems.values():
            plan = lower(problem, target)
            if plan.algorithm == "empty":
                continue
            if name in CUDA_TURNS and CUDA_TURNS.index(name) != kinds.setdefault(kind(plan), len(kinds)) % 2:
                continue   # the other CUDA arch's turn
            files[name] += 1
            config = configuration(plan)
            if config in seen:
                continue
            seen.add(config)
            source = emit_gpu(plan)
            key = hashlib.sha256(_code(source.text).encode()).hexdigest()
            kernels[name].setdefault(key, (source.entry, source.text))
    return kernels, files


def _algorithm(text: str) -> str:
    return re.search(r"// kernel:  \w+, algorithm (\w+)\n", text).group(1)


def batches(kernels: dict) -> list[list[str]]:
    """The keys of one target's kernels in batches of at most BATCH, no entry name twice in one;
    by algorithm (the implicit-GEMM files, whose machine code is read, fill batches of their own)."""
    out: list[tuple[set, list]] = []
    for key in sorted(kernels, key=lambda k: (_algorithm(kernels[k][1]), k)):
        entry = kernels[key][0]
        home = next((b for b in out if entry not in b[0] and len(b[1]) < BATCH), None)
        if home is None:
            home = (set(), [])
            out.append(home)
        home[0].add(entry)
        home[1].append(key)
    return [keys for _, keys in out]


def _umbrella(keys: list[str]) -> str:
    lines = ["// convgen tests: kernel files of one target compiled in one invocation (tests/gpu/test_cases_build.py)"]
    for i, key in enumerate(keys):
        lines += [f"#define convgen_pointer convgen_pointer_{i}", f'#include "k_{key[:24]}.cu"', "#undef convgen_pointer"]
    return "\n".join(lines) + "\n"


def _command(target: str, src: str, out: str, exe: str, temps: bool = False) -> list[str]:
    """runtime/building/gpu_build.py's command for `target` (its flags: spills are errors for nvcc);
    `temps`: hipcc compiles the device code alone, its assembly to `out` (`--cuda-device-only -S` in
    place of `-c`: the instructions `-c -save-temps` leaves, at about half its CPU time, no host compile;
    the host side of every algorithm's files builds in tests/cli/test_gpu_commands.py)."""
    class Source:   # what gpu_build.command reads of a KernelSource
        pass
    source = Source()
    source.target = parse_target(target)
    argv = gpu_build.command(source, src, out, exe)
    if temps and target.startswith("hip"):
        at = argv.index("-c")
        return argv[:at] + ["--cuda-device-only", "-S", "-Wno-unused-command-line-argument"] + argv[at + 1:]
    return argv


def _shell(target: str, argv: list[str]) -> str:
    return ("HIP_PLATFORM=amd " if target.startswith("hip") else "") + shlex.join(argv)


def _spills(target: str, log: str) -> list[str]:
    """hipcc's spill remarks that are not 0 (nvcc's spills already failed the compile)."""
    if not target.startswith("hip"):
        return []
    return [line for line in log.splitlines() if re.search(r"[SV]GPRs Spill: [1-9]", line)]


def _alone(directory: Path, target: str, key: str, exe: str) -> str | None:
    """Compile one kernel file on its own; None if it builds without spills, else the report."""
    src = directory / f"k_{key[:24]}.cu"
    argv = _command(target, str(src), str(src.with_suffix(".alone.o")), exe)
    env = dict(os.environ, HIP_PLATFORM="amd") if target.startswith("hip") else None
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    log = done.stdout + done.stderr
    if done.returncode == 0 and not _spills(target, log):
        return None
    lines = log.strip().splitlines() or ["(no output)"]
    return f"{src}:\n  " + "\n  ".join(lines[:20]) + f"\n  repro: {_shell(target, argv)}"


def _nvdisasm() -> str | None:
    """nvdisasm from PATH, else from the nvidia-cuda-nvdisasm pip package."""
    import importlib.util

    found = shutil.which("nvdisasm")
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec and not found else []:
        found = next((str(p) for p in Path(root).glob("*/bin/nvdisasm")), None) or found
    return found


def _without_hmma(cubin: Path, texts: list[str], nvdisasm: str) -> list[str]:
    """The implicit-GEMM matrix kernels (forward, data gradient, weight-gradient partials) of the
    files `texts` whose machine code in `cubin` has no HMMA instruction, by name (or a file whose
    matrix kernel is not found)."""
    prefixes = _gemm_prefixes(texts)
    if not prefixes:
        return []
    sass = subprocess.run([nvdisasm, str(cubin)], capture_output=True, text=True, check=True).stdout
    return _without_units(re.split(r"\n\s*\.text\.", sass), prefixes, UNITS, cubin.name)


def _gemm_prefixes(texts: list[str]) -> list[str]:
    """The entry prefixes of the implicit-GEMM files among `texts` that have matrix kernels (forward,
    data gradient, weight gradient: not a bias gradient alone)."""
    return [re.search(r'extern "C" int cg_(\w+)\(', t).group(1) for t in texts
            if re.search(r"// kernel:  (fwd|dgrad|wgrad), algorithm igemm\n", t)]


def _without_units(functions: list[str], prefixes: list[str], units: dict, where: str) -> list[str]:
    """Of the GEMM kernels of `prefixes` among the disassembled `functions` (each opening with its
    mangled name), those without their dtype's instruction in `units` or with its unwanted one."""
    missing = []
    for prefix in prefixes:
        name = f"cgk_{prefix}"
        gemms = [f for f in functions if re.match(rf"_ZN{len(name)}{name}(3fwd|8bwd_data|18bwd_weight_partial)E", f)]
        if not gemms:
            missing.append(f"{where}: {name}: no matrix kernel found")
        dtype = re.search(r"_(bf16|f16|f32_tf32|f32|f64)(?:_|$)", prefix).group(1)
        wanted, unwanted = units[dtype]
        missing += [f"{where}: {f.split(':', 1)[0]} (wants {wanted})" for f in gemms
                    if not re.search(wanted, f) or (unwanted and re.search(unwanted, f))]
    return missing


def _without_mfma(obj: Path, texts: list[str]) -> list[str]:
    """Like _without_hmma, for a gfx90a batch: `obj`, its device assembly (_command's temps)."""
    prefixes = _gemm_prefixes(texts)
    if not prefixes:
        return []
    return _without_units(re.split(r"\n(?=_ZN\w+:)", obj.read_text()), prefixes, HIP_UNITS, obj.name)


# each dtype's instruction in an igemm GEMM kernel, and what must not be there (the FMA path)
HIP_UNITS = {"bf16": (r"v_mfma_f32_16x16x16_?bf16", None), "f16": (r"v_mfma_f32_16x16x16_?f16", None),
             "f32": (r"v_mfma_f32_16x16x4_?f32", None), "f64": (r"v_mfma_f64_16x16x4_?f64", r"v_fmac?_f64")}
UNITS = {"bf16": (r"HMMA\.16816\.F32", None), "f16": (r"HMMA\.16816\.F32", None),
         "f32_tf32": (r"HMMA\.1688\.F32\.TF32", None), "f32": (r"\bFFMA\b", r"\bHMMA\b"),
         "f64": (r"\bDMMA\.(884|8x8x4)\b", r"\bHMMA\b|\bDFMA\b")}


def test_every_default_kernel_of_the_cases_builds_with_the_vendor_compilers(session_cache_dir):
    compilers = {kind: tool if tool and shutil.which(tool) else None
                 for kind, tool in ((TargetKind.CUDA, knobs.nvcc()), (TargetKind.HIP, knobs.hipcc()))}
    if not any(compilers.values()):
        pytest.skip("neither nvcc nor hipcc is installed (CONVGEN_NVCC/PATH/CUDA_HOME, CONVGEN_HIPCC/PATH/ROCM_PATH)")
    started = time.monotonic()
    kernels, files = distinct_kernels(case_problems())
    generated = time.monotonic()
    root = Path(session_cache_dir) / "gpu-sweep"
    ninja = ["ninja_required_version = 1.3", "rule compile", "  command = $cmd > $out.log 2>&1",
             "  description = $desc"]
    outputs = {}
    for name in TARGETS:
        target = parse_target(name)
        exe = compilers[target.kind]
        if not exe:
            continue
        (root / name).mkdir(parents=True, exist_ok=True)
        wrappers = vendor_wrappers(target.kind.value)
        for key, (_, text) in kernels[name].items():
            # self-contained: the vendor's wrappers inline, and no include of anything but theirs
            assert wrappers in text and text.count("#include") == wrappers.count("#include"), key
            write_if_changed(root / name / f"k_{key[:24]}.cu", text)
        for i, keys in enumerate(batches(kernels[name])):
            src = f"{name}/batch{i:03d}.cu"
            write_if_changed(root / src, _umbrella(keys))
            out = src[:-3] + (".s" if name.startswith("hip") else ".o")   # (hipcc: the device assembly)
            outputs[root / out] = (name, keys)
            ninja += [f"build {out}: compile {src} | " + " ".join(f"{name}/k_{key[:24]}.cu" for key in keys),
                      f"  cmd = {_shell(name, _command(name, src, out, exe, temps=True))}",
                      f"  desc = {name} {src} ({len(keys)} kernel files)"]
    write_if_changed(root / "build.ninja", "\n".join(ninja) + "\n")
    done = subprocess.run([find_ninja(), "-C", str(root), "-k", "0", "-j", str(knobs.build_jobs())],
                          capture_output=True, text=True)
    compiled = time.monotonic()

    failures = []
    for out, (name, keys) in outputs.items():
        log_path = Path(f"{out}.log")
        log = log_path.read_text(errors="replace") if log_path.is_file() else ""
        if out.is_file() and not _spills(name, log):
            continue
        # the files the compiler's output names (by file or by kernel namespace), else every file
        named = [key for key in keys if f"k_{key[:24]}.cu" in log or f"cgk_{kernels[name][key][0][3:]}" in log]
        exe = compilers[parse_target(name).kind]
        with concurrent.futures.ThreadPoolExecutor(knobs.build_jobs()) as pool:
            alone = [f for f in pool.map(lambda key: _alone(out.parent, name, key, exe), named or keys) if f]
        # a batch that fails where none of its files does alone: report the batch itself
        failures += alone or [f"{out}: {(log.strip() or done.stdout.strip())[-3000:]}"]
    nvdisasm = _nvdisasm() if compilers[TargetKind.CUDA] else None
    without_units = []
    if nvdisasm:
        with concurrent.futures.ThreadPoolExecutor(knobs.build_jobs()) as pool:
            for missing in pool.map(lambda item: _without_hmma(item[0], [kernels[item[1][0]][k][1] for k in item[1][1]],
                                                               nvdisasm),
                                    [(out, job) for out, job in outputs.items()
                                     if job[0].startswith("cuda") and out.is_file()]):
                without_units += missing
    for out, (name, keys) in outputs.items():
        if name.startswith("hip") and out.is_file():
            without_units += _without_mfma(out, [kernels[name][k][1] for k in keys])
    checked = time.monotonic()
    built = {name: len(kernels[name]) for name in TARGETS if compilers[parse_target(name).kind]}
    summary = (f"GPU kernel sweep: {sum(files.values())} kernel files, distinct per target {built}, "
               f"{len(outputs)} compiler invocations; generated in {generated - started:.0f} s, "
               f"compiled in {compiled - generated:.0f} s with {knobs.build_jobs()} jobs; MFMA and HMMA "
               + (f"checked in {checked - compiled:.0f} s" if nvdisasm else "not checked (no nvdisasm)"))
    (root / "summary.txt").write_text(summary + "\n")
    print(summary)
    assert not failures, f"{len(failures)} kernel file(s) failed:\n" + "\n".join(failures[:10])
    assert not without_units, "GEMM kernels without their dtype's instructions:\n" + "\n".join(without_units[:20])
    missing = [tool for kind, tool in (("cuda", "nvcc"), ("hip", "hipcc")) if not compilers[TargetKind(kind)]]
    if not nvdisasm and compilers[TargetKind.CUDA]:
        missing.append("nvdisasm (CUDA toolkit or `pip install nvidia-cuda-nvdisasm`: HMMA not checked)")
    if missing:
        pytest.skip(f"compiled for {list(built)}; not installed: {', '.join(missing)}")
