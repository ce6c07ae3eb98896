"""The `convgen` command line: show, explain, build and bench one problem; look after the cache.

    convgen show    --input 8,64,56,56 --weight 128,64,3,3 --padding 1        # generated source
    convgen explain --input 8,64,56,56 --weight 128,64,3,3 --op bwd_weight   # each pass's decisions
    convgen build   --input 8,64,56,56 --weight 128,64,3,3                   # artifact path
    convgen build   --input 8,64,56,56 --weight 128,64,3,3 --target cuda-sm_90   # nvcc: cubin + resource report
    convgen check   --input 2,8,9,9 --weight 16,8,3,3 --target hip-gfx90a --sim # every pass against ATen (float64)
    convgen bench   --input 8,64,56,56 --weight 128,64,3,3 --padding 1       # against torch
    convgen bench   --suite standard|weak|all [--dtype bf16 --layout channels_last --json]
    convgen cache info | verify [--remove] | clear
    convgen aot examples/resnet18_aot.py:resnet18 --input-shape 8,3,224,224   # runtime/cli/aot.py

A problem is given by its tensor shapes and torch's arguments; it becomes a `ConvProblem`
directly (no tensors), is lowered by `codegen.pipeline.lower` and emitted by `codegen.emit`.
The benchmark itself lives in runtime/bench/bench.py, its problem sets in runtime/bench/suites.py.
Exit status: 0 success, 1 a build or cache failure (or bad cache entries found by verify, or a
benchmarked shape that failed or came out of tolerance), 2 a bad problem or a request convgen
cannot serve (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ..codegen.emit import emit
from ..codegen.gpu.resources import explain_lines, short_name
from ..codegen.errors import BuildError, CacheError, ConvgenError, ConvSpecError
from ..codegen.ir import ConvProblem, DType, Layout, Op
from ..codegen.pipeline import lower
from ..codegen.plan import Plan
from ..codegen.target import Target, TargetKind, host_isas, isa_note, parse_target
from ..api import eager
from ..bench import bench, check, suites
from ..building import build, gpu_build, machine_code
from .. import knobs
from ..dispatch import dispatch, tiers
from ..dispatch.problem import expand_param, gpu_problem, padding_pairs
from . import aot as aot_cli, cache_cli
from .flags import add_dtype_flag, target_flag

LAYOUTS = {"auto": Layout.CONTIGUOUS, "nchw": Layout.CONTIGUOUS, "nhwc": Layout.CHANNELS_LAST,
           "channels_last": Layout.CHANNELS_LAST}
EXIT_FAILED, EXIT_USAGE = 1, 2


class Refused(ConvgenError):
    """A well-formed request convgen cannot serve (e.g. a benchmark of a GPU target): exit 2."""


# ---------------------------------------------------------------------------------- problems

def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConvSpecError(f"{flag}: expected an integer or comma-separated integers, but got {text!r}") from None


def _param(flag: str, text: str):
    """A per-axis parameter as torch takes it: one int, or a list of ints."""
    values = _ints(flag, text)
    return values[0] if len(values) == 1 else list(values)


def problem_from_args(args: argparse.Namespace) -> ConvProblem:
    """The validated ConvProblem that the problem flags describe (same rules as convgen.convolution)."""
    shape = _ints("--input", args.input)
    weight = _ints("--weight", args.weight)
    if len(shape) not in (3, 4, 5):
        raise ConvSpecError(f"--input {args.input}: expected N,C,L (1-D), N,C,H,W (2-D) or N,C,D,H,W (3-D), "
                            f"but got {len(shape)} sizes")
    if len(weight) != len(shape):
        raise ConvSpecError(f"--weight {args.weight}: expected {len(shape)} sizes to match the {len(shape)}-D input "
                            f"{args.input} (K,C/groups,kernel... or, transposed, C,K/groups,kernel...)")
    rank, groups = len(shape) - 2, args.groups
    if groups <= 0:
        raise ConvSpecError(f"groups={groups}: non-positive groups is not supported")
    n, c = shape[0], shape[1]
    if args.transposed:
        if weight[0] != c:
            raise ConvSpecError(f"Given transposed=1, weight of size {list(weight)}, expected input {list(shape)} "
                                f"to have {weight[0]} channels, but got {c} channels instead")
        k = weight[1] * groups
    else:
        if weight[1] * groups != c:
            raise ConvSpecError(f"Given groups={groups}, weight of size {list(weight)}, expected input {list(shape)} "
                                f"to have {weight[1] * groups} channels, but got {c} channels instead")
        k = weight[0]
    layout = LAYOUTS[args.layout]
    if layout is Layout.CHANNELS_LAST and rank == 1:
        raise ConvSpecError("--layout nhwc: channels-last applies to 2-D and 3-D convolutions; "
                            "use --layout auto or nchw for a 1-D input")
    kernel = weight[2:]
    stride = expand_param("stride", _param("--stride", args.stride), rank)
    dilation = expand_param("dilation", _param("--dilation", args.dilation), rank)
    output_padding = expand_param("output_padding", _param("--output-padding", args.output_padding), rank)
    # words go to torch's rule ('same', 'valid', or an error that says so); the rest must be integers
    padding = args.padding if args.padding.isalpha() else _param("--padding", args.padding)
    pairs = padding_pairs(padding, rank, kernel, stride, dilation, args.transposed)
    op = Op(getattr(args, "op", "fwd"))
    problem = ConvProblem(
        op=op, n=n, c=c, k=k, in_size=shape[2:], kernel=kernel, stride=stride, padding=pairs, dilation=dilation,
        groups=groups, transposed=args.transposed, output_padding=output_padding, dtype=DType(args.dtype),
        # a bias gradient reads only grad_output: the runtime keys it with contiguous input and weight
        input_layout=Layout.CONTIGUOUS if op is Op.BWD_BIAS else layout,
        weight_layout=Layout.CONTIGUOUS if op is Op.BWD_BIAS else layout, output_layout=layout,
        # as the runtime asks for it: a bias is added by FWD, its gradient fused into BWD_WEIGHT
        bias=args.bias and op in (Op.FWD, Op.BWD_WEIGHT))
    return problem.validate()


def _lowered(args) -> tuple[ConvProblem, Target, Plan]:
    problem = problem_from_args(args)
    target = target_flag(args.target)
    if target.kind is TargetKind.CPU:
        # as the runtime would plan it, including a tuned choice recorded for this machine
        return problem, target, dispatch.plan_for(problem, target)[0]
    problem = gpu_problem(problem, target.kind)   # CUDA f32: tf32 as torch.backends.cudnn.allow_tf32 says
    return problem, target, lower(problem, target)


def _source(plan: Plan):
    """The plan's KernelSource (C++ for a CPU target, self-contained CUDA or HIP for a GPU one);
    None when it needs no kernel."""
    return emit(plan)


def _no_kernel(plan: Plan) -> str:
    why = "; ".join(reason for name, reason in plan.reasons if name == "algorithm")
    return f"{plan.problem.name()} needs no kernel ({why}): nothing to generate"


# ---------------------------------------------------------------------------------- commands


def _wanted_source(args):
    """The problem's KernelSource, or None (said on stderr) when it needs no kernel."""
    _, _, plan = _lowered(args)
    source = _source(plan)
    if source is None:
        print(f"convgen: {_no_kernel(plan)}", file=sys.stderr)
    return source


