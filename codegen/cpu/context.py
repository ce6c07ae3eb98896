"""The context every CPU kernel template is rendered with (`KernelContext`): the plan's geometry and
tiling, C types, operand strides and the target's assembly flavour, prepared once so that the
templates stay short. A family adds what only its templates read (lanes: its tiles within rows)."""

from __future__ import annotations

import dataclasses

from ..ir import DType
from ..plan import Geometry, KOp, Plan, Tiling
from ..render import operand_strides
from .work import bf16_pairs, vector_lanes

STORAGE = {DType.F32: "float", DType.F64: "double", DType.BF16: "uint16_t", DType.F16: "uint16_t"}
ACCUMULATOR = {DType.F32: "float", DType.F64: "double", DType.BF16: "float", DType.F16: "float"}


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
                              # the pixels of each that read inside) for each pattern (lanes_rows.row_tile_taps)
    amx_native: bool = False  # AMX kernels use the tile instructions (else their C emulation; Target.amx_native)
    bf16_narrow: bool = False  # bf16 results rounded by AVX512-BF16's vcvtneps2bf16 (narrow_by_instruction)


def build(plan: Plan, entry: str, evex: bool | None = None, row_classes: tuple = ()) -> KernelContext:
    """The context of `plan`'s kernel, whose entry symbol is `entry`. `evex` (default: every tile of
    the AVX-512 shape, see wide_tiles) and `row_classes` are the family's to say."""
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
                         fma_asm=fma_suffix(plan), evex=wide_tiles(plan) if evex is None else evex,
                         l2_bytes=plan.target.l2_bytes, row_classes=row_classes, amx_native=plan.target.amx_native,
                         bf16_narrow=narrow_by_instruction(plan))


def narrow_by_instruction(plan: Plan) -> bool:
    """Whether a bf16 kernel rounds its f32 results to bf16 with vcvtneps2bf16 (one instruction a vector)
    instead of integer vector code (about nine): x86 code shapes of hosts with AVX512-BF16 (`bf16_dot`,
    where the tiles already reduce on vdpbf16ps). Both round to nearest even and keep NaNs (quiet);
    the instruction, like vdpbf16ps and AMX's stores, flushes subnormal results to zero."""
    return bf16_pairs(plan) and plan.target.fma_asm


def _lanes(plan: Plan) -> int:
    """Lanes of the kernel's vectors: its tiling's (a kernel may take half the target's width, see
    lanes_wgrad.narrow_lanes), else the target's full width."""
    if plan.tiling is not None and plan.tiling.vector_lanes:
        return plan.tiling.vector_lanes
    return vector_lanes(plan)


def fma_suffix(plan: Plan) -> str:
    """The FMA3 instructions' suffix for the plan's accumulator where its target steps register tiles
    in assembly (see templates/cpu/fma_tile.j2), else ""."""
    if not plan.target.fma_asm:
        return ""
    return {4: "ps", 8: "pd"}.get(plan.problem.dtype.accumulator.itemsize, "")


def wide_tiles(plan: Plan) -> bool:
    """Whether the plan's assembly tiles may use all 32 vector registers (Target.evex_tiles): the
    AVX-512 shape's tiles are sized for 32 (lanes decides by its own tile: lanes.context)."""
    return plan.target.evex_tiles and plan.target.isa == "avx512"


def entry_signature(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The entry's parameters: one pointer per operand (by caller role), then batch and threads."""
    return tuple(("ptr", op.role) for op in plan.operands) + (("i64", "n"), ("i32", "nthreads"))


@dataclasses.dataclass(frozen=True)
class ConvertedOperand:
    """One pointer parameter of a converting entry (templates/cpu/convert_layouts.j2)."""

    name: str
    writes: bool
    converted: bool
    caller: tuple[int, ...] = ()     # element strides (batch, channel, d, h, w) in the caller's layout
    inner: tuple[int, ...] = ()      # ... in the kernel's
    size: tuple[int, int, int] = (1, 1, 1)
    channels: int = 0
    elements: int = 0                # per image


@dataclasses.dataclass(frozen=True)
class ConversionContext:
    entry: str
    note: str
    operands: tuple[ConvertedOperand, ...]

    @property
    def converted(self) -> tuple[ConvertedOperand, ...]:
        return tuple(p for p in self.operands if p.converted)


def conversion(plan: Plan, entry: str) -> ConversionContext:
    """The context of the entry converting `plan`'s activations between the caller's layouts and the
    kernel's (plan.conversions; the kernel itself is `entry`_in_layouts)."""
    g, caller, inner = plan.geometry, plan.caller_layouts(), dict(plan.layouts)
    shapes = {"X": (g.cin, g.x_size), "Y": (g.cout, g.y_size)}
    operands = []
    for i, op in enumerate(plan.operands):
        name = f"p{i}_{op.role}"
        if op.kind in shapes and caller[op.kind] is not inner[op.kind]:
            channels, size = shapes[op.kind]
            operands.append(ConvertedOperand(name, op.writes, True, operand_strides(caller[op.kind], channels, size),
                                             operand_strides(inner[op.kind], channels, size), size, channels,
                                             channels * size[0] * size[1] * size[2]))
        else:
            operands.append(ConvertedOperand(name, op.writes, False))
    return ConversionContext(entry, "; ".join(plan.conversions), tuple(operands))
