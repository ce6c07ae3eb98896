"""What a GPU kernel costs on its arch and what bounds it, for `convgen explain --target cuda-...|hip-...`:
the vendor compiler's resource report per kernel (registers, spills, shared memory), the occupancy
that gives on the arch (resident blocks per SM/CU from its register, shared-memory, thread and block
limits), and a roofline of the problem (the time its FLOPs take at the arch's peak for the units the
kernel uses, against the time its compulsory bytes take at the memory bandwidth). The limits and the
datasheet peaks (with their sources) are the arch's data, codegen/arch/gpu.py.

Nothing here runs a compiler: runtime/cli/ passes the report of runtime/building/gpu_build.py in.
"""

from __future__ import annotations

import dataclasses
import re

from ..arch.gpu import GPU_ARCHS, GpuArch
from .igemm import tiles_of


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """One kernel's line of the compiler's report."""

    name: str
    registers: int            # per thread (CUDA); arch VGPRs + AGPRs (HIP)
    spill_bytes: int          # spill stores + loads (CUDA); VGPR + SGPR spills, scratch (HIP)
    static_shared: int        # bytes of __shared__ the compiler placed (dynamic shared memory excluded)


def parse_report(report: str, vendor: str) -> list[KernelResources]:
    """The kernels of a ptxas `-v` report (CUDA) or a hipcc `-Rpass-analysis=kernel-resource-usage`
    report (HIP), in the order they appear."""
    kernels: list[KernelResources] = []
    if vendor == "cuda":
        name, spills = None, 0
        for line in report.splitlines():
            if m := re.search(r"Compiling entry function '([^']+)'", line):
                name, spills = m.group(1), 0
            elif m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line):
                spills = int(m.group(1)) + int(m.group(2))
            elif (m := re.search(r"Used (\d+) registers", line)) and name:
                shared = re.search(r"(\d+) bytes smem", line)
                kernels.append(KernelResources(name, int(m.group(1)), spills, int(shared.group(1)) if shared else 0))
                name = None
        return kernels
    fields: dict[str, int] = {}
    name = None

    def flush():
        if name is not None:
            kernels.append(KernelResources(name, fields.get("VGPRs", 0) + fields.get("AGPRs", 0),
                                           fields.get("VGPRs Spill", 0) + fields.get("SGPRs Spill", 0)
                                           + fields.get("ScratchSize [bytes/lane]", 0),
                                           fields.get("LDS Size [bytes/block]", 0)))

    for line in report.splitlines():
        if m := re.search(r"Function Name: (\S+)", line):
            flush()
            name, fields = m.group(1), {}
        elif m := re.search(r"\s([A-Z][A-Za-z]*(?: [A-Za-z\[\]/]+)*): (\d+) \[-Rpass-analysis", line):
            fields[m.group(1).strip()] = int(m.group(2))
    flush()
    return kernels