def cmd_show(args) -> int:
    source = _wanted_source(args)
    if source is not None:
        sys.stdout.write(source.text)
    return 0


def _target_facts(target: Target) -> str:
    gpu = target.gpu
    if gpu is None:
        return f"{target.vector_bytes} B vectors, L1 {target.l1_bytes} B, L2 {target.l2_bytes} B"
    matrix = f"{gpu.matrix.name} {'/'.join(gpu.matrix.inputs)}" if gpu.matrix else "no matrix instruction"
    return (f"{gpu.part}: warp {gpu.warp_size}, {gpu.shared_bytes_per_block} B shared per block, "
            f"{gpu.registers_per_thread} registers per thread, {gpu.sm_count} SMs, {matrix}, "
            f"{'cp.async' if gpu.async_copy else 'no async copy'}")


def cmd_explain(args) -> int:
    problem, target, plan = _lowered(args)
    out = [f"problem:  {problem.name()}",
           f"key:      {problem.kernel_key()} (any batch size)",
           f"shapes:   input {list(problem.input_shape)}, weight {list(problem.weight_shape)}, "
           f"output {list(problem.output_shape)}",
           f"work:     {problem.flops / 1e9:.3f} GFLOP, {problem.bytes_moved / 1e6:.2f} MB compulsory traffic",
           f"target:   {target.name()} ({_target_facts(target)}): {isa_note(target)}",
           "", "decisions, pass by pass:"]
    for pass_name in plan.applied:
        reasons = [r for name, r in plan.reasons if name == pass_name] or ["(no decision recorded)"]
        out += [f"  [{pass_name}] {r}" for r in reasons]
    layouts = ", ".join(f"{kind}={lay.value}" for kind, lay in plan.layouts) or "none"
    t = plan.tiling   # every field the tiling pass set (those left at 0 do not apply to this algorithm)
    tiling = ", ".join(f"{f.name}={getattr(t, f.name)}" for f in dataclasses.fields(t)
                       if f.name != "threads_hint" and getattr(t, f.name)) + f"; {t.threads_hint}" if t else "none"
    out += ["", "plan:",
            f"  kernel op:   {plan.kop.value if plan.kop else '-'}",
            f"  algorithm:   {plan.algorithm} (candidates: {', '.join(plan.candidates) or '-'})",
            f"  layouts:     {layouts}",
            f"  conversions: {', '.join(plan.conversions) or 'none'}",
            *_layout_options(plan),
            f"  groups:      {plan.group_strategy}",
            f"  tiling:      {tiling}",
            f"  batch:       {'run-time argument' if plan.batch_is_runtime else 'compile-time constant'}"]
    source = emit(plan)
    if source is None:
        out.append(f"  kernel:      none -- {_no_kernel(plan)}")
    else:
        params = ", ".join(name for _, name in source.signature)
        out += [f"  kernel:      {source.name}" + (f" ({source.language}, self-contained)" if target.gpu else ""),
                f"  entry:       {source.entry}({params})"]
        out.append(f"  tier:        {tiers.describe(plan, source)}")
    if target.gpu and source is not None:
        out += ["", f"resources on {target.name()} ({target.gpu.part}):"] + _gpu_resources(plan, source)
    print("\n".join(out))
    return 0


