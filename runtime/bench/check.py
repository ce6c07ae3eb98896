"""`convgen check`: run one problem's kernels, every pass, on fresh random data against ATen in
float64, and say per pass whether the result is within the dtype's tolerance.

The kernels run through the normal runtime (runtime/api/ops.py, dispatch, cache): on the CPU for a
CPU target, in the SIMT simulator (CONVGEN_SIM) for a GPU target given --sim, and on torch's
current CUDA device for a GPU target without it (that arch's kernels, CONVGEN_GPU_ARCH: the
device must run its machine code; the operands are drawn on the CPU and copied there, the
float64 references stay on the CPU). Passes: the
forward with a bias, the data gradient, the weight gradient with the bias gradient fused, and
the bias gradient alone. Tolerance: ‖out − ref‖ / ‖ref‖ at most TOLERANCE[dtype] (the tests'
bounds: f64 1e-12, f32 1e-6, bf16 1e-2, f16 1e-3), grown by √(terms / 4096) for reductions
longer than 4096 terms; inputs are drawn in float64 and rounded to the dtype before the
reference sees them. f32 on a CUDA target while torch allows tf32 (torch.backends.cudnn.allow_tf32)
runs on tf32 matrix instructions: its bound is TF32_TOLERANCE added to f32's (tests/support/reference.py
derives it).
"""

from __future__ import annotations

import contextlib
import math
import os

import torch

from ..codegen.errors import ConvSpecError
from ..codegen.ir import ConvProblem, Layout
from ..codegen.target import Target, TargetKind
from .. import knobs
from ..api import functional, ops
from ..devices.sim import profiling
from ..dispatch import dispatch
from ..stats import stats

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}
SHORT_REDUCTION = 4096
TF32_TOLERANCE = 2.0 ** -10   # operands rounded to tf32 (11 significant bits): see tests/support/reference.py
TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}


@contextlib.contextmanager
def _environment(**values: str | None):
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _policy() -> str:
    """Specialised kernels, built before timing (eager); the generic tier's where CONVGEN_JIT=generic
    asks to measure that tier."""
    return "generic" if knobs.jit() == "generic" else "eager"


def _environment_for(target: Target, sim: bool) -> dict[str, str | None]:
    """The knobs `target` runs under: the CPU's ISA; the simulator's vendor and arch (--sim); or, on a
    device, that arch's kernels for torch's CUDA devices (CONVGEN_GPU_ARCH: the device must run it)."""
    if target.kind is TargetKind.CPU:
        return {"CONVGEN_SIM": None, "CONVGEN_ISA": target.isa}
    if sim:
        return {"CONVGEN_SIM": target.name()}
    if not torch.cuda.is_available():
        raise ConvSpecError(f"--target {target.name()}: this machine has no GPU device (torch.cuda.is_available() "
                            f"is False); add --sim to run the generated {target.kind.value} kernels in the SIMT "
                            f"simulator")
    return {"CONVGEN_SIM": None, "CONVGEN_GPU_ARCH": target.isa}


def knobs_for(target: Target, sim: bool):
    """A context in which convgen's calls run `target`'s kernels (on the CPU, in the simulator with
    `sim`, else on torch's CUDA device): `convgen check`'s, and `convgen bench`'s on a device."""
    return _environment(**_environment_for(target, sim))


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double(), ref.detach().double()
    if o.numel() == 0:
        return 0.0
    if not torch.isfinite(o).all():
        return math.inf
    norm = torch.linalg.vector_norm(r).item()
    diff = torch.linalg.vector_norm(o - r).item()
    return diff / norm if norm else o.abs().max().item()


def profile_lines(launches: list[dict]) -> list[str]:
    """The simulator's counters of each launch (devices/sim.py's profiling), one line each."""
    lines = []
    for p in launches:
        requests, wavefronts, ideal = p["shared_requests"], p["shared_wavefronts"], p["shared_ideal"]
        sectors, moved = p["global_sectors"], p["bytes_read"] + p["bytes_written"]
        lines.append(
            f"    {p['kernel']}: {p['blocks']} blocks, {p['barriers']} barriers, {p['tensor_instructions']} tensor "
            f"instructions; shared {requests} requests, "
            f"{(wavefronts - ideal) / requests if requests else 0:.2f} bank conflicts per request "
            f"({wavefronts} wavefronts, {ideal} without conflicts); global {p['global_requests']} requests, "
            f"{sectors / p['global_requests'] if p['global_requests'] else 0:.1f} sectors per request "
            f"({100 * moved / (32 * sectors) if sectors else 0:.0f}% of their bytes asked for; over 100%: lanes "
            f"sharing bytes), of which stores {p['store_requests']} requests "
            f"({100 * p['bytes_written'] / (32 * p['store_sectors']) if p['store_sectors'] else 0:.0f}% of their "
            f"sectors' bytes written); {p['bytes_read']} bytes read, {p['bytes_written']} written")
    return lines


