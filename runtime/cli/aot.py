"""`convgen aot`: a model (or a JSON shape list) -> generated/NAME/ -> a built bundle, with a summary.

    convgen aot examples/resnet18_aot.py:resnet18 --input-shape 8,3,224,224 --out generated/resnet18
    convgen aot mypkg.models:Net --input-shape 4,1,16000 --dtype f32
    convgen aot --shapes shapes.json --out generated/mynet
    convgen aot ... --target cpu,cuda-sm_80,cuda-sm_90,hip-gfx90a    (GPU kernels too: runtime/aot/gpu.py)

MODULE is a dotted module name (imported with the working directory on sys.path, as `python -m`
does) or a .py file; CALLABLE is a name in it: an nn.Module instance, or a class or function
that returns one when called with no arguments. The model is put in training mode and run once
forward and backward on random inputs of the given shapes (runtime/api/shapes.py), then
runtime/aot/aot.py writes and builds the bundle.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path

from ..codegen.errors import ConvgenError, ConvSpecError
from ..codegen.ir import DType, Layout
from ..codegen.target import TargetKind, parse_target
from ..aot import aot, gpu
from ..api.shapes import collect, problems_from_json
from ..dispatch.problem import TORCH_DTYPES, memory_format
from .flags import add_dtype_flag


def add_parser(sub) -> None:
    p = sub.add_parser(
        "aot", help="generate and build every kernel a model's training step needs, as one importable bundle",
        description="Collects the convolutions of one training step of a model (forward, data, weight and bias "
                    "gradients; nn.Conv* modules and functional calls alike), writes one readable source per kernel "
                    "and a manifest under --out, and builds them all in one parallel ninja run into a Python module. "
                    "Load it with convgen.load_bundle(OUT) or CONVGEN_BUNDLES=OUT. Re-running with nothing changed "
                    "rewrites and rebuilds nothing.")
    p.add_argument("model", nargs="?", metavar="MODULE:CALLABLE",
                   help="e.g. examples/resnet18_aot.py:resnet18 or mypkg.models:Net")
    p.add_argument("--input-shape", action="append", default=[], metavar="N,C,H,W",
                   help="the shape of one model input (repeat for several inputs)")
    p.add_argument("--shapes", metavar="FILE.json", help="a JSON shape list instead of a model (see convgen.collect)")
    p.add_argument("--out", metavar="DIR", help="bundle directory (default generated/NAME)")
    p.add_argument("--name", help="bundle name (default: the callable's name, or the --out directory's)")
    p.add_argument("--target", default="cpu", metavar="cpu[,cuda-sm_90,...]",
                   help="comma list: cpu (CONVGEN_ISA, else AVX2 where this CPU runs it) or cpu-avx512|avx2|generic "
                        "(at most one), and GPU targets cuda-sm_80|sm_86|sm_89|sm_90 and hip-gfx90a|gfx940, whose "
                        ".cu sources and gpu-manifest.json go beside the CPU ones, built by nvcc/hipcc for the device "
                        "and by the host compiler for the simulator (CONVGEN_SIM)")
    p.add_argument("--sim-only", action="store_true",
                   help="GPU targets: build the simulator's libraries only (no nvcc/hipcc; serves no device)")
    add_dtype_flag(p, "the model's dtype")
    p.add_argument("--layout", choices=["nchw", "channels_last"], default="nchw",
                   help="memory format of the model and its inputs (default nchw)")
    p.add_argument("--input-grad", action="store_true", help="the inputs require grad (adds their data gradients)")
    p.add_argument("--no-build", action="store_true", help="write the sources and manifest only")
    p.add_argument("--jobs", type=int, help="parallel compiles (default CONVGEN_BUILD_JOBS, else all CPUs)")
    p.set_defaults(run=run)


def run(args) -> int:
    targets = [parse_target(t.strip()) for t in str(args.target).split(",") if t.strip()]
    cpus = [t for t in targets if t.kind is TargetKind.CPU]
    gpus = list(dict.fromkeys(t for t in targets if t.kind is not TargetKind.CPU))
    if len(cpus) > 1 or not targets:
        raise ConvSpecError(f"--target {args.target}: expected at most one cpu target and any GPU targets")
    target = cpus[0] if cpus else None
    if bool(args.model) == bool(args.shapes):
        raise ConvSpecError("aot: give either MODULE:CALLABLE (with --input-shape) or --shapes FILE.json")
    if args.jobs is not None and args.jobs < 1:
        raise ConvSpecError(f"--jobs {args.jobs}: need at least 1")
    started = time.perf_counter()
    if args.model:
        model, default_name = load_model(args.model)
        if not args.input_shape:
            raise ConvSpecError(f"aot {args.model}: give the shape of each model input with --input-shape N,C,H,W")
        inputs = example_inputs(args.input_shape, args.dtype, args.layout, args.input_grad)
        model = prepare_model(model, args.dtype, args.layout)
        problems = collect(model, *inputs)
        origin = {"model": args.model, "input_shapes": [list(t.shape) for t in inputs], "dtype": args.dtype.value,
                  "layout": args.layout, "input_grad": args.input_grad}
    else:
        problems = problems_from_json(Path(args.shapes))
        default_name = Path(args.shapes).stem
        origin = {"shapes": args.shapes}
    name = args.name or (Path(args.out).name if args.out else default_name)
    out = Path(args.out) if args.out else Path("generated") / name
    if not problems:
        raise ConvgenError(f"aot: {args.model or args.shapes} has no convolutions to generate")
    lines = [f"convgen aot: {name} -> {out}"]
    if target is not None:
        generated = aot.generate(problems, out, name=name, target=target, origin=origin)
        kernels = generated.manifest["kernels"]
        lines += [f"  problems: {len(problems)} collected ({len(kernels)} distinct kernels)",
                  f"  sources:  {out / 'kernels'}/ and {out / 'bundle.cpp'}: {generated.written} file(s) written, "
                  f"{generated.unchanged} unchanged{f', {generated.removed} stale removed' if generated.removed else ''}",
                  f"  manifest: {out / 'manifest.json'} (problems, keys, variants, commands, target, toolchain)"]
    if gpus:
        manifest = gpu.generate_gpu(problems, out, gpus, name=name, origin=origin)
        for tname, part in manifest["targets"].items():
            lines.append(f"  {tname}: {len(part['kernels'])} kernels in {out / 'kernels' / tname}/")
        lines.append(f"  manifest: {out / 'gpu-manifest.json'} (per GPU target: problems, kernels, decisions)")
    if args.no_build:
        lines.append("  build:    skipped (--no-build)")
    else:
        if target is not None:
            built = aot.build(out, progress=sys.stderr, jobs=args.jobs)
            what = f"{built.compiled} step(s) in {built.seconds:.1f} s" if built.compiled else "up to date, nothing compiled"
            lines.append(f"  module:   {built.module_path} ({what})")
        if gpus:
            steps = gpu.build_gpu(out, device=not args.sim_only, jobs=args.jobs)
            lines.append(f"  GPU:      {out / 'build' / 'gpu'}/ (device{' skipped: --sim-only' if args.sim_only else ''})"
                         f" and {out / 'build' / 'sim'}/ (simulator): "
                         f"{f'{steps} step(s)' if steps else 'up to date, nothing compiled'}")
        lines.append(f"  use it:   convgen.load_bundle({str(out)!r}) or CONVGEN_BUNDLES={out}")
    lines.append(f"  total:    {time.perf_counter() - started:.1f} s")
    print("\n".join(lines))
    return 0


def load_model(spec: str):
    """The model MODULE:CALLABLE names, and a default bundle name (the callable's, lower-cased)."""
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise ConvSpecError(f"aot: {spec!r} is not MODULE:CALLABLE (e.g. examples/resnet18_aot.py:resnet18)")
    try:
        if module_part.endswith(".py") or os.sep in module_part:
            path = Path(module_part)
            if not path.is_file():
                raise ConvSpecError(f"aot: {module_part}: no such file")
            spec_ = importlib.util.spec_from_file_location(f"convgen_aot_model_{path.stem}", path)
            module = importlib.util.module_from_spec(spec_)
            sys.path.insert(0, str(path.parent.resolve()))
            try:
                spec_.loader.exec_module(module)
            finally:
                sys.path.pop(0)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_part)
    except ImportError as e:
        raise ConvSpecError(f"aot: cannot import {module_part}: {e}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConvSpecError(f"aot: {module_part} has no attribute {attr!r}")
        obj = getattr(obj, part)
    import torch

    model = obj if isinstance(obj, torch.nn.Module) else obj() if callable(obj) else None
    if not isinstance(model, torch.nn.Module):
        raise ConvSpecError(f"aot: {spec} is not an nn.Module, nor a callable returning one with no arguments "
                            f"(got {type(model if model is not None else obj).__name__})")
    return model, attr.split(".")[-1].lower()


def example_inputs(shapes: list[str], dtype: str, layout: str, requires_grad: bool):
    import torch

    torch_dtype = TORCH_DTYPES[DType(dtype)]
    inputs = []
    for text in shapes:
        try:
            shape = [int(s) for s in text.split(",")]
        except ValueError:
            raise ConvSpecError(f"--input-shape {text}: expected comma-separated integers like 8,3,224,224") from None
        if any(s < 0 for s in shape):
            raise ConvSpecError(f"--input-shape {text}: sizes must be non-negative")
        x = torch.randn(shape, dtype=torch_dtype)
        if layout == "channels_last" and x.dim() in (4, 5):
            x = x.contiguous(memory_format=memory_format(Layout.CHANNELS_LAST, x.dim()))
        inputs.append(x.requires_grad_(requires_grad))
    return inputs


def prepare_model(model, dtype: str, layout: str):
    """The model in `dtype` and, for channels_last, every 4-D and 5-D parameter and buffer in its
    channels-last format (Module.to takes one format for all, which fails on mixed 2-D/3-D models)."""
    import torch

    model = model.to(TORCH_DTYPES[DType(dtype)])
    if layout == "channels_last":
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                if t.dim() in (4, 5):
                    t.data = t.data.contiguous(memory_format=memory_format(Layout.CHANNELS_LAST, t.dim()))
    return model.train()

