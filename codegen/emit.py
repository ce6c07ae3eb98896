"""The emitter: a finished `Plan` → one `KernelSource`, rendered from the Jinja templates.

Decisions live in the plan; here they are only turned into one context object per template
(`KernelContext`), so the templates stay short. One strict Jinja environment serves all.
Plans for CUDA and HIP targets are emitted by codegen/emit_gpu.py (its own table of GPU
algorithms); the TEMPLATES table below is the CPU's.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources

import jinja2

from .errors import ConvgenError
from .ir import DType, Layout
from .plan import Geometry, KOp, Plan, Tiling, asm_tile_registers, row_tile_taps
from .source import KernelSource
from .target import TargetKind
from .version import generator_version

STORAGE = {DType.F32: "float", DType.F64: "double", DType.BF16: "uint16_t", DType.F16: "uint16_t"}
ACCUMULATOR = {DType.F32: "float", DType.F64: "double", DType.BF16: "float", DType.F16: "float"}

# (target kind, kernel op, algorithm) -> template and the entry's pointer parameters
TEMPLATES = {
    (TargetKind.CPU, KOp.FWD, "direct"): "cpu/direct_fwd.cpp.j2",
    (TargetKind.CPU, KOp.FWD, "blocked"): "cpu/blocked_fwd.cpp.j2",
    (TargetKind.CPU, KOp.FWD, "lanes"): "cpu/lanes_fwd.cpp.j2",
    (TargetKind.CPU, KOp.FWD, "pointwise"): "cpu/pointwise.cpp.j2",
    (TargetKind.CPU, KOp.DGRAD, "direct"): "cpu/direct_dgrad.cpp.j2",
    (TargetKind.CPU, KOp.DGRAD, "blocked"): "cpu/blocked_dgrad.cpp.j2",
    (TargetKind.CPU, KOp.DGRAD, "lanes"): "cpu/lanes_dgrad.cpp.j2",
    (TargetKind.CPU, KOp.DGRAD, "pointwise"): "cpu/pointwise.cpp.j2",
    (TargetKind.CPU, KOp.WGRAD, "direct"): "cpu/direct_wgrad.cpp.j2",
    (TargetKind.CPU, KOp.WGRAD, "gemm"): "cpu/gemm_wgrad.cpp.j2",
    (TargetKind.CPU, KOp.WGRAD, "pointwise"): "cpu/pointwise_wgrad.cpp.j2",
    (TargetKind.CPU, KOp.WGRAD, "lanes"): "cpu/lanes_wgrad.cpp.j2",
    (TargetKind.CPU, KOp.WGRAD, "depthwise"): "cpu/depthwise_wgrad.cpp.j2",
    (TargetKind.CPU, KOp.WGRAD, "planes"): "cpu/planes_wgrad.cpp.j2",
    (TargetKind.CPU, KOp.FWD, "depthwise"): "cpu/depthwise_planes.cpp.j2",
    (TargetKind.CPU, KOp.DGRAD, "depthwise"): "cpu/depthwise_planes.cpp.j2",
    (TargetKind.CPU, KOp.FWD, "grouplanes"): "cpu/grouplanes_fwd.cpp.j2",
    (TargetKind.CPU, KOp.DGRAD, "grouplanes"): "cpu/grouplanes_dgrad.cpp.j2",
    (TargetKind.CPU, KOp.WGRAD, "grouplanes"): "cpu/grouplanes_wgrad.cpp.j2",
    (TargetKind.CPU, KOp.BIAS, "reduce"): "cpu/reduce_bias.cpp.j2",
    (TargetKind.CPU, KOp.FWD, "amx"): "cpu/amx_fwd.cpp.j2",
    (TargetKind.CPU, KOp.DGRAD, "amx"): "cpu/amx_fwd.cpp.j2",
    (TargetKind.CPU, KOp.WGRAD, "amx"): "cpu/amx_wgrad.cpp.j2",
}


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    root = importlib.resources.files("convgen.templates")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=False)
    return env


def operand_strides(layout: Layout, channels: int, size: tuple[int, int, int]) -> tuple[int, ...]:
    """Element strides (batch, channel, d, h, w) of an activation or weight in `layout`."""
    d, h, w = size
    if layout is Layout.CHANNELS_LAST:
        return (d * h * w * channels, 1, h * w * channels, w * channels, channels)
    return (channels * d * h * w, d * h * w, h * w, w, 1)


@dataclasses.dataclass(frozen=True)
class KernelContext:
    entry: str
    dtype: str
    storage: str
    acc: str
    g: Geometry
    t: Tiling | None          # the plan's tiling
    lanes: int
    vector_bytes: int
    acc_bytes: int
    gy_in_place: bool
    x_row_copy: bool
    x_in_place: bool
    strides: tuple[tuple[str, tuple[int, ...]], ...]
    layout_note: str
    bias_from: str | None
    bias_channels: int
    bias_size: tuple[int, int, int]
    fma_asm: str              # "ps" / "pd": register tiles step in x86 FMA3 assembly; "": in portable C
    evex: bool = False        # those assembly tiles may use all 32 vector registers (Target.evex_tiles)
    l2_bytes: int = 0         # the target's L2 (per core)
    row_classes: tuple = ()   # lanes tiles within rows (Tiling.row_split): (the row's tiles, and per kw tap
                              # the pixels of each that read inside) for each pattern (plan.row_tile_taps)
    amx_native: bool = False  # AMX kernels use the tile instructions (else their C emulation; Target.amx_native)


def _context(plan: Plan, entry: str) -> KernelContext:
    g = plan.geometry
    layouts = dict(plan.layouts)
    strides = []
    if "X" in layouts:
        strides.append(("X", operand_strides(layouts["X"], g.cin, g.x_size)))
    if "Y" in layouts:
        strides.append(("Y", operand_strides(layouts["Y"], g.cout, g.y_size)))
    if "W" in layouts:
        strides.append(("W", operand_strides(layouts["W"], g.cin_g, g.kernel)))
    source = plan.bias_from or ("Y" if plan.kop is KOp.BIAS and "Y" in layouts else
                                "X" if plan.kop is KOp.BIAS else None)
    channels, size = 0, (1, 1, 1)
    if source:
        channels, size = (g.cout, g.y_size) if source == "Y" else (g.cin, g.x_size)
        strides.append(("S", operand_strides(layouts[source], channels, size)))
    note = ", ".join(f"{k} {v.value}" for k, v in sorted(layouts.items()))
    lanes = _lanes(plan)
    return KernelContext(entry=entry, dtype=plan.problem.dtype.value, storage=STORAGE[plan.problem.dtype],
                         acc=ACCUMULATOR[plan.problem.dtype], g=g, t=plan.tiling,
                         lanes=lanes, vector_bytes=lanes * plan.problem.dtype.accumulator.itemsize,
                         acc_bytes=plan.problem.dtype.accumulator.itemsize,
                         gy_in_place=bool(plan.tiling and "Y" in plan.tiling.in_place),
                         x_row_copy=bool(plan.tiling and "X-row" in plan.tiling.in_place),
                         x_in_place=bool(plan.tiling and "X" in plan.tiling.in_place), strides=tuple(strides),
                         layout_note=note, bias_from=plan.bias_from, bias_channels=channels, bias_size=size,
                         fma_asm=fma_suffix(plan), evex=evex_tile(plan), l2_bytes=plan.target.l2_bytes,
                         row_classes=_row_classes(plan), amx_native=plan.target.amx_native)


def _row_classes(plan: Plan) -> tuple[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]], ...]:
    """The tiles of a row grouped by their pixels that read inside per kw tap: (tiles, pixels per kw)
    for each group, in order of first tile (one case of the kernel's code each)."""
    if not isinstance(plan.tiling, Tiling) or not plan.tiling.row_split:
        return ()
    groups: dict = {}
    for k, per_kw in enumerate(row_tile_taps(plan.geometry, plan.kop is KOp.FWD, plan.tiling.row_split)):
        groups.setdefault(per_kw, []).append(k)
    return tuple((tuple(ks), per_kw) for per_kw, ks in groups.items())


def _lanes(plan: Plan) -> int:
    """Lanes of the kernel's vectors: its tiling's (a kernel may take half the target's width, see
    tiling_cpu._lanes_wgrad), else the target's full width."""
    if plan.tiling is not None and plan.tiling.vector_lanes:
        return plan.tiling.vector_lanes
    return plan.target.vector_bytes // plan.problem.dtype.accumulator.itemsize


def fma_suffix(plan: Plan) -> str:
    """The FMA3 instructions' suffix for the plan's accumulator where its target steps register tiles
    in assembly (see templates/cpu/fma_tile.j2), else ""."""
    if not plan.target.fma_asm:
        return ""
    return {4: "ps", 8: "pd"}.get(plan.problem.dtype.accumulator.itemsize, "")


def evex_tile(plan: Plan) -> bool:
    """Whether the plan's lanes tile (stepped in assembly) needs more than 16 vector registers, which
    its target's EVEX encoding gives (Target.evex_tiles). A tile within 16 keeps the "x" constraint:
    given all 32 ("v"), GCC moved accumulators between registers from one asm statement to the next
    (29 register moves in r50_3x3_64's forward loop against 11)."""
    t = plan.tiling
    if not plan.target.evex_tiles:
        return False
    if plan.algorithm == "lanes" and t is not None:
        return asm_tile_registers(t.nv, t.kb) > 16
    return plan.target.isa == "avx512"    # the other algorithms' AVX-512 tiles are sized for 32 registers


def entry_signature(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The entry's parameters: one pointer per operand (by caller role), then batch and threads."""
    return tuple(("ptr", op.role) for op in plan.operands) + (("i64", "n"), ("i32", "nthreads"))


def emit(plan: Plan) -> KernelSource | None:
    """The source for `plan`, or None when the plan needs no kernel (algorithm 'empty')."""
    if plan.algorithm == "empty":
        return None
    if plan.target.kind is not TargetKind.CPU:
        from .emit_gpu import emit_gpu

        return emit_gpu(plan)
    key = (plan.target.kind, plan.kop, plan.algorithm)
    if key not in TEMPLATES:
        raise ConvgenError(f"emit: no template for target {plan.target.kind.value}, kernel op "
                           f"{plan.kop.value}, algorithm {plan.algorithm}")
    name = plan.name()
    entry = f"cg_{name}"
    header = {
        "version": generator_version(), "problem_name": plan.problem.name(), "problem_key": plan.problem.kernel_key(),
        "target": plan.target.name(), "kernel": plan.kop.value, "algorithm": plan.algorithm, "entry": entry,
        "reasons": plan.reasons,
    }
    text = environment().get_template(TEMPLATES[key]).render(h=header, c=_context(plan, entry))
    return KernelSource(name=name, text=text, entry=entry, signature=entry_signature(plan), target=plan.target)


# ---------------------------------------------------------------------------------- bundles

_PARAMETER_TYPES = {"ptr": "void*", "i64": "std::int64_t", "i32": "int"}


@dataclasses.dataclass(frozen=True)
class BundleKernel:
    entry: str
    parameters: str  # the entry's C parameter list


@dataclasses.dataclass(frozen=True)
class BundleContext:
    name: str
    module: str
    version: str
    target: str
    kernel_set: str
    kernels: tuple[BundleKernel, ...]


def emit_bundle_module(name: str, module: str, sources: list[KernelSource], kernel_set: str) -> str:
    """The pybind11 module source of an ahead-of-time bundle serving `sources` (all one target)."""
    kernels = tuple(BundleKernel(s.entry, ", ".join(_PARAMETER_TYPES[kind] for kind, _ in s.signature))
                    for s in sources)
    target = sources[0].target.name() if sources else "cpu"
    context = BundleContext(name=name, module=module, version=generator_version(), target=target,
                            kernel_set=kernel_set, kernels=kernels)
    return environment().get_template("bundle/module.cpp.j2").render(b=context)


def emit_launcher(module: str, torch_version: str, huge_output_bytes: int) -> str:
    """The source of the eager launcher (runtime/api/eager.py), the Python extension module `module`
    for torch `torch_version`; outputs of `huge_output_bytes` or more ask for huge pages."""
    return environment().get_template("eager/launcher.cpp.j2").render(
        version=generator_version(), module=module, torch_version=torch_version,
        huge_output_bytes=huge_output_bytes)