def _layout_options(plan) -> list[str]:
    """The CPU layout pass's options (codegen/cpu/layout_cost.py), the one taken marked."""
    if not plan.layout_options:
        return []
    taken = tuple(plan.layouts)
    return ["  layout options (the layout pass's estimates, per image on one core; kernel + conversions):"] + [
        f"    {'*' if option.layouts == taken else ' '} {option.describe()}" for option in plan.layout_options]


def _gpu_resources(plan, source) -> list[str]:
    """The compiler's report (when its compiler is here; through the cache), occupancy, roofline."""
    try:
        artifact = gpu_build.build_gpu(source)
    except BuildError as e:
        return explain_lines(plan, None, str(e).splitlines()[0])
    loops, why = {}, ""
    try:
        if plan.target.kind is TargetKind.CUDA:
            found = machine_code.read_cubin(artifact.path)
        else:   # hipcc's device assembly of the same source (a second compile, -S)
            with tempfile.TemporaryDirectory(prefix="convgen-asm-") as d:
                found = machine_code.read_hip(source.text, plan.target.isa, gpu_build.compiler(TargetKind.HIP), Path(d))
        loops = {short_name(name): mix for name, mix in found.items()}
    except (OSError, subprocess.SubprocessError, BuildError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
    return explain_lines(plan, artifact.report, loops=loops, loops_unavailable=why)


def cmd_build(args) -> int:
    """A CPU kernel with the host compiler; a GPU one with its vendor's compiler (nvcc, hipcc),
    printing the artifact and the compiler's resource report, or with --sim for the simulator."""
    source = _wanted_source(args)
    if source is None:
        return 0
    if source.target.kind is TargetKind.CPU or args.sim:
        print(build.build(source, force=args.force))
        return 0
    artifact = gpu_build.build_gpu(source, force=args.force)
    print(artifact.path)
    summary = gpu_build.resource_summary(artifact.report)
    print(f"resources ({source.target.name()}; repro: {artifact.command}):")
    print("\n".join(f"  {line}" for line in summary) if summary else "  (the compiler reported nothing)")
    return 0


def cmd_check(args) -> int:
    """Every pass of the problem on random data against ATen in float64: one line each; exit 0
    only if all are within tolerance."""
    problem = problem_from_args(args)
    target = target_flag(args.target)
    padding = args.padding if args.padding.isalpha() else _param("--padding", args.padding)
    lines, ok = check.run_check(problem, padding, target, args.sim, seed=args.seed, profile=args.profile)
    print("\n".join(lines))
    return 0 if ok else EXIT_FAILED


def cmd_setup(args) -> int:
    import time

    start = time.perf_counter()
    path = eager.setup(force=args.force)
    print(f"eager launcher: {path} ({time.perf_counter() - start:.1f} s)\neager calls take {eager.status()}")
    start = time.perf_counter()
    libraries = tiers.setup()
    print(f"shape-generic kernels: {len(libraries)} in {knobs.generic_dir()} ({time.perf_counter() - start:.1f} s; "
          f"apart from the kernel cache: a new or cleared cache keeps them); a new shape runs them at once while its "
          f"own kernel builds in the background (CONVGEN_JIT={knobs.jit()})")
    return _setup_devices()


def _setup_devices() -> int:
    """The GPU generic tier's libraries for each torch CUDA device's arch (NVIDIA, or ROCm's), built by
    the vendor's compiler once per machine; nothing without a device."""
    import time

    if not torch.cuda.is_available():
        return 0
    done: set[str] = set()
    for index in range(torch.cuda.device_count()):
        start = time.perf_counter()
        try:
            target = dispatch.device_target(torch.device("cuda", index))
            if target.name() in done:
                continue
            done.add(target.name())
            libraries = tiers.setup(target, device=True)
        except ConvgenError as err:   # (BuildError included) the CPU's part stands; say what failed
            print(f"shape-generic kernels for cuda:{index}: not built: {err}", file=sys.stderr)
            return EXIT_FAILED
        print(f"shape-generic kernels for {target.name()} (cuda:{index}): {len(libraries)} in {knobs.generic_dir()} "
              f"({time.perf_counter() - start:.1f} s)")
    return 0


# ---------------------------------------------------------------------------------- bench

# problem flags that describe one problem, so that --suite cannot take them
_SHAPE_FLAGS = {"input": None, "weight": None, "stride": "1", "padding": "0", "dilation": "1", "groups": 1,
                "transposed": False, "output_padding": "0", "bias": False}


def cmd_bench(args) -> int:
    """One problem (the problem flags) or a suite (runtime/bench/suites.py); the work is in runtime/bench/bench.py."""
    target = target_flag(args.target)
    if target.kind is not TargetKind.CPU and not torch.cuda.is_available():
        raise Refused(f"--target {target.name()}: bench times GPU kernels on a device, and this machine has none "
                      f"(torch.cuda.is_available() is False); `convgen check --target {target.name()} --sim` runs "
                      f"them in the simulator (proving results, not speed)")
    if target.kind is TargetKind.CPU and target.isa not in host_isas():
        raise Refused(f"--target {args.target}: this CPU does not run {target.isa} code (it runs "
                      f"{', '.join(host_isas())}), so bench cannot time it here")
    if args.repeat < 1:
        raise ConvSpecError(f"--repeat {args.repeat}: need at least 1 run")
    if args.threads is not None and args.threads < 1:
        raise ConvSpecError(f"--threads {args.threads}: need at least 1 thread")
    if args.min_time < 0:
        raise ConvSpecError(f"--min-time {args.min_time}: need a time of 0 seconds or more")
    if args.suite:
        given = [f"--{k.replace('_', '-')}" for k, default in _SHAPE_FLAGS.items() if getattr(args, k) != default]
        if given:
            raise ConvSpecError(f"--suite {args.suite} takes its problems from the suite; drop {' '.join(given)} "
                                f"(or drop --suite to time one problem)")
        chosen = suites.select(args.suite, args.batch)
        dtype, layout = DType(args.dtype), LAYOUTS[args.layout]
    else:
        if args.batch is not None:
            raise ConvSpecError("--batch sets a suite's batch size; one problem takes its batch from --input")
        if args.input is None or args.weight is None:
            raise ConvSpecError("bench: give --suite standard|weak|all|more|smoke, or one problem with --input and "
                                "--weight (and the other problem flags)")
        problem = problem_from_args(args)
        chosen = [("problem", [suites.BenchShape.from_problem(problem)])]
        dtype, layout = problem.dtype, problem.input_layout
    options = bench.Options(dtype=dtype, layout=layout, repeat=args.repeat, min_time=args.min_time, target=target)
    if target.kind is TargetKind.CPU:
        return bench.main(chosen, options, args.threads, args.json)
    # torch's current CUDA device serves the target's arch (it must run its machine code); f32 as tf32
    # or not as --no-tf32 says, for torch's convolutions and convgen's alike
    with check.knobs_for(target, sim=False):
        dispatch.device_target(torch.device("cuda"))   # a device that cannot run that arch: exit 2, said why
        return bench.main(chosen, options, args.threads, args.json)


# ---------------------------------------------------------------------------------- parser


def _problem_flags(with_op: bool, required: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("problem (sizes and per-axis values: one integer or a comma list)")
    if with_op:
        g.add_argument("--op", choices=[o.value for o in Op], default="fwd",
                       help="which pass (default fwd); bwd_weight with --bias also produces the bias gradient")
    g.add_argument("--input", required=required, metavar="N,C,H,W", help="input size (1-D: N,C,L; 3-D: N,C,D,H,W)")
    g.add_argument("--weight", required=required, metavar="K,C/g,R,S",
                   help="weight size (transposed: Cin,Cout/g,R,S)")
    g.add_argument("--stride", default="1", metavar="S[,S..]", help="default 1")
    g.add_argument("--padding", default="0", metavar="P[,P..]|same|valid", help="default 0")
    g.add_argument("--dilation", default="1", metavar="D[,D..]", help="default 1")
    g.add_argument("--groups", type=int, default=1, metavar="G", help="default 1")
    g.add_argument("--transposed", action="store_true", help="a transposed convolution")
    g.add_argument("--output-padding", default="0", metavar="OP[,OP..]", help="transposed only; default 0")
    g.add_argument("--bias", action="store_true", help="with a bias (fwd) / bias gradient (bwd_weight)")
    add_dtype_flag(g, "the problem's dtype")
    g.add_argument("--layout", choices=list(LAYOUTS), default="auto",
                   help="nhwc or channels_last: channels-last input, weight and output; auto/nchw: contiguous")
    g.add_argument("--target", default="cpu", metavar="cpu|cuda|hip",
                   help="cpu (CONVGEN_ISA, else AVX2 where this CPU runs it), cpu-avx512, cpu-avx2, cpu-generic, "
                        "cuda[-sm_80|-sm_86|-sm_89|-sm_90|-sm_90a] (default sm_90), hip[-gfx90a|-gfx940] (default "
                        "gfx90a)")
    g.add_argument("--no-tf32", action="store_true",
                   help="CUDA f32 in f32 on the CUDA cores, as with torch.backends.cudnn.allow_tf32 = False (torch's "
                        "default, True, lets f32 run as tf32 on the tensor cores)")
    return p


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="convgen", description="Generate, inspect, build and benchmark convolution kernels.",
        epilog="example: convgen explain --input 8,64,56,56 --weight 128,64,3,3 --padding 1 --op bwd_weight")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    problem = _problem_flags(True)
    sub.add_parser("show", parents=[problem], help="print the generated source for a problem").set_defaults(
        run=cmd_show)
    sub.add_parser("explain", parents=[problem], help="print each pass's decisions for a problem").set_defaults(
        run=cmd_explain)
    b = sub.add_parser("build", parents=[problem], help="build a problem's kernel and print the artifact's path")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    b.add_argument("--sim", action="store_true", help="GPU targets: build for the SIMT simulator instead of with "
                                                      "nvcc/hipcc")
    b.set_defaults(run=cmd_build)
    c = sub.add_parser("check", parents=[problem],
                       help="run every pass of a problem on random data against ATen in float64",
                       description="Runs the problem's kernels for every pass (forward with a bias, data gradient, "
                                   "weight gradient with the bias gradient fused, bias gradient alone; --op is "
                                   "ignored) on random data and compares each with ATen in float64: one line per "
                                   "pass with the relative error and ok/FAIL; exit status 0 only if all pass. GPU "
                                   "targets run in the SIMT simulator with --sim.")
    c.add_argument("--sim", action="store_true", help="GPU targets: run the kernels in the SIMT simulator")
    c.add_argument("--seed", type=int, default=0, help="the random data's seed (default 0)")
    c.add_argument("--profile", action="store_true",
                   help="with --sim: under each pass, its launches' counters (bank conflicts, sectors per request, "
                        "bytes, barriers, tensor instructions)")
    c.set_defaults(run=cmd_check)
    bench = sub.add_parser(
        "bench", parents=[_problem_flags(False, required=False)], help="time convgen against torch, side by side",
        description="Times forward and backward (grad input, weight and bias together) of a suite of problems, or "
                    "of one problem given by the problem flags: torch and convgen alternately in one process, "
                    "after a build of every kernel, a check against float64 ATen and a warm-up. Reports medians, "
                    "GFLOP/s, % of the machine's FMA peak and the ratio torch/convgen (above 1: convgen is "
                    "faster), with its geometric mean per suite. See BENCHMARKS.md.")
    bench.add_argument("--suite", choices=suites.CHOICES,
                       help="a problem set of runtime/bench/suites.py (all = standard + weak; more: other networks' "
                            "layers; smoke: tiny, for tests)")
    bench.add_argument("--batch", type=int, help="every suite shape's batch size (default: the suite's, mostly 8)")
    bench.add_argument("--repeat", type=int, default=7, help="timed samples per pass and library (default 7)")
    bench.add_argument("--threads", type=int, help="torch.set_num_threads for both, restored after (default: torch's)")
    bench.add_argument("--min-time", type=float, default=0.05, help="seconds per sample, at least (default 0.05)")
    bench.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    bench.set_defaults(run=cmd_bench)
    aot_cli.add_parser(sub)
    setup = sub.add_parser(
        "setup", help="build the eager launcher for this torch and Python and the shape-generic kernels (once; about 30 s)",
        description="Builds, into the kernel cache, the compiled module that runs eager forward calls and records "
                    "their autograd nodes in C++ (runtime/api/eager.py). Without it eager calls take the Python path "
                    "(same results, a few µs more per call). Does nothing when a valid one is cached.")
    setup.add_argument("--force", action="store_true", help="rebuild even if cached")
    setup.set_defaults(run=cmd_setup)
    cache_cli.add_parser(sub)
    return top


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:   # --help, or argparse's own usage error (already printed)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        if not getattr(args, "no_tf32", False):
            return args.run(args)
        allowed = torch.backends.cudnn.allow_tf32   # read where GPU problems are formed (gpu_problem)
        torch.backends.cudnn.allow_tf32 = False
        try:
            return args.run(args)
        finally:
            torch.backends.cudnn.allow_tf32 = allowed
    except BuildError as e:
        print(f"convgen: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except CacheError as e:
        print(f"convgen: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    except (ConvgenError, ValueError, NotImplementedError) as e:
        print(f"convgen: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # `convgen show ... | head`: quietly stop writing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
