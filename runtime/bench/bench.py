"""`convgen bench`: convgen against torch, side by side, on one problem or on a suite of them.

Owns the benchmark method and the report (a JSON-able dict; its table is table.py's):

1. operands: deterministic random tensors per shape, in the requested dtype and memory format;
   torch and convgen get the very same tensors.
2. build: every kernel of every shape in ONE ninja run (`ops.call_problems` + `dispatch.prepare`);
   a shape whose kernels do not build (or that convgen refuses) becomes a row with an error.
3. check: once per shape, each result (output, grad_input, grad_weight, grad_bias) of convgen and
   of torch against ATen on the operands upcast to float64: ‖out − ref‖ / ‖ref‖; convgen's is
   flagged above its tolerance: the larger of the dtype's bound grown with the reduction length
   (the rule of tests/support/reference.py) and twice torch's own error on the same result.
4. time: the public entry points end to end (`convgen.convolution` against
   `aten.convolution`, `convgen.convolution_backward` against `aten.convolution_backward` with
   output_mask [True, True, True]), so allocation and any layout conversion are counted. After a
   warm-up, each sample runs a call often enough to last --min-time; per repetition the four
   (pass, library) samples alternate, and which library goes first alternates too; the median
   of --repeat samples is reported.
5. FLOPs: forward 2·N·K·(C/g)·prod(out)·prod(kernel) (the bias add is not counted); backward the
   data gradient plus the weight gradient (2x that) plus the bias sum N·K·prod(out). A transposed
   convolution counts as its equivalent direct one (input and output swap roles).
6. peak: `peak.measure` with the threads in use; "% peak" is convgen's GFLOP/s over the f32 FMA
   peak (for f64 over half of it: half the lanes).
7. the cost of a call: `convgen.conv2d` against `torch.nn.functional.conv2d` on a tiny problem
   (CALL_PROBLEM, float32), with a weight and bias that require grad and without; the four
   alternate in rounds of CALL_CALLS calls, and the best round of CALL_ROUNDS is reported, in µs
   per call (the least disturbed round: these machines are shared), with the path eager calls
   take (runtime/api/eager.py); runtime/bench/call.py.
8. on a GPU (`--target cuda...` where torch has a CUDA device): the same operands copied to torch's
   current device, convgen's kernels of that arch (CONVGEN_GPU_ARCH) against torch's own (cuDNN);
   the float64 references are ATen's there (cuDNN's float64: a CPU's would take minutes at the
   batches a GPU is timed at); each sample is bounded by device synchronisations
   (so it counts every launch and allocation of the calls, as torch's do); "% peak" is of the
   arch's datasheet rate for the dtype (bf16/f16 and tf32 on the tensor cores, f32 without tf32 on
   the CUDA cores, f64 on the tensor cores: codegen/arch/gpu.py's Peaks), not a probe; the cost of
   a call is the CPU's and is not measured there. A sample is the longer of the host's time to
   issue the calls (Python, dispatch, allocation, launches) and the device's to run them: where
   the kernels are shorter than the host's part of a call (tens of µs), the ratio is the hosts'.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Callable, Sequence, TextIO

import torch

from .. import knobs
from ..api import functional, ops
from ..dispatch import dispatch
from . import call, peak
from ..codegen.errors import ConvgenError
from ..codegen.ir import ConvProblem, DType, Layout, Op
from ..codegen.arch.gpu import GPU_ARCHS
from ..codegen.target import Target, TargetKind, host_class, host_cpu
from ..codegen.version import generator_version
from ..dispatch.problem import TORCH_DTYPES, base_problem, memory_format
from ..api.serve_aten import enabled
from .suites import BenchShape
from .table import columns, header, summary_line, table_row, width

MASK = [True, True, True]
RESULTS = ("output", "grad_input", "grad_weight", "grad_bias")
# ‖out − ref‖ / ‖ref‖ bounds against float64 for reductions of up to 4096 terms, growing with
# √(terms / 4096) beyond: the rule (and the reasoning) of tests/support/reference.py.
TOLERANCE = {DType.F64: 1e-12, DType.F32: 1e-6, DType.BF16: 1e-2, DType.F16: 1e-3}
SHORT_REDUCTION = 4096


@dataclasses.dataclass(frozen=True)
class Options:
    dtype: DType = DType.F32
    layout: Layout = Layout.CONTIGUOUS
    repeat: int = 7
    min_time: float = 0.05     # seconds per sample, at least
    target: Target | None = None

    @property
    def device(self) -> str | None:
        """"cuda" where the target is a GPU's (torch's current CUDA device), else None (the CPU)."""
        return "cuda" if self.target is not None and self.target.kind is not TargetKind.CPU else None


@dataclasses.dataclass
class Case:
    """One shape made concrete: operands, the four timed calls, FLOPs; or the error that stopped it."""

    suite: str
    shape: BenchShape
    layout: Layout
    tensors: dict = dataclasses.field(default_factory=dict)
    problem: ConvProblem | None = None
    error: str | None = None

    def args(self):
        return self.shape.conv_args()


# ------------------------------------------------------------------------------ operands

def _policy() -> str:
    """Specialised kernels, built before timing (eager); the generic tier's where CONVGEN_JIT=generic
    asks to measure that tier."""
    return "generic" if knobs.jit() == "generic" else "eager"


def layout_for(shape: BenchShape, layout: Layout) -> Layout:
    """Channels-last applies to 2-D and 3-D convolutions; a 1-D one stays contiguous."""
    return layout if shape.rank in (2, 3) else Layout.CONTIGUOUS


def make_case(suite: str, shape: BenchShape, options: Options, gen: torch.Generator) -> Case:
    layout = layout_for(shape, options.layout)
    case = Case(suite, shape, layout)
    dtype = TORCH_DTYPES[options.dtype]

    def tensor(size):
        fmt = memory_format(layout, len(size))
        return torch.randn(size, generator=gen).to(dtype).contiguous(memory_format=fmt)

    try:
        x, w = tensor(shape.input), tensor(shape.weight)
        b = torch.randn(shape.out_channels, generator=gen).to(dtype) if shape.bias else None
        case.problem = base_problem(x, w, b, *case.args())
        gy = tensor(case.problem.output_shape)
        if options.device:   # the same values on the device, in the same layouts
            x, w, gy = x.to(options.device), w.to(options.device), gy.to(options.device)
            b = b.to(options.device) if b is not None else None
        case.tensors = {"input": x, "weight": w, "bias": b, "grad_output": gy}
    except (ConvgenError, ValueError, NotImplementedError) as e:
        case.error = f"{type(e).__name__}: {e}"
    return case


def calls(case: Case) -> dict[tuple[str, str], Callable]:
    """The four timed calls by (pass, library): public entry points, same tensors for both."""
    t, conv = case.tensors, case.args()
    x, w, b, gy = t["input"], t["weight"], t["bias"], t["grad_output"]
    bias_sizes = [case.shape.out_channels]
    aten = torch.ops.aten
    return {
        ("forward", "torch"): lambda: aten.convolution(x, w, b, *conv),
        ("forward", "convgen"): lambda: functional.convolution(x, w, b, *conv),
        ("backward", "torch"): lambda: aten.convolution_backward(gy, x, w, bias_sizes, *conv, MASK),
        ("backward", "convgen"): lambda: ops.convolution_backward(gy, x, w, bias_sizes, *conv, MASK),
    }


def flops(problem: ConvProblem) -> dict[str, int]:
    """Forward and backward (data + weight + bias gradients) FLOPs; see the module docstring."""
    plain = dataclasses.replace(problem, bias=False)
    backward = sum(dataclasses.replace(plain, op=op).flops for op in (Op.BWD_DATA, Op.BWD_WEIGHT, Op.BWD_BIAS))
    return {"forward": plain.flops, "backward": backward}


# ------------------------------------------------------------------------------ build and check


def build_all(cases: Sequence[Case]) -> None:
    """Every kernel of every case in one ninja run; on failure, case by case, recording errors."""
    good = [c for c in cases if c.error is None]

    def problems(c: Case):
        t = c.tensors
        return ops.call_problems(t["input"], t["weight"], t["bias"], *c.args(), output_mask=MASK,
                                 grad_output=t["grad_output"])

    device = good[0].tensors["input"].device if good else None
    try:
        dispatch.prepare([p for c in good for p in problems(c)], device, policy=_policy())
        return
    except (ConvgenError, ValueError, NotImplementedError):
        pass
    for c in good:   # find which ones fail (the others are built by now, or build here)
        try:
            dispatch.prepare(problems(c), device, policy=_policy())
        except (ConvgenError, ValueError, NotImplementedError) as e:
            c.error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def rel_err(out: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (the largest |out| when ‖ref‖ is 0); inf for NaN or wrong shape."""
    if out is None or ref is None or out.shape != ref.shape:
        return math.inf
    o, r = out.detach().double(), ref.detach().double()
    if o.numel() == 0:
        return 0.0
    norm = torch.linalg.vector_norm(r).item()
    err = torch.linalg.vector_norm(o - r).item() / norm if norm else o.abs().max().item()
    return err if math.isfinite(err) else math.inf