def _where(target: Target, device: bool, launches: int) -> str:
    if device:
        index = torch.cuda.current_device()
        return f"on the device (cuda:{index}, {torch.cuda.get_device_name(index)}, {target.name()})"
    if target.kind is not TargetKind.CPU:
        return f"in the SIMT simulator ({target.name()}, warp {target.warp_size}, {launches} simulated launches)"
    return f"on the CPU ({target.name()})"


def run_check(problem: ConvProblem, padding, target: Target, sim: bool, seed: int = 0,
              profile: bool = False) -> tuple[list[str], bool]:
    """(one line per pass, whether all are within tolerance) for `problem`'s convolution (its op
    is ignored: every pass runs), called with torch's `padding` argument (ints or 'same'); with
    `profile` (simulated GPU targets), each pass's launches and their counters under its line."""
    import torch.nn.functional as F

    if profile and (target.kind is TargetKind.CPU or not sim):
        raise ConvSpecError(f"--profile: the counters are the SIMT simulator's; give a GPU target and --sim "
                            f"(got --target {target.name()}{' --sim' if sim else ''})")
    _environment_for(target, sim)   # a GPU target without --sim and no device: said before any work
    p = problem
    dtype = TORCH_DTYPES[p.dtype.value]
    gen = torch.Generator().manual_seed(seed)
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(p.rank + 2)

    def draw(shape, layout=Layout.CONTIGUOUS):
        t = torch.randn(tuple(shape), dtype=torch.float64, generator=gen).to(dtype)
        return t.contiguous(memory_format=fmt) if layout is Layout.CHANNELS_LAST and fmt else t

    x, w, b = draw(p.input_shape, p.input_layout), draw(p.weight_shape, p.weight_layout), draw((p.k,))
    args = (list(p.stride), padding, list(p.dilation), p.transposed, list(p.output_padding), p.groups)
    # the float64 reference: explicit (possibly asymmetric) padding, gradients by autograd
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    pads = [v for lo_hi in reversed(p.padding) for v in lo_hi]
    zeros = [0] * p.rank
    if p.transposed:
        y64 = torch.ops.aten.convolution(x64, w64, b64, list(p.stride), [lo for lo, _ in p.padding],
                                         list(p.dilation), True, list(p.output_padding), p.groups)
    else:
        y64 = torch.ops.aten.convolution(F.pad(x64, pads), w64, b64, list(p.stride), zeros, list(p.dilation), False,
                                         zeros, p.groups)
    gy = draw(y64.shape, p.output_layout)
    dx64, dw64, db64 = torch.autograd.grad(y64, (x64, w64, b64), gy.double())
    over_channels = max(p.weight_shape[0], p.weight_shape[1]) * math.prod(p.kernel)
    over_images = p.n * max(math.prod(p.in_size), math.prod(p.out_size))

    device = target.kind is not TargetKind.CPU and not sim   # on torch's CUDA device
    if device:   # the same values on the device, in the same layouts; the references stay on the CPU
        x, w, b, gy = (t.to("cuda") for t in (x, w, b, gy))
    lines, ok = [], True
    tf32 = target.kind is TargetKind.CUDA and dtype is torch.float32 and bool(torch.backends.cudnn.allow_tf32)

    def report(name: str, call, ref, terms: int):
        nonlocal ok
        with profiling() if profile else contextlib.nullcontext() as launches:
            out = call()
        tol = TOLERANCE[dtype] * max(1.0, math.sqrt(terms / SHORT_REDUCTION)) + (TF32_TOLERANCE if tf32 else 0.0)
        out = out.cpu()
        err = _rel(out, ref) if tuple(out.shape) == tuple(ref.shape) else math.inf
        good = err <= tol
        ok = ok and good
        lines.append(f"{name:<24} relative error {err:.2e}  (tolerance {tol:.0e})  {'ok' if good else 'FAIL'}")
        if profile:
            lines.extend(profile_lines(launches))

    with knobs_for(target, sim):
        # every kernel in one ninja run
        problems = {q.key(): q for mask in ((True, True, True), (False, False, True))
                    for q in ops.call_problems(x, w, b, *args, output_mask=mask, grad_output=gy)}
        dispatch.prepare(list(problems.values()), x.device if device else None, policy=_policy())
        before = stats()["sim_launches"]
        report("fwd (with bias)", lambda: functional.convolution(x, w, b, *args), y64, over_channels)
        k = [p.k]
        report("bwd_data", lambda: functional.convolution_backward(gy, x, w, k, *args, [True, False, False])[0],
               dx64, over_channels)
        both = {}
        report("bwd_weight (+ bias)",
               lambda: both.setdefault("dw_db", functional.convolution_backward(gy, x, w, k, *args,
                                                                                [False, True, True]))[1],
               dw64, over_images)
        report("bwd_bias (fused)", lambda: both["dw_db"][2], db64, over_images)
        report("bwd_bias (alone)", lambda: functional.convolution_backward(gy, x, w, k, *args,
                                                                           [False, False, True])[2],
               db64, over_images)
        launches = stats()["sim_launches"] - before
    lines.insert(0, f"{p.name()}: {p.dtype.value}, against ATen in float64, {_where(target, device, launches)}")
    return lines, ok
