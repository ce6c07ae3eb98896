"""The CPU layout pass's cost model: for each internal layout of the activations a kernel could read
(the caller's, NCHW, channels last), the kernel the heuristic would pick there, its estimated time and
the time of converting the caller's operands into that layout and the result back; the cheapest
is taken (passes/layout.py), a conversion only where it is estimated to save CONVERT_GAIN.

Everything is per image and per core: the batch is a run-time argument of the kernel (the plan
must not depend on it), and kernel and conversions are both spread over the same threads.

- kernel: max(compute, compulsory bytes at the memory bandwidth), compute being the multiply-adds
  at the core's FMA rate times the fill of the vector lanes (the amx kernels: at AMX_MACS_PER_S, plus
  STRIDED_STORE_S an element where their data gradient scatters its stride phases into a planar
  grad_input; BENCHMARKS.md, "Figures behind codegen's CPU rules"), plus the packing of each activation read
  or written in place along its non-contiguous axis (a channels-in-lanes kernel on NCHW transposes in
  registers or through a copy, a pixels-in-lanes kernel on channels last gathers or copies rows):
  that operand's bytes read and written once more, a tile at a time within the caches
  (PACK_BYTES_PER_S).
- fill: the share of the lanes a kernel keeps busy. Channels-in-lanes kernels (lanes, grouplanes):
  the channels of a group (of a pixel, for grouplanes) over whole vectors of them; pixels-in-lanes
  kernels (blocked, the depthwise planes, flat): the output row's pixels (flat: its (column,
  channel) values) over whole vectors; the packed GEMMs (pointwise, gemm, amx): full; direct
  (scalar taps): one lane.
- bf16 in pairs: the kernels that reduce bf16 two products a lane on vdpbf16ps (lanes, gemm, and
  blocked and grouplanes where their `in_pairs` say so) run at PAIRS_SPEEDUP times the rate of those that widen it to
  f32 FMAs (pointwise, the depthwise and pixel families).
- conversion: each activation held by the caller in another layout, read and written once as a whole
  before (or after) the kernel, at the copy bandwidth of tensors larger than the caches
  (COPY_BYTES_PER_S; weights are not converted: the kernels pack or read them in any layout). A whole-
  tensor pass costs far more than a kernel's packing, which touches each tile while it is in the L1/L2.

The rates are this host class's figures, estimates for a decision, not measurements of the kernel:
COPY_BYTES_PER_S from torch's own layout conversions of 5-10 MB activations (Xeon, 2 threads: 7-10
GB/s read + written, 30-35 GB/s when they fit the L2 and L3), FMA_EFFICIENCY from ShuffleNet's
grouped 1x1 in NCHW (72 of 96 GMAC/s a core at the 3 GHz assumed), MEMORY_BYTES_PER_S and
PACK_BYTES_PER_S from the RGB 3x3 stride-2 depthwise in channels last (blocked, memory-bound: 66 µs
an image a core measured, 68 estimated); BENCHMARKS.md, "2026-12-03", the CPU layout pass's cost
model. Because the kernels already pack what they read
in the other layout, converting first rarely pays: on the issue's layers every conversion measured
slower than the kernel reading the caller's layout in place, and the model agrees.
"""

from __future__ import annotations

import dataclasses
import math

from ..ir import Layout
from ..plan import KOp, Plan
from . import blocked, grouplanes
from .work import bf16_pairs, vector_lanes

CLOCK_HZ = 3.0e9             # assumed core clock (the estimates compare; they do not predict ms)
FMA_PER_CYCLE = 2            # vector FMAs a core issues a cycle (Zen 3/4, Golden Cove)
FMA_EFFICIENCY = 0.7         # share of that peak the register-tiled kernels reach
MEMORY_BYTES_PER_S = 12.0e9  # compulsory traffic a core streams (read + write)
PACK_BYTES_PER_S = 24.0e9    # a kernel's packing of tiles within the caches (read + write)
COPY_BYTES_PER_S = 4.5e9     # a core's share of converting a whole activation (read + write)
AMX_MACS_PER_S = 450.0e9     # bf16 multiply-adds a core sustains on the amx kernels' tiles (channels last, kernel
                             # alone: 3x3 64 -> 64 at 56x56 and 256 -> 256 at 14x14, 510 GMAC/s; stride 2, 300-400)
STRIDED_STORE_S = 2.2e-9     # a core's time per element of a planar grad_input the amx data gradient writes with a
                             # stride along W (its phases' pixels apart: one masked store an element)
