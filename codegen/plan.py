"""`Plan`: the problem as the passes have decided to compute it.

A plan starts as just (problem, target) and each pass returns a new plan with the fields it
provides filled in and one reason line per decision. The plan is frozen; passes never mutate.

Kernel vocabulary. Every user-level pass reduces to one of four kernel ops on a *normal*
convolution with operands X (input, N×C×spatial), W (weight, K×C/g×kernel) and Y (output):

  KOp.FWD    Y  = conv(X, W) [+ bias over Y's channels]
  KOp.DGRAD  gX = conv_transpose(gY, W) [+ bias over X's channels]     (data gradient)
  KOp.WGRAD  gW = sum over batch and pixels of gY ⊗ X [and a bias gradient] (weight gradient)
  KOp.BIAS   gb = sum over batch and pixels of one tensor, per channel

A transposed convolution swaps X and Y: its forward is a DGRAD, its data gradient a FWD.
"""

from __future__ import annotations

import dataclasses
import enum

from .ir import ConvProblem, Layout
from .keys import canonical_key
from .target import Target


class KOp(str, enum.Enum):
    FWD = "fwd"
    DGRAD = "dgrad"
    WGRAD = "wgrad"
    BIAS = "bias"


@dataclasses.dataclass(frozen=True)
class Geometry:
    """A normal convolution in 3-D form (1-D and 2-D problems pad leading axes with size 1)."""

    groups: int
    cin_g: int        # X channels per group
    cout_g: int       # Y channels per group
    x_size: tuple[int, int, int]
    y_size: tuple[int, int, int]
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    pad_lo: tuple[int, int, int]
    dilation: tuple[int, int, int]

    @property
    def cin(self) -> int:
        return self.groups * self.cin_g

    @property
    def cout(self) -> int:
        return self.groups * self.cout_g


@dataclasses.dataclass(frozen=True)
class Operand:
    """One pointer argument of a kernel entry: the caller's tensor role and its layout there."""

    role: str          # input, weight, bias, output, grad_output, grad_input, grad_weight, grad_bias
    kind: str          # X, W, Y, B (bias-like vector) — which kernel operand it binds to
    layout: Layout
    writes: bool
    optional: bool = False   # may be passed as a null pointer (bias)


@dataclasses.dataclass(frozen=True)
class Tiling:
    vector_lanes: int        # SIMD lanes of the accumulator type on the target
    threads_hint: str        # which loops the OpenMP parallel-for covers
    rows_per_tile: int = 0   # direct: output (or input) rows a thread accumulates at once; blocked:
                             # output (data gradient: input-gradient) rows per work item
    row_tiles: int = 1       # direct: tiles per plane
    kb: int = 0              # blocked: channels held in registers at once (grouplanes: pixels per tile;
                             # depthwise weight gradient over planes: taps per pass)
    nv: int = 0              # blocked: vectors of columns held in registers at once (grouplanes: of channels;
                             # depthwise planes: 1 when the taps step in assembly)
    cols: int = 0            # blocked: columns of one work item (a multiple of nv * vector_lanes)
    in_place: tuple[str, ...] = ()   # operands whose rows are read in place, not copied
    ksb: int = 0             # pointwise, gemm: output channels per work item (a multiple of kb); grouplanes:
                             # channel vectors per work item (a multiple of nv)
    rb: int = 0              # pointwise, gemm: values per chunk of the reduction; lanes: channels per chunk
                             # of the reduction, or (weight gradient) rows per work item
    pc: int = 0              # lanes weight gradient: pixels per chunk of the reduction
    splits: int = 1          # weight gradients: fixed parts of the reduction, added in order
    channel_major: bool = False   # lanes: work items walk all pixels of one channel block before the next
    min_items: int = 0       # pointwise: work items an item's pixel count is lowered to give, at most
    planes: bool = False     # depthwise weight gradient: whole zero-padded planes as one flat run per tap
    pairs: bool = False      # lanes (bf16): the reduction in pairs of channels, two bf16 products per f32
                             # lane and step (vdpbf16ps), from copies that interleave the pairs
    stream_bytes: int = 0    # lanes forward: outputs of at least this many bytes per call are written with
                             # non-temporal stores, past the caches (0: never)
    copy_per_item: int = 0   # lanes forward (channels-last input, no depth window) and weight gradient (channels-
                             # last input): where the padded copy of the whole input would take at least this
                             # many bytes per call, each work item's thread copies the part it reads instead
                             # (forward: its padded rows; weight gradient: its channels' planes) (0: never)
    stage: bool = False      # lanes weight gradient (1-D, contiguous operands): each chunk of the reduction
                             # stages its zero-padded input window and its grad_output in its thread's
                             # buffers, instead of a whole copy and pack per call
    row_split: tuple[int, ...] = ()   # lanes forward and stride-1 data gradient: the sizes of the register tiles
                             # that split each row (work items of whole rows, a tap's padding skipped pixel
                             # by pixel); empty: tiles of kb pixels run across rows
    part_pixels: int = 0     # grouplanes weight gradient: output pixels of the batch a part of the reduction
                             # takes at least (fewer parts than `splits` where the batch has fewer; 0: splits)
    x_inner: bool = False    # lanes forward: a channel-plane input (NCHW) copied channels innermost, as a
                             # channels-last one is (each pixel's channels in a row of the copy)
    tap_rows: bool = False   # lanes weight gradient: each register tile is the kh x kw taps of one (input
                             # channel, kd) (kb = kh * kw), read at compile-time offsets from one pointer
    edge_tiles: bool = False   # grouplanes forward: the columns at each end of a row that meet its padding
                             # in one tile per side (else one tile per column)
    rows_at_once: bool = False   # grouplanes weight gradient: an output row's input rows summed in one walk
                             # of its pixels (grad_output loaded once a pixel; at unit stride a sliding window
                             # of each input row), where the sums fit the vector registers