def tolerances(problem: ConvProblem, dtype: DType) -> dict[str, float]:
    """Per result: the dtype's bound, grown by √(terms / 4096) for long reductions (tests/support/reference.py)."""
    over_channels = max(problem.c, problem.k) // problem.groups * math.prod(problem.kernel)
    over_images = problem.n * max(math.prod(problem.in_size), math.prod(problem.out_size))
    terms = {"output": over_channels, "grad_input": over_channels, "grad_weight": over_images,
             "grad_bias": over_images}
    return {k: TOLERANCE[dtype] * max(1.0, math.sqrt(v / SHORT_REDUCTION)) for k, v in terms.items()}


def check(case: Case, fns: dict) -> dict:
    """Errors of convgen's and torch's results against ATen in float64, with the tolerances."""
    t, conv = case.tensors, case.args()
    wide = {k: (v.double() if v is not None else None) for k, v in t.items()}   # (on a device: ATen's float64 there)
    aten = torch.ops.aten
    ref = (aten.convolution(wide["input"], wide["weight"], wide["bias"], *conv),
           *aten.convolution_backward(wide["grad_output"], wide["input"], wide["weight"],
                                      [case.shape.out_channels], *conv, MASK))
    errors = {}
    for lib in ("convgen", "torch"):
        got = (fns["forward", lib](), *fns["backward", lib]())
        errors[lib] = {name: rel_err(g, r) for name, g, r in zip(RESULTS, got, ref)}
    # flagged only when worse than the rule AND worse than twice torch's own error on this shape:
    # f32 sums of thousands of terms reach the rule's bound in torch too, while a real bug (a
    # term missing, an element unwritten) is off by 1e-4 or far more
    rule = tolerances(case.problem, DType(case.problem.dtype))
    tol = {k: max(rule[k], 2 * errors["torch"][k]) for k in RESULTS}
    return {"rel_error": errors["convgen"], "torch_rel_error": errors["torch"], "tolerance": tol,
            "within_tolerance": all(errors["convgen"][k] <= tol[k] for k in RESULTS)}