PAIRS_SPEEDUP = 1.75         # bf16 in pairs on vdpbf16ps against widened to f32 FMAs: ViT's 16x16 patch embedding
                             # on lanes in channels last, bf16 6.2 against f32 10.9 ms (Zen 4, 2 threads, batch 8)
CONVERT_GAIN = 0.67          # convert only where kernel + conversions are estimated at most this share
                             # of the kernel in the caller's layout: measured against estimated shares
                             # (Xeon, f32, kernel alone): 0.50 / 0.63, 0.68 / 0.68, 0.40 / 0.33, 0.89 / 0.55,
                             # and 1.34 / 0.70 -- a conversion estimated to save 30% that lost 34%

CHANNEL_LANES = ("lanes", "grouplanes")
PIXEL_LANES = ("blocked", "depthwise", "planes", "direct")
PACKED = ("pointwise", "gemm", "amx")
PAIRED = {"lanes": None, "gemm": None, "blocked": blocked.in_pairs, "grouplanes": grouplanes.in_pairs}


@dataclasses.dataclass(frozen=True)
class Option:
    """One internal layout for the activations, the kernel the heuristic picks there, and its costs
    per image (seconds on one core)."""

    layouts: tuple[tuple[str, Layout], ...]
    algorithm: str                   # "" where the kernel was not weighed (pruned: see `options`)
    why: str                         # the heuristic's reason for `algorithm` there
    candidates: tuple[str, ...]
    kernel_s: float
    convert_s: float
    converted: tuple[str, ...]       # operand kinds converted from the caller's layout

    @property
    def total_s(self) -> float:
        return self.kernel_s + self.convert_s

    def describe(self) -> str:
        lay = ", ".join(f"{k}={v.value}" for k, v in self.layouts if k != "W")
        conv = f" + convert {'/'.join(self.converted)} {self.convert_s * 1e6:.1f}" if self.converted else ""
        if not self.algorithm:
            return (f"{lay}: convert {'/'.join(self.converted)} {self.convert_s * 1e6:.1f} µs an image a core, "
                    f"already over {CONVERT_GAIN:.2f} of the caller's (its kernel not weighed)")
        return (f"{lay}: {self.algorithm} {self.kernel_s * 1e6:.1f}{conv} = {self.total_s * 1e6:.1f} µs an image "
                f"a core")


def _bytes(plan: Plan, kind: str) -> int:
    g, item = plan.geometry, plan.problem.dtype.itemsize
    if kind == "X":
        return g.cin * math.prod(g.x_size) * item
    if kind == "Y":
        return g.cout * math.prod(g.y_size) * item
    return g.cout * g.cin_g * math.prod(g.kernel) * item


def _whole(used: int, lanes: int) -> float:
    return used / (math.ceil(used / lanes) * lanes) if used > 0 else 1.0


def fill(plan: Plan, algorithm: str) -> float:
    """The share of the vector lanes `algorithm` keeps busy on `plan` (see the module's docstring)."""
    g, lanes = plan.geometry, vector_lanes(plan)
    if algorithm == "lanes":
        return _whole(g.cin_g if plan.kop is KOp.DGRAD else g.cout_g, lanes)
    if algorithm == "grouplanes":
        return _whole(g.groups * g.cin_g, lanes)
    if algorithm == "flat":
        return _whole(g.y_size[2] * g.cout, lanes)
    if algorithm == "direct":
        return 1.0 / lanes
    if algorithm in PIXEL_LANES and plan.kop is not KOp.WGRAD:
        return _whole((g.x_size if plan.kop is KOp.DGRAD else g.y_size)[2], lanes)
    # the packed GEMMs (PACKED) and the pixel families' weight gradients (flat dot products over planes)
    return 1.0


def in_pairs(plan: Plan, algorithm: str) -> bool:
    """Whether `algorithm` reduces `plan`'s bf16 in pairs on vdpbf16ps (two products a lane a step)."""
    if not bf16_pairs(plan) or algorithm not in PAIRED:
        return False
    return PAIRED[algorithm] is None or PAIRED[algorithm](plan)


def _strided_in_place(plan: Plan, algorithm: str, layout: Layout) -> bool:
    """Whether `algorithm` reading activations in `layout` vectorises along their non-contiguous axis."""
    if algorithm in CHANNEL_LANES:
        return layout is not Layout.CHANNELS_LAST and plan.geometry.cin > 1
    if algorithm in PIXEL_LANES:
        return layout is Layout.CHANNELS_LAST
    return False