def blocks_per_sm(arch: GpuArch, threads: int, registers: int, shared: int) -> tuple[int, str]:
    """Resident blocks per SM (CU) of a kernel with `threads` per block, `registers` per thread and
    `shared` bytes of shared memory per block, and the limit that decides it."""
    limits = arch.occupancy
    warps = -(-threads // arch.warp_size)
    by = {"threads": limits.threads_per_sm // threads, "blocks": limits.blocks_per_sm}
    if arch.vendor == "cuda":
        per_warp = -(-registers * arch.warp_size // limits.register_unit) * limits.register_unit
        by["registers"] = arch.registers_per_sm // (per_warp * warps) if registers else limits.blocks_per_sm
        by["shared memory"] = arch.shared_bytes_per_sm // (shared + limits.shared_reserved)
    else:   # waves spread over the 4 SIMDs; each SIMD holds 512 // VGPRs waves (at most 8)
        vgprs = -(-max(registers, 1) // limits.register_unit) * limits.register_unit
        waves_per_simd = min(8, 512 // vgprs)
        by["registers"] = 4 * waves_per_simd // warps
        by["shared memory"] = arch.shared_bytes_per_sm // shared if shared else limits.blocks_per_sm
    limit = min(by, key=lambda k: by[k])
    return by[limit], limit


def occupancy_line(arch: GpuArch, kernel: KernelResources, threads: int, dynamic_shared: int) -> str:
    shared = kernel.static_shared + dynamic_shared
    blocks, limit = blocks_per_sm(arch, threads, kernel.registers, shared)
    limits = arch.occupancy
    warps = blocks * -(-threads // arch.warp_size)
    most = limits.threads_per_sm // arch.warp_size
    unit = "SM" if arch.vendor == "cuda" else "CU"
    return (f"{threads} threads, {kernel.registers} registers, {kernel.spill_bytes} bytes spilled, {shared} B shared "
            f"({kernel.static_shared} static + {dynamic_shared} dynamic): {blocks} block(s) per {unit} "
            f"(limited by {limit}), {warps}/{most} {'warps' if arch.vendor == 'cuda' else 'waves'} = "
            f"{100 * warps // most}% occupancy")


def roofline(arch: GpuArch, flops: int, bytes_moved: int, units: str) -> str:
    """The bound of a problem with `flops` and `bytes_moved` on `arch` when its kernel uses `units`
    ("matrix16", "tf32", "matrix32", "matrix64", "f32" or "f64")."""
    peaks = arch.peaks
    if peaks is None:
        listed = ", ".join(a.arch for a in GPU_ARCHS.values() if a.peaks is not None)
        return f"no datasheet figures for {arch.arch} here (codegen/arch/gpu.py lists {listed})"
    peak = getattr(peaks, units)
    compute = flops / (peak * 1e12)
    memory = bytes_moved / (peaks.memory * 1e12)
    intensity = flops / bytes_moved if bytes_moved else float("inf")
    ridge = peak / peaks.memory
    bound = "compute" if compute >= memory else "memory"
    words = {"matrix16": "bf16/f16 matrix", "tf32": "tf32 matrix", "matrix32": "f32 matrix",
             "matrix64": "f64 matrix", "f32": "f32 FMA",
             "f64": "f64 FMA"}[units]
    return (f"{bound}-bound: {intensity:.1f} FLOP/B against a ridge of {ridge:.0f} FLOP/B ({words} {peak:g} TFLOP/s, "
            f"memory {peaks.memory:g} TB/s; {peaks.source}); at best {max(compute, memory) * 1e6:.1f} us "
            f"(compute {compute * 1e6:.1f} us, compulsory traffic {memory * 1e6:.1f} us)")


def short_name(mangled: str) -> str:
    """`fwd` from `_ZN<len>namespace<len>fwdE...` (a kernel in the generated file's namespace)."""
    m = re.match(r"_ZN(\d+)", mangled)
    if not m:
        return mangled
    rest = mangled[m.end() + int(m.group(1)):]
    n = re.match(r"(\d+)", rest)
    return rest[n.end():n.end() + int(n.group(1))] if n else mangled


def units_of(plan) -> str:
    """Which peak bounds the plan's kernel: matrix instructions for igemm, else the vector units."""
    if plan.algorithm == "igemm" and plan.problem.tf32:
        return "tf32"
    if plan.algorithm == "igemm" and plan.problem.dtype.value == "f32" and plan.target.kind.value == "hip":
        return "matrix32"
    if plan.algorithm == "igemm" and plan.problem.dtype.itemsize == 2:
        return "matrix16"
    if plan.algorithm == "igemm" and plan.problem.dtype.value == "f64":
        return "matrix64"
    return "f64" if plan.problem.dtype.value == "f64" else "f32"


def kernel_shapes(plan) -> dict[str, tuple[int, int]]:
    """(threads per block, dynamic shared bytes) of each kernel the plan's file may hold."""
    threads = plan.tiling.threads_per_block if plan.tiling else 0
    if plan.algorithm != "igemm":
        return {}
    tiles = tiles_of(plan.problem, plan.target, plan.staged)
    return {"fwd": (threads, tiles.fwd.shared_bytes), "bwd_data": (threads, tiles.dgrad.shared_bytes),
            "bwd_weight_partial": (threads, tiles.wgrad.shared_bytes)}


# Warp instructions an SM issues a clock: 4 schedulers (sub-partitions), one each, on sm_80 and
# sm_90 (NVIDIA A100 and H100 whitepapers).
SM_ISSUE = 4


def loop_bound(arch: GpuArch, units: str, mix) -> tuple[str, float] | None:
    """Which bound a main loop meets on `arch` (None where the arch has no tensor rate here): the SM
    issues SM_ISSUE warp instructions a clock while its tensor cores do the loop's `multiply_adds`
    (a warp's, per k-step) at the arch's rate for `units`; ("issue" or "tensor", the fraction of the
    matrix peak the loop can reach at most). `mix`: runtime/building/machine_code.py's LoopMix."""
    peaks = arch.peaks
    if peaks is None or not peaks.sm_matrix16_macs or not getattr(peaks, units, 0) or units in ("f32", "f64"):
        return None
    macs_per_clock = peaks.sm_matrix16_macs * getattr(peaks, units) / peaks.matrix16
    tensor_clocks = mix.multiply_adds / macs_per_clock
    issue_clocks = mix.total / SM_ISSUE
    return ("issue", tensor_clocks / issue_clocks) if issue_clocks > tensor_clocks else ("tensor", 1.0)


def loop_line(arch: GpuArch, units: str, mix, gathers: bool = False) -> str:
    """explain's line for one kernel's main loop, read in its machine code; `gathers`: the kernel's
    GEMM moves an operand element by element (loops nested in the main loop, run every k-step)."""
    if arch.vendor == "hip":   # hipcc's assembly: MFMAs, ds_read_b128 fragments, global_load_dwordx4 copies
        text = (f"main loop (machine code, a k-step a wave): {mix.total} instructions: {mix.tensor} MFMA "
                f"({mix.multiply_adds} multiply-adds), {mix.ldsm} ds_read_b128, {mix.ldgsts} global_load_dwordx4, "
                f"{mix.other - mix.ldsm - mix.ldgsts} other; MFMA : other 1 : {mix.other / mix.tensor:.2f} "
                f"({mix.per_2048:.1f} other per 2048 multiply-adds)")
    else:
        text = (f"main loop (machine code, a k-step a warp): {mix.total} instructions: {mix.tensor} tensor "
                f"({mix.multiply_adds} multiply-adds), {mix.ldsm} LDSM, {mix.ldgsts} LDGSTS, "
                f"{mix.other - mix.ldsm - mix.ldgsts} other; {mix.per_2048:.1f} non-tensor per 2048 multiply-adds")
    if mix.nested:
        text += (f", and {mix.nested} instructions in loops nested in it: "
                 + ("an operand's element gathers, run every k-step and not counted here" if gathers else
                    "the element gathers of operands not 16-byte aligned, not run here"))
    if mix.waits:
        text += (f"; the mbarrier waits' retries ({mix.waits} instructions in loops nested in it) run only while "
                 f"a stage is not ready")
    bound = loop_bound(arch, units, mix)
    if bound is None:
        return text
    which, fraction = bound
    if gathers:   # the gathers' loops issue more than counted: what is said is an upper bound
        return text + (f"; issue-bound below {100 * fraction:.0f}% of the matrix peak" if which == "issue"
                       else "; issue-bound by the gathers or tensor-bound (their trip counts are not read)")
    return text + (f"; issue-bound at {100 * fraction:.0f}% of the matrix peak" if which == "issue"
                   else "; tensor-bound (issue keeps up with the matrix units)")


def gathering_kernels(plan) -> set[str]:
    """The igemm kernels whose GEMM moves an operand element by element every k-step."""
    if plan.algorithm != "igemm":
        return set()
    tiles = tiles_of(plan.problem, plan.target, plan.staged)
    return {name for name, t in (("fwd", tiles.fwd), ("bwd_data", tiles.dgrad), ("bwd_weight_partial", tiles.wgrad))
            if not (t.vector_a and t.vector_b)}


def explain_lines(plan, report: str | None, unavailable: str = "", loops: dict | None = None,
                  loops_unavailable: str = "") -> list[str]:
    """explain's resources section: per kernel the compiler's figures and the occupancy they give,
    and its main loop's instruction mix where the machine code was read (`loops`: kernel short name
    -> LoopMix, else why not in `loops_unavailable`), then the roofline of the problem on the
    plan's arch, and how far below it an issue-bound loop stays."""
    arch = plan.target.gpu
    lines = []
    if report is None:
        lines.append(f"  compiler report: unavailable ({unavailable})")
    else:
        shapes = kernel_shapes(plan)
        default_threads = plan.tiling.threads_per_block if plan.tiling else 256
        kernels = parse_report(report, arch.vendor)
        gathering = gathering_kernels(plan)
        if not kernels:
            lines.append("  compiler report: no kernel lines in it")
        for k in kernels:
            name = short_name(k.name)
            threads, dynamic = shapes.get(name, (default_threads, 0))
            lines.append(f"  {name}: {occupancy_line(arch, k, threads, dynamic)}")
            if loops and name in loops:
                lines.append(f"    {loop_line(arch, units_of(plan), loops[name], name in gathering)}")
        if loops_unavailable:
            lines.append(f"  main loops: not read ({loops_unavailable})")
    lines.append(f"  roofline ({plan.problem.n} images): "
                 + roofline(arch, plan.problem.flops, plan.problem.bytes_moved, units_of(plan)))
    return lines