@dataclasses.dataclass(frozen=True)
class GpuTiling:
    """How a GPU kernel spreads its work (codegen/passes/tiling_gpu.py): `threads_per_block`
    threads (a multiple of the warp size), each computing what `per_thread` says; the grid covers
    the results. `threads_hint` says the same in words (as Tiling's does for the CPU)."""

    threads_per_block: int
    warps_per_block: int
    per_thread: str
    threads_hint: str


@dataclasses.dataclass(frozen=True)
class Plan:
    problem: ConvProblem
    target: Target
    reasons: tuple[tuple[str, str], ...] = ()
    applied: tuple[str, ...] = ()
    kop: KOp | None = None
    geometry: Geometry | None = None
    operands: tuple[Operand, ...] = ()
    bias_from: str | None = None        # WGRAD with bias: "Y" (normal) or "X" (transposed)
    algorithm: str | None = None
    candidates: tuple[str, ...] = ()
    layouts: tuple[tuple[str, Layout], ...] = ()   # internal layout per kernel operand kind
    conversions: tuple[str, ...] = ()
    layout_options: tuple = ()          # CPU: the layout pass's options (layout_cost.Option), the caller's first
    staged: tuple[str, ...] = ()        # GPU igemm: operand kinds its kernel reads from a converted copy (layout pass)
    group_strategy: str | None = None
    tiling: Tiling | GpuTiling | None = None
    batch_is_runtime: bool = True
    requested_algorithm: str | None = None   # a caller's (or the tuner's) pick among the candidates
    requested_layout: Layout | None = None   # CPU: the activations' internal layout, instead of the layout pass's
                                             # cost model (tests, the tuner)

    def decide(self, pass_name: str, reason: str, **changes) -> "Plan":
        """A new plan with `changes` applied and one reason recorded for `pass_name`."""
        return dataclasses.replace(self, reasons=self.reasons + ((pass_name, reason),), **changes)

    def mark(self, pass_name: str) -> "Plan":
        return dataclasses.replace(self, applied=self.applied + (pass_name,))

    def caller_layouts(self) -> dict[str, Layout]:
        """The layout the caller holds each kernel operand kind in (X, W, Y; the bias is a vector)."""
        layouts: dict[str, Layout] = {}
        for operand in self.operands:
            if operand.kind != "B":
                layouts.setdefault(operand.kind, operand.layout)
        return layouts

    def layout_of(self, kind: str) -> Layout:
        """The layout the kernel reads operand `kind` in: the layout pass's internal one once it has run
        (or while it weighs an internal layout), before that the caller's."""
        for k, layout in self.layouts:
            if k == kind:
                return layout
        for op in self.operands:
            if op.kind == kind:
                return op.layout
        raise KeyError(kind)

    def key(self) -> str:
        return canonical_key(self)

    def name(self) -> str:
        if not self.algorithm:
            return self.problem.name()
        # a CPU kernel converting the caller's activations (layout pass) is named by its internal layout
        via = f"_via_{self.layout_of('X').value}" if self.conversions and self.target.gpu is None else ""
        return f"{self.problem.name()}_{self.algorithm}{via}"