def kernel_seconds(plan: Plan, algorithm: str) -> float:
    """The estimated time per image on one core of `algorithm` on `plan`, read in `plan`'s layouts."""
    g = plan.geometry
    macs = g.cout * math.prod(g.y_size) * g.cin_g * math.prod(g.kernel)
    rate = (AMX_MACS_PER_S if algorithm == "amx" else
            FMA_PER_CYCLE * vector_lanes(plan) * CLOCK_HZ * FMA_EFFICIENCY * fill(plan, algorithm)
            * (PAIRS_SPEEDUP if in_pairs(plan, algorithm) else 1.0))
    traffic = sum(_bytes(plan, kind) for kind in ("X", "W", "Y"))
    packing = sum(2 * _bytes(plan, kind) / PACK_BYTES_PER_S for kind in ("X", "Y")
                  if _strided_in_place(plan, algorithm, plan.layout_of(kind)))
    return max(macs / rate + packing + _scattered_stores(plan, algorithm), traffic / MEMORY_BYTES_PER_S)


def _scattered_stores(plan: Plan, algorithm: str) -> float:
    """The amx data gradient's stores into a planar grad_input at a stride along W: each stride phase's
    16-pixel tile lands on pixels that far apart, an element a store (STRIDED_STORE_S)."""
    g = plan.geometry
    if algorithm != "amx" or plan.kop is not KOp.DGRAD or g.stride[-1] == 1 or \
            plan.layout_of("X") is Layout.CHANNELS_LAST:
        return 0.0
    return g.cin * math.prod(g.x_size) * STRIDED_STORE_S


def convert_seconds(plan: Plan, kinds: tuple[str, ...]) -> float:
    """Converting activations `kinds` of `plan` between layouts: read and written once each."""
    return sum(2 * _bytes(plan, kind) / COPY_BYTES_PER_S for kind in kinds)


def internal_layouts(plan: Plan) -> list[dict[str, Layout]]:
    """The candidate internal layouts: the caller's, then every activation in NCHW, then in channels last
    (2-D and 3-D only: a 1-D activation has one layout); the weight stays the caller's."""
    caller = plan.caller_layouts()
    found = [caller]
    if plan.problem.rank >= 2:
        for layout in (Layout.CONTIGUOUS, Layout.CHANNELS_LAST):
            option = {k: (layout if k in ("X", "Y") else v) for k, v in caller.items()}
            if option not in found:
                found.append(option)
    return found


def options(plan: Plan, choose, prune: bool = True) -> list[Option]:
    """Every candidate internal layout of `plan` (the caller's first, with the algorithm pass's choice)
    with the algorithm, reason and candidates `choose(view)` gives there (view: `plan` reading that
    layout) and its estimated costs. With `prune`, a layout whose conversions alone cost more than CONVERT_GAIN of
    the caller's estimate is not weighed further (no kernel can make it the cheapest: the heuristic's
    choice there is most of a lowering's time, and most problems end here)."""
    caller = plan.caller_layouts()
    found: list[Option] = []
    for layouts in internal_layouts(plan):
        view = dataclasses.replace(plan, layouts=tuple(sorted(layouts.items())))
        converted = tuple(k for k in ("X", "Y") if k in layouts and layouts[k] is not caller[k])
        convert_s = convert_seconds(view, converted)
        if found and prune and convert_s > CONVERT_GAIN * found[0].total_s:
            found.append(Option(view.layouts, "", "", (), math.inf, convert_s, converted))
            continue
        algorithm, why, candidates = (plan.algorithm, "", plan.candidates) if layouts == caller else choose(view)
        found.append(Option(view.layouts, algorithm, why, candidates, kernel_seconds(view, algorithm), convert_s,
                            converted))
    return found


def cheapest(found: list[Option]) -> Option:
    """The caller's layouts (found[0]) unless another option is estimated at CONVERT_GAIN of it or less."""
    keep = found[0]
    best = min(found[1:], key=lambda o: o.total_s, default=keep)
    return best if best.total_s <= CONVERT_GAIN * keep.total_s else keep


def for_algorithm(found: list[Option], algorithm: str, in_caller: bool) -> Option | None:
    """The option a requested `algorithm` runs in (the tuner's pick, or an AOT bundle's kernel, named by
    algorithm only): as `cheapest` would take it among the caller's layouts and the options whose own
    choice is `algorithm` -- so the heuristic's plan is found again from its algorithm -- where the
    caller's layouts have it as a candidate (`in_caller`); else the first option choosing it, or having
    it as a candidate; None where no layout has it."""
    choosing = [o for o in found[1:] if o.algorithm == algorithm]
    if in_caller:
        return cheapest([found[0], *choosing])
    having = choosing or [o for o in found[1:] if algorithm in o.candidates]
    return having[0] if having else None