# ------------------------------------------------------------------------------ timing


def _no_sync() -> None:
    pass


def time_case(fns: dict, repeat: int, min_time: float, sync: Callable[[], None] = _no_sync
              ) -> dict[tuple[str, str], list[float]]:
    """Per (pass, library), `repeat` samples in seconds per call, taken alternately after a warm-up;
    `sync` (a device's synchronisation) bounds each sample and the warm-up's timing."""
    inner = {}
    for key, fn in fns.items():   # warm-up; it also sizes each sample to last about min_time
        fn()
        sync()
        start = time.perf_counter()
        fn()
        sync()
        inner[key] = max(1, math.ceil(min_time / max(time.perf_counter() - start, 1e-7)))
    samples = {key: [] for key in fns}
    for r in range(repeat):
        libraries = ("torch", "convgen") if r % 2 == 0 else ("convgen", "torch")
        for pass_name in ("forward", "backward"):
            for lib in libraries:
                fn, count = fns[pass_name, lib], inner[pass_name, lib]
                sync()
                start = time.perf_counter()
                for _ in range(count):
                    fn()
                sync()
                samples[pass_name, lib].append((time.perf_counter() - start) / count)
    return samples


def measure(case: Case, options: Options, peak_gflops: float) -> dict:
    """The report row of one case: its description, the check and the timings."""
    row = {"suite": case.suite, "name": case.shape.name, "comment": case.shape.comment, **case.shape.describe(),
           "layout": case.layout.value}
    if case.error is not None:
        return {**row, "error": case.error}
    row["problem"] = case.problem.name()
    work = flops(case.problem)
    row["flops"] = work
    fns = calls(case)
    with torch.no_grad():
        row.update(check(case, fns))
        samples = time_case(fns, options.repeat, options.min_time,
                            torch.cuda.synchronize if options.device else _no_sync)
    results = {}
    for pass_name in ("forward", "backward"):
        t_torch = statistics.median(samples[pass_name, "torch"])
        t_cg = statistics.median(samples[pass_name, "convgen"])
        results[pass_name] = {
            "torch_ms": t_torch * 1e3, "convgen_ms": t_cg * 1e3,
            "torch_gflops": work[pass_name] / t_torch / 1e9, "convgen_gflops": work[pass_name] / t_cg / 1e9,
            "ratio_torch_over_convgen": t_torch / t_cg,
            "torch_pct_peak": 100 * work[pass_name] / t_torch / 1e9 / peak_gflops,
            "convgen_pct_peak": 100 * work[pass_name] / t_cg / 1e9 / peak_gflops,
            "torch_samples_ms": [s * 1e3 for s in samples[pass_name, "torch"]],
            "convgen_samples_ms": [s * 1e3 for s in samples[pass_name, "convgen"]],
        }
    row["results"] = results
    return row


