"""Staging for the implicit-GEMM GPU kernel (igemm.py): which of the GEMM's operands
the `layout` pass converts before the kernel reads them -- activations to channels-last, the weight
to channels-last (forward) or filters innermost (data gradient) -- and why.

The kernel moves an operand into shared memory by 16-byte copies (cp.async on CUDA, registers on
HIP) only where consecutive reduction indices are consecutive in memory (igemm_tiles.py):
for the forward's input and the data gradient's grad_output that is channels-last with the channel
counts a multiple of the copy's elements, the reduction ordered (tap, channel); for the forward's
weight, channels-last too once its reduction is tap-major; for the data gradient's weight, whose
reduction runs over (tap, filter), filters innermost -- a layout no caller holds: (group, channel,
tap, filter), or (group, tap, channel, filter) from a channels-last weight -- unless the kernel
copies it along its channels instead, where they are contiguous at every tap (channels-last, or a
1x1; 16-bit operands on CUDA: ldmatrix.trans). In the caller's NCHW the same operand is gathered
element by element. The layout pass may instead convert it: a
transpose kernel (32 x 32 tiles through shared memory, both sides coalesced) writes the copy into
the entry's workspace and the GEMM reads that. Outputs stay in the caller's layout (the epilogue
writes through strides). The weight gradient copies along channels (both operands channels-last,
igemm_tiles.py's mn_major) only on 16-bit operands (ldmatrix.trans on CUDA; on HIP each copy landed
transposed from the registers) with channels and filters in
whole 16-byte copies: there its NCHW input and grad_output are staged together or not at all (one
alone leaves the input gathered element by element), after the split-K partials in its workspace;
elsewhere it reads the caller's layouts (NCHW grad_output along pixels, 16 bytes at a time; the
input gathered by (channel, tap) columns, or along pixels for a 1x1 at unit stride).

The cost model, per image of a batch of REFERENCE_BATCH (the batch is a run-time argument and the
kernel serves every batch, so the decision is made for one typical of training; the weight's
conversion and the launches' latency are shared by the batch's images):

- conversion: 2 x the operands' bytes (read once, written once) at the arch's memory bandwidth,
  plus LAUNCH_SECONDS for the extra launch (the gap a dependent kernel leaves on a stream): one
  launch converts every staged operand (to_channels_last.cu.j2's jobs), so staging the weight
  beside an activation costs its bytes alone;
- the kernel's time with and without staging: max(multiplies at the units' peak, compulsory bytes at
  the memory bandwidth, instruction issue), the issue from the operands' element loads at
  GATHER_INSTRUCTIONS per element gathered or COPY_INSTRUCTIONS per 16-byte copy, issued at one
  instruction per lane and cycle (the f32 FMA peak / 2: instructions are per thread), plus the
  gathers' exposed latency: an element gather is a load whose value is stored to shared memory in
  the same k-step, outside the copies' pipeline, so each round of GATHER_BATCH elements a thread
  waits one MEMORY_LATENCY, hidden only by the other RESIDENT_BLOCKS blocks of its SM (a k-step's
  16-byte copies land stages later and hide theirs);
- each subset of the stageable operands (an activation, the weight, both) weighed, the fastest
  taken; none when the caller's layouts are the fastest. Small problems stage nothing: the launches
  cost more than the gathers.
- a forward whose input channels (a single group) are not whole 16-byte copies -- an RGB stem's 3 --
  has no vector loads in either layout: staging both its input and its weight pads their copies'
  channels with zeros to whole copies (padding.padded_channels: 8 of bf16/f16, 4 of f32/f64), in
  either caller layout. Weighed alike: the GEMM multiplies and loads the padded channels (8/3 of the
  multiplies), the conversion reads the caller's elements and writes the padded ones. ResNet-50's stem
  (3 -> 64, 7x7 at stride 2, 224x224, bf16, sm_90): the caller's layouts 11.3 us an image, staged and
  padded 2.6 us (estimates); in the machine code its main loop goes from 6.6 non-tensor instructions
  per 2048 multiply-adds and 287 in nested element gathers to 2.0 and none.

GATHER_INSTRUCTIONS and COPY_INSTRUCTIONS come from the sm_90 machine code of this kernel (nvcc 13.0,
cuobjdump -sass, a 256 -> 256 3x3 bf16 forward): the element-gather loop is about 200 instructions
for 4 elements (division by constants for pixel, tap and channel, the padding predicates, a 2-byte
load and a shared store each), the main loop of the 16-byte path ~640 instructions besides its 64
HMMA and 80 LDS for 8 copies; the gather loop is unrolled by 4 there (GATHER_BATCH: its loads issue
together). MEMORY_LATENCY is a round figure for a DRAM load on sm_80/sm_90 (about 600 clocks at
1.7 GHz: an assumption, not measured here), RESIDENT_BLOCKS the two blocks of 128 threads an SM holds
at this kernel's register count (convgen explain's occupancy line). Without that term the model took
the gathers for the cheaper side of MobileNetV2's NCHW 1x1 96 -> 576 at 14x14 (0.173 us an image
against 0.196 staged); with it, 0.417 (0.244 of it the latency), and the input is staged. The same source
compiles for AMD; its counts there are assumed alike.
Peaks are the arch's datasheet figures (codegen/arch/gpu.py; archs without figures use sm_80's).
These are estimates for a decision, not measurements of a device: no GPU has run them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from ..arch.gpu import GPU_ARCHS, Peaks
from ..ir import ConvProblem, Layout, Op
from ..target import Target
from .igemm_tiles import (WARPS, choose_tiles, dgrad_weight_along_channels, kernel_strides, on_f64_matrix, on_fma,
                          vector_of, wgrad_copies_along_channels)
from .normal import Normal
from .padding import forward_normal, padded_channels, padding_words

GATHER_INSTRUCTIONS = 50   # per element gathered (sm_90 SASS, see above)
COPY_INSTRUCTIONS = 80     # per 16-byte copy
REFERENCE_BATCH = 32       # images the weight's conversion and the launches are shared by
LAUNCH_SECONDS = 3e-6      # a dependent launch's gap on a stream: a few microseconds on current GPUs
GATHER_BATCH = 4           # element gathers whose loads issue together (the loop's unrolling)
MEMORY_LATENCY = 3.5e-7    # seconds a gather round waits for its loads (about 600 clocks; an assumption)
RESIDENT_BLOCKS = 2        # blocks an SM holds to hide one block's waits


@dataclasses.dataclass(frozen=True)
class Staging:
    """The operands (normal-convolution kinds "X", "W", "Y") the kernel reads from a channels-last
    copy in its workspace, and the layout pass's reason."""

    kinds: tuple[str, ...]
    reason: str


