"""Where a GPU backward's (and forward's) time goes, kernel by kernel, convgen's beside torch's (cuDNN).

    python tests/tools/device_kernels.py [--suite weak] [--batch 64] [--dtype bf16] [--layout channels_last]
                                         [--target cuda] [--iters 5] [--shapes a,b]

On a machine with a CUDA device: each shape's operands as `convgen bench` makes them, every kernel built
first, then each pass (forward; backward = grad input + weight + bias) run `--iters` times under
torch.profiler, convgen's and torch's apart. Prints per pass and library the kernels' device time per
call (and the time a call takes between two events on the stream), and below it each kernel's share
(its name, launches per call, microseconds per call): what the kernels cost without the host's cost
of a call, and which kernel of a pass to work on. Not a test: no device, no run (exit status 2).
"""

from __future__ import annotations

import argparse
import collections
import sys

import torch

from convgen.codegen.ir import DType, Layout
from convgen.bench import bench, suites
from convgen.cli.flags import target_flag


def _elapsed(fn, iters: int) -> float:
    """Microseconds per call between two events on the stream, around `iters` calls: the kernels' time
    where they, not the host's cost of a call, bound it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def _kernels(fn, iters: int) -> tuple[float, list[tuple[str, int, float]]]:
    """fn's kernels' device time per call in microseconds, and (kernel, launches per call, us per call)
    by time."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    time, count = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            time[event.name] += event.device_time_total
            count[event.name] += 1
    rows = sorted(((name, count[name] // iters, us / iters) for name, us in time.items()), key=lambda r: -r[2])
    return sum(time.values()) / iters, rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="weak")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--layout", default="channels_last", choices=("nchw", "channels_last"))
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--shapes", default="", help="comma-separated shape names (default: the suite's all)")
    parser.add_argument("--top", type=int, default=6, help="kernels listed per pass and library")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("device_kernels: torch has no CUDA device here", file=sys.stderr)
        return 2
    target = target_flag(args.target)
    layout = Layout.CHANNELS_LAST if args.layout == "channels_last" else Layout.CONTIGUOUS
    options = bench.Options(dtype=DType.parse(args.dtype), layout=layout, repeat=1, min_time=0.0, target=target)
    wanted = set(filter(None, args.shapes.split(",")))
    gen = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, {target.name()}, {args.dtype} {args.layout}, batch {args.batch}, "
          f"device time per call (us) over {args.iters} calls, torch.profiler")
    for name, shapes in suites.select(args.suite, args.batch):
        cases = [bench.make_case(name, s, options, gen) for s in shapes if not wanted or s.name in wanted]
        bench.build_all(cases)
        for case in cases:
            if case.error:
                print(f"\n{case.shape.name}: {case.error}")
                continue
            fns = bench.calls(case)
            print(f"\n{case.shape.name}: {case.problem.name()}")
            for what in ("forward", "backward"):
                for lib in ("torch", "convgen"):
                    total, rows = _kernels(fns[what, lib], args.iters)
                    print(f"  {what:8} {lib:7} {total:9.1f} us in kernels, {_elapsed(fns[what, lib], args.iters):9.1f} us "
                          "a call between events")
                    for kernel, launches, us in rows[:args.top]:
                        print(f"      {us:9.1f} us  x{launches:<3} {kernel[:110]}")
            case.tensors = {}
    return 0


if __name__ == "__main__":
    sys.exit(main())