def summarize(rows: Sequence[dict]) -> dict:
    """Geometric mean and minimum of the ratio torch/convgen per pass over the rows that ran."""
    done = [r for r in rows if "results" in r]
    out = {"shapes": len(rows), "timed": len(done), "errors": len(rows) - len(done),
           "outside_tolerance": [r["name"] for r in done if not r["within_tolerance"]]}
    for pass_name in ("forward", "backward"):
        ratios = [(r["results"][pass_name]["ratio_torch_over_convgen"], r["name"]) for r in done]
        out[f"geomean_{pass_name}"] = math.exp(statistics.fmean(math.log(v) for v, _ in ratios)) if ratios else None
        low = min(ratios, default=None)
        out[f"min_{pass_name}"] = {"ratio": low[0], "name": low[1]} if low else None
    return out


# ------------------------------------------------------------------------------ the run


def load_warning(when: str) -> tuple[float, str | None]:
    """The 1-minute load average, and a warning when it exceeds the machine's CPU count."""
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > cpus:
        return load, (f"load average {load:.2f} {when} exceeds the {cpus} CPU(s) of this machine: other work "
                      f"competes for the cores and distorts these timings")
    return load, None


def device_peak(target: Target, dtype: DType) -> tuple[float, str]:
    """GFLOP/s of the datasheet rate a GPU target's arch gives `dtype` (NaN where its arch has no
    figures), and what it is: bf16/f16 on the tensor cores; f32 on them as tf32 where torch lets
    convolutions use tf32 (torch.backends.cudnn.allow_tf32), else on the CUDA cores; f64 on the
    tensor cores where the part has them."""
    peaks = GPU_ARCHS[target.isa].peaks
    if peaks is None:
        return math.nan, f"no datasheet figures for {target.isa}"
    if dtype in (DType.BF16, DType.F16):
        rate, unit = peaks.matrix16, "bf16/f16 tensor cores"
    elif dtype is DType.F32 and bool(torch.backends.cudnn.allow_tf32):
        rate, unit = peaks.tf32, "tf32 tensor cores (torch.backends.cudnn.allow_tf32)"
    elif dtype is DType.F32:
        rate, unit = peaks.matrix32 or peaks.f32, "f32"
    else:
        rate, unit = peaks.matrix64 or peaks.f64, "f64"
    return rate * 1e3, f"{unit}, dense: {peaks.source}"