def gemm_of(problem: ConvProblem) -> str | None:
    """Which of the kernel's GEMMs serves `problem`: "FWD" (a normal forward, a transposed data
    gradient), "DGRAD" (a normal data gradient, a transposed forward), or None (weight, bias)."""
    if problem.op is Op.FWD:
        return "DGRAD" if problem.transposed else "FWD"
    if problem.op is Op.BWD_DATA:
        return "FWD" if problem.transposed else "DGRAD"
    return None


def _peaks(target: Target) -> Peaks:
    return (target.gpu or GPU_ARCHS[target.isa]).peaks or GPU_ARCHS["sm_80"].peaks


def _units_peak(problem: ConvProblem, target: Target, peaks: Peaks) -> float:
    if on_fma(problem, target):
        return peaks.f64 if problem.dtype.itemsize == 8 else peaks.f32
    if on_f64_matrix(problem, target):
        return peaks.matrix64
    if problem.dtype.itemsize == 4:
        return peaks.tf32 if problem.tf32 else peaks.matrix32
    return peaks.matrix16


def _loads(normal, tile, gemm: str) -> tuple[int, int]:
    """(A elements, B elements) one image's GEMM loads into shared memory: A once per column block,
    B once per row block (one image's rows, at least one block)."""
    g = max(normal.groups, 1)
    cg, kg = normal.channels // g, normal.filters // g
    taps = math.prod(normal.kernel)
    if gemm == "FWD":
        rows, reduction_rows = math.prod(normal.out_size), cg * taps
        a = rows * reduction_rows * -(-kg // tile.n) * g
        b = kg * reduction_rows * -(-rows // tile.m) * g
        return a, b
    if gemm == "WGRAD":   # A: grad_output (rows filters), B: the input's (channel, tap) columns; reduction pixels
        pixels = math.prod(normal.out_size)
        return kg * pixels * -(-(cg * taps) // tile.n) * g, cg * taps * pixels * -(-kg // tile.m) * g
    a = b = 0
    for phase in normal.phases():
        positions = math.prod(axis.count for axis in phase.axes)
        reduction = kg * math.prod(axis.taps for axis in phase.axes)
        a += positions * reduction * -(-cg // tile.n) * g
        b += cg * reduction * -(-positions // tile.m) * g
    return a, b


def _issue(elements: int, vector: bool, per_copy: int) -> float:
    """Instructions (per lane) of loading `elements` elements."""
    return elements * (COPY_INSTRUCTIONS / per_copy if vector else GATHER_INSTRUCTIONS)


def _exposed(elements: int, vector: bool, target: Target) -> float:
    """Seconds of memory latency the GPU's blocks wait out gathering `elements` elements (none for
    copies): a block's threads gather in rounds of GATHER_BATCH each, a latency a round, the SM's
    RESIDENT_BLOCKS blocks overlapping, every SM of the arch at work."""
    if vector:
        return 0.0
    arch = target.gpu or GPU_ARCHS[target.isa]
    return elements / (WARPS * arch.warp_size * GATHER_BATCH) * MEMORY_LATENCY / (arch.sm_count * RESIDENT_BLOCKS)


def _stageable(problem: ConvProblem, normal: Normal, target: Target, gemm: str) -> tuple[str, ...] | Staging:
    """The operands `gemm` could read from a staged copy (to be weighed), or the decision already
    (nothing to stage, and why)."""
    x_layout, w_layout, y_layout = normal.layouts
    g = max(normal.groups, 1)
    vector = vector_of(problem.dtype.itemsize)
    if gemm == "WGRAD":
        if not wgrad_copies_along_channels(normal, target, problem.dtype.itemsize):
            return Staging((), "the weight gradient reads its operands in the caller's layouts: it copies them along "
                               "channels only for 16-bit operands (bf16, f16) with channels and filters in whole "
                               f"16-byte copies of {vector} (in all and per group); no conversion")
        kinds = tuple(k for k, lay in (("X", x_layout), ("Y", y_layout)) if lay is not Layout.CHANNELS_LAST)
        if not kinds:
            return Staging((), "input and grad_output already channels-last, as the weight gradient copies them along "
                               "channels 16 bytes at a time: no conversion")
    else:
        a_kind, a_layout, a_channels = (("X", x_layout, normal.channels) if gemm == "FWD"
                                        else ("Y", y_layout, normal.filters))
        if (gemm == "FWD" and a_layout is Layout.CHANNELS_LAST and w_layout is Layout.CHANNELS_LAST
                and a_channels % vector == 0 and (a_channels // g) % vector == 0):
            return Staging((), "input and weight already channels-last, as the forward GEMM copies them 16 bytes at a "
                               "time: no conversion")
        if (a_channels % vector or (a_channels // g) % vector) and not (gemm == "FWD" and g == 1):
            return Staging((), f"{a_kind} has {a_channels} channels ({a_channels // g} a group): not whole 16-byte copies "
                               f"of {vector} elements, so channels-last would not give vector loads; no conversion")
        if a_channels % vector:   # (one group) the input and the weight both, their channels padded with zeros
            return ("X", "W")
        # the data gradient's reduction runs over filters: its weight is copied along its channels where they
        # are contiguous at every tap (channels-last, or a 1x1; on ldmatrix: igemm_tiles.py
        # dgrad_weight_along_channels), else gathered in either caller layout, so its copy has filters
        # innermost whatever the caller's layout
        along = gemm == "DGRAD" and dgrad_weight_along_channels(normal, kernel_strides(normal, ())[2], target,
                                                                problem.dtype.itemsize)
        kinds = tuple(k for k, lay in ((a_kind, a_layout), ("W", w_layout))
                      if (lay is not Layout.CHANNELS_LAST or (k == "W" and gemm == "DGRAD"))
                      and not (k == "W" and along))
        if not kinds:
            return Staging((), "grad_output already channels-last, and the data gradient copies the weight along its "
                               "channels (contiguous at every tap) 16 bytes at a time: no conversion")
    return kinds


def staging(problem: ConvProblem, target: Target) -> Staging:
    """Which operands of `problem`'s implicit GEMM on GPU `target` to stage channels-last (see the module)."""

    gemm = gemm_of(problem) or ("WGRAD" if problem.op is Op.BWD_WEIGHT else None)
    if gemm is None:
        return Staging((), "the bias gradient reads grad_output in the caller's layout: no conversion")
    normal = Normal.of(problem)
    g = max(normal.groups, 1)
    vector = vector_of(problem.dtype.itemsize)
    kinds = _stageable(problem, normal, target, gemm)
    if isinstance(kinds, Staging):
        return kinds

    fma, f64_matrix = on_fma(problem, target), on_f64_matrix(problem, target)
    itemsize = problem.dtype.itemsize
    peaks = _peaks(target)
    issue_rate = peaks.f32 * 1e12 / 2   # lane-instructions per second: one FMA (2 flops) per lane and cycle
    bandwidth = peaks.memory * 1e12
    flops = problem.flops / max(problem.n, 1)
    compulsory = problem.bytes_moved / max(problem.n, 1)
    multiply = flops / (_units_peak(problem, target, peaks) * 1e12)
    memory = compulsory / bandwidth

    def kernel_time(staged: tuple[str, ...]) -> tuple[float, float]:
        if gemm == "WGRAD":   # the weight gradient reads the copies (both channels-last: mn_major) or the caller's
            tile = choose_tiles(normal, *kernel_strides(normal, ()), target, itemsize, fma, f64_matrix,
                                staged=kernel_strides(normal, staged), wgrad_staged=bool(staged)).wgrad
            return bound(tile, normal)
        padded = forward_normal(normal, staged, itemsize)   # (the forward's copies' channels padded: more multiplies)
        tiles = choose_tiles(normal, *kernel_strides(normal, ()), target, itemsize, fma, f64_matrix,
                             staged=kernel_strides(padded, staged), dgrad_b="W" in staged, fwd_normal=padded)
        return bound(tiles.fwd if gemm == "FWD" else tiles.dgrad, padded)

    def bound(tile, read: Normal) -> tuple[float, float]:
        """(the GEMM's time, its operand loads': issue and the gathers' exposed latency), `read` the problem
        as it reads it (padded channels: multiplies and loads in proportion)"""
        a, b = _loads(read, tile, gemm)
        issue = (_issue(a, tile.vector_a, vector) + _issue(b, tile.vector_b, vector)) / issue_rate
        loads = issue + _exposed(a, tile.vector_a, target) + _exposed(b, tile.vector_b, target)
        return max(multiply * read.channels / normal.channels, memory, loads), loads

    # elements converted for a batch of REFERENCE_BATCH images
    image = {"X": REFERENCE_BATCH * normal.channels * math.prod(normal.in_size),
             "Y": REFERENCE_BATCH * normal.filters * math.prod(normal.out_size),
             "W": normal.filters * (normal.channels // g) * math.prod(normal.kernel)}
    us = lambda seconds: f"{seconds * 1e6:.3g} us"

    def total(staged: tuple[str, ...]) -> tuple[float, str]:
        """The conversions and the GEMM on them, and the figures in words."""
        gemm_time, issue = kernel_time(staged)
        # (padded copies: the caller's elements read, the copy's written)
        grown = (1 + padded_channels(normal, staged, itemsize) / normal.channels) / 2 if gemm == "FWD" else 1
        if not staged:
            return gemm_time, (f"{gemm.lower()} GEMM in the caller's layouts {us(gemm_time)} (operand loads "
                               f"{us(issue)}: issue at ~{GATHER_INSTRUCTIONS} instructions an element gathered, "
                               f"~{COPY_INSTRUCTIONS} a 16-byte copy, and the gathers' exposed latency)")
        converted = round(sum(image[k] for k in staged) * itemsize * grown)
        conversion = (2 * converted / bandwidth + LAUNCH_SECONDS) / REFERENCE_BATCH   # (one launch for all)
        return conversion + gemm_time, (f"{'+'.join(staged)} staged {us(conversion + gemm_time)} (conversion "
                                        f"{us(conversion)}: 2 x {converted} B at {peaks.memory:g} TB/s and "
                                        f"1 launch, over {REFERENCE_BATCH} images; GEMM {us(gemm_time)}, loads {us(issue)})")

    # every subset of what could be staged (an activation alone, the weight alone, both); the weight
    # gradient's: all of its non-channels-last activations or none (it copies along channels only
    # with both channels-last)
    subsets = ([(), kinds] if gemm == "WGRAD" else
               [subset for r in range(len(kinds) + 1) for subset in itertools.combinations(kinds, r)])
    options = sorted(((total(subset), subset) for subset in subsets), key=lambda option: option[0][0])
    chosen = options[0][1]
    numbers = (f"an image's share of a batch of {REFERENCE_BATCH}: "
               + "; ".join(words for (_, words), _ in options)
               + f"; multiplies {us(multiply)}, compulsory traffic {us(memory)} (estimates, codegen/gpu/staging.py)")
    if chosen:
        pad = padding_words(normal, chosen, itemsize)   # (the forward's alone stages X and W together)
        copies = [f"{k} with filters innermost" if k == "W" and gemm == "DGRAD" else f"{k} channels-last{pad}"
                  for k in chosen]
        return Staging(chosen, f"stage {' and '.join(copies)} in the workspace (one {'conversion' if pad else 'transpose'} launch before the "
                               f"GEMM) so that they move by 16-byte copies, the fastest option: {numbers}")
    return Staging((), f"no conversion: it would not pay for itself: {numbers}")