def machine(target: Target) -> dict:
    """The host: CPU model and class (ISA levels, native bf16), what torch's CPU kernels use on it
    (its dispatch level; whether ATen sends bf16 convolutions to oneDNN), and the target generated for;
    for a GPU target, torch's current device too (name, arch, torch's CUDA and cuDNN versions)."""
    gpu = {}
    if target.kind is not TargetKind.CPU:
        index = torch.cuda.current_device()
        gpu = {"device": {"name": torch.cuda.get_device_name(index),
                          "capability": list(torch.cuda.get_device_capability(index)),
                          "torch_cuda": torch.version.cuda, "torch_hip": torch.version.hip,
                          "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}}
    return {**gpu, "cpu": peak.cpu_model(), "cpus": os.cpu_count(), "host_class": host_class(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            "target": target.name(), "platform": platform.platform(), "python": platform.python_version()}


def _peak(options: Options, target: Target, threads: int) -> tuple[peak.Peak | None, float, dict]:
    """(the CPU's probe or None, the GFLOP/s "% peak" is of, the report's "peak"): the f32 FMA probe
    on the CPU (half of it for f64), the arch's datasheet rate for the dtype on a device."""
    if options.device:
        gflops, basis = device_peak(target, options.dtype)
        return None, gflops, {"gflops": gflops, "threads": None, "theoretical_gflops": None,
                              "pct_peak_of_gflops": gflops, "pct_peak_basis": basis}
    probe = peak.measure(threads, target)
    gflops = probe.gflops / 2 if options.dtype is DType.F64 else probe.gflops
    return probe, gflops, {**probe.to_json(), "pct_peak_of_gflops": gflops,
                           "pct_peak_basis": "half the f32 FMA peak (f64 has half the lanes)"
                           if options.dtype is DType.F64 else "the f32 FMA peak (bf16/f16 compute in f32)"}


@enabled(False)   # torch's side (and the float64 reference) is torch's own, even inside convgen.enabled()
def run(suites: Sequence[tuple[str, Sequence[BenchShape]]], options: Options, out: TextIO | None = None) -> dict:
    """Benchmark `suites` and return the report; with `out`, print the table there as rows finish.

    Warnings (load, tolerance) go to stderr as they arise and into report["warnings"].
    """
    target = options.target or host_cpu()
    warnings: list[str] = []

    def warn(message: str | None) -> None:
        if message:
            warnings.append(message)
            print(f"convgen: warning: {message}", file=sys.stderr)

    load_before, message = load_warning("before the benchmark")
    warn(message)
    gen = torch.Generator().manual_seed(0)
    cases = [(name, [make_case(name, s, options, gen) for s in shapes]) for name, shapes in suites]
    build_all([c for _, group in cases for c in group])
    threads = torch.get_num_threads()
    probe, peak_gflops, peak_report = _peak(options, target, threads)
    report = {
        "machine": machine(target), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "convgen": generator_version(), "target": target.name(), "threads": threads,
        "dtype": options.dtype.value, "layout": options.layout.value, "repeat": options.repeat,
        "min_time_s": options.min_time,
        "peak": peak_report,
        "flops": "forward 2*N*K*(C/g)*prod(out)*prod(kernel) (bias add not counted); backward: data + weight "
                 "gradients (2x forward) + bias sum N*K*prod(out); transposed: as the equivalent direct conv",
        "ratio": "torch ms / convgen ms (above 1: convgen is faster)",
        "suites": [],
    }
    if out is not None:
        print(header(report), file=out, flush=True)
    for name, group in cases:
        w = width(c.shape.name for c in group)
        if out is not None:
            print(f"\nsuite {name} ({len(group)} shapes):\n{columns(w)}", file=out, flush=True)
        rows = []
        for case in group:
            row = measure(case, options, peak_gflops)
            case.tensors = {}   # free the operands
            if "error" in row:
                warn(f"{name}/{row['name']}: not timed: {row['error']}")
            elif not row["within_tolerance"]:
                worst = max(RESULTS, key=lambda k: row["rel_error"][k] / row["tolerance"][k])
                warn(f"{name}/{row['name']}: {worst} relative error {row['rel_error'][worst]:.2e} exceeds the "
                     f"tolerance {row['tolerance'][worst]:.1e} ({options.dtype.value})")
            rows.append(row)
            if out is not None:
                print(table_row(row, w), file=out, flush=True)
        suite = {"name": name, "rows": rows, "summary": summarize(rows)}
        report["suites"].append(suite)
        if out is not None:
            print(summary_line(suite["summary"]), file=out, flush=True)
    if len(report["suites"]) > 1:
        report["summary"] = summarize([r for suite in report["suites"] for r in suite["rows"]])
        if out is not None:
            print("\n" + summary_line(report["summary"], "all suites: geomean torch/convgen"), file=out)
    above = sorted({f"{r['name']} {lib}" for suite in report["suites"] for r in suite["rows"] if "results" in r
                    for res in r["results"].values() for lib in ("torch", "convgen") if res[f"{lib}_pct_peak"] > 100})
    if above and probe is not None:
        warn(f"the peak probe read {probe.gflops:.1f} GFLOP/s, below what {', '.join(above)} reached: the machine "
             f"was busier during the probe than during those timings, so '% peak' reads high (the ratios are "
             f"unaffected)")
    report["call"] = None if options.device else call.call_cost()   # the CPU's cost of a call
    if out is not None and report["call"] is not None:
        print("\n" + call.call_line(report["call"]), file=out, flush=True)
    load_after, message = load_warning("after the benchmark")
    warn(message)
    report["load_average"] = {"before": load_before, "after": load_after}
    report["warnings"] = warnings
    return report


def main(suites: Sequence[tuple[str, Sequence[BenchShape]]], options: Options, threads: int | None,
         as_json: bool) -> int:
    """What `convgen bench` does: run with `threads` (torch's restored afterwards), print, exit status.

    Exit status 1 when a shape failed to build or a result is outside its tolerance. A report of
    one problem (suite "problem") also carries that row's "problem", "results" and "rel_error" at
    its top level.
    """
    saved = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        report = run(suites, options, out=None if as_json else sys.stdout)
    finally:
        torch.set_num_threads(saved)   # main() may be called in-process: leave torch as it was
    if len(suites) == 1 and suites[0][0] == "problem":
        row = report["suites"][0]["rows"][0]
        report.update({k: row[k] for k in ("problem", "results", "rel_error", "error") if k in row})
    if as_json:
        print(json.dumps(_plain(report), indent=2, allow_nan=False))
    return 0 if ok(report) else 1


def _plain(value):
    """JSON has no inf or NaN: a non-finite number (an error that could not be measured) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def ok(report: dict) -> bool:
    """Every shape timed and within tolerance."""
    return all(s["summary"]["errors"] == 0 and not s["summary"]["outside_tolerance"] for s in report["suites"])
