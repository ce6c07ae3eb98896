"""The implicit-GEMM kernel's per-GEMM decisions (codegen/gpu_igemm.py): block tile, pipeline
stages, reduction order and which operands travel by 16-byte asynchronous copies.

Each of the kernel's GEMMs (forward, data gradient, weight gradient) gets its own `GemmTile`:

- Block tile BLOCK_M x BLOCK_N of 64 or 128 each, 4 warps (waves) of (BLOCK_M/2) x (BLOCK_N/2).
  CUTLASS's sm_80 conv instances and CK's xdl instances centre on 128x128 (and 128x64, 64x64 for
  small GEMMs) with 4 warps: a 128-wide side where the GEMM has at least 128 along it (rows per
  image for the forward and data gradient, whose rows also grow with the run-time batch; filters or
  (channel, tap) columns otherwise), 64 where it is shorter, so a small GEMM does not compute
  mostly padding. (256-wide tiles would need 8 warps per block: not yet.)
- Stages: on CUDA (sm_80+, cp.async) the copies of the next STAGES-1 reduction steps are in flight
  while the tensor cores work on the current one; up to 6 stages (CUTLASS's sm_80 instances use
  3-6, the deeper ones on the smaller tiles) while two blocks still fit an SM's shared memory, fewer
  when the reduction has fewer steps: sm_80's 128x128 bf16 tiles take 4 (20 KiB a stage), sm_90's
  5, 64-wide ones 6; tf32's 128x128 tiles 2 on sm_80, 3 on sm_90. Not yet timed on a device: with
  4 warps a block and two blocks an SM, the copies in flight are what hides global memory.
  On HIP (gfx90a, gfx940) copies are staged through registers into two LDS buffers.
- Async operands: an operand travels by 16-byte copies (8 bf16/f16 elements, 4 f32 ones for tf32)
  when that many consecutive reduction indices are consecutive, 16-byte aligned elements in memory: channels-last
  activations (the caller's, or the copies the layout pass stages: `staged`, codegen/gpu_staging.py) with channel counts (per group and in all) multiple of the vector and the reduction
  ordered tap-major (tap, channel) instead of (channel, tap); a contiguous weight with a (channel,
  tap) reduction of a multiple of it; a contiguous grad_output along its pixels (weight gradient,
  output pixels a multiple of it). The launch entry also checks the pointers' 16-byte alignment at run
  time; the other operands (and misaligned pointers) are gathered element by element, with the
  same predicates, into the same stages.
- Element size: 2 bytes (bf16/f16 bits), 4 (f32, as tf32 or on FMAs) or 8 (f64): shared rows are
  BLOCK_K + one 16-byte vector of elements long, and a stage's bytes, hence the stages that fit,
  scale with it.
- The FMA path (f64, f32 without tf32: no matrix instruction) keeps the same block and warp
  quarters, 64 a side, and gives each lane a register tile of the quarter (`_fma_side`); f64 steps
  16 deep (`block_k_of`), so that two stages fit HIP's 64 KiB of LDS.
"""

from __future__ import annotations

import dataclasses

from .target import Target, TargetKind

BLOCK_K = 32          # two 16-deep (bf16/f16) or four 8-deep (tf32) matrix instructions per reduction step
LDS = BLOCK_K + 8     # shared rows of 16-bit elements padded by 16 bytes: fragment loads spread over banks
VECTOR = 8            # 16-bit elements of one 16-byte copy
MAX_STAGES = 6


def vector_of(itemsize: int) -> int:
    """Elements of one 16-byte copy: 8 of 2 bytes, 4 of 4 bytes."""
    return 16 // itemsize


def block_k_of(itemsize: int) -> int:
    """The reduction step's depth: BLOCK_K, or 16 for 8-byte (f64) operands, whose 32-deep stages
    of two 64-row tiles (69632 bytes for two) would not fit HIP's 64 KiB of LDS."""
    return 16 if itemsize == 8 else BLOCK_K


def lds_of(itemsize: int) -> int:
    """A shared row's elements: the step's depth plus 16 bytes of padding."""
    return block_k_of(itemsize) + vector_of(itemsize)


@dataclasses.dataclass(frozen=True)
class GemmTile:
    """One GEMM's block tile, pipeline depth and operand access."""

    m: int
    n: int
    stages: int
    tap_major: bool     # reduction (tap, channel) instead of (channel, tap)
    vector_a: bool      # A by 16-byte copies (when the pointers are aligned)
    vector_b: bool
    itemsize: int = 2   # bytes of one operand element in shared memory (2: bf16/f16 bits, 4: f32 for tf32)

    @property
    def shared_bytes(self) -> int:
        return self.stages * (self.m + self.n) * lds_of(self.itemsize) * self.itemsize

    def describe(self, async_copy: bool) -> str:
        how = "cp.async" if async_copy else "register-staged"
        operands = [name for name, on in (("A", self.vector_a), ("B", self.vector_b)) if on]
        copies = (f"{' and '.join(operands)} by 16-byte {how} copies" if operands
                  else "operands gathered element by element")
        return (f"{self.m}x{self.n}x{block_k_of(self.itemsize)}, {self.stages} stages ({self.shared_bytes // 1024} KiB shared), "
                f"{copies}{', reduction tap-major' if self.tap_major else ''}")


def _side(length: int) -> int:
    return 128 if length >= 128 else 64


def _fma_side(length: int) -> int:
    """The FMA path's tiles stay 64 a side: a warp's 32 x 32 quarter is 32 results a thread on
    32-wide warps (16 on 64-wide waves), which f64 accumulators (two registers each) still fit
    without spilling; 128 a side would be 128 a thread."""
    return 64


def _fitted(target: Target, m: int, n: int, itemsize: int) -> tuple[int, int]:
    """(m, n), a 128 side taken down to 64 (the longer first) until two stages fit a block's shared
    memory: HIP's 64 KiB of LDS holds two 128x128 stages of 2-byte operands, not of 4-byte ones."""
    while 2 * (m + n) * lds_of(itemsize) * itemsize > target.gpu.shared_bytes_per_block and max(m, n) > 64:
        m, n = (64, n) if m >= n else (m, 64)
    return m, n


def _stages(target: Target, tile_m: int, tile_n: int, steps: int, itemsize: int = 2) -> tuple[int, str]:
    """Pipeline stages of one GEMM, and why."""
    gpu = target.gpu
    if target.kind is not TargetKind.CUDA or not gpu.async_copy:
        return 2, "two LDS buffers, the next stage's copies staged in registers while the block computes on the other"
    per_stage = (tile_m + tile_n) * lds_of(itemsize) * itemsize
    fit = min(gpu.shared_bytes_per_block, gpu.shared_bytes_per_sm // 2) // per_stage
    stages = max(2, min(MAX_STAGES, fit, steps))
    return stages, (f"{stages} stages of cp.async copies in flight ({per_stage // 1024} KiB each, two blocks per SM "
                    f"fit {gpu.shared_bytes_per_sm // 1024} KiB; {steps} reduction steps per block)")


def _contiguous(strides: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """strides of (outer, c, d, h, w) are the dense row-major ones for sizes (c, d, h, w)."""
    expected, step = [], 1
    for size in reversed(sizes):
        expected.append(step)
        step *= size
    return tuple(strides[1:]) == tuple(reversed(expected))


def _channels_last(strides: tuple[int, ...]) -> bool:
    return strides[1] == 1


@dataclasses.dataclass(frozen=True)
class IgemmTiles:
    fwd: GemmTile
    dgrad: GemmTile
    wgrad: GemmTile
    reasons: tuple[str, ...]


def choose_tiles(normal, x_strides, y_strides, w_strides, target: Target, itemsize: int = 2,
                 fma: bool = False, f64_matrix: bool = False, staged=None, dgrad_b: bool = False) -> IgemmTiles:
    """The three GEMMs' tiles for `normal` (codegen/gpu_igemm.py's Normal) on GPU `target`, for
    operands of `itemsize` bytes in shared memory, multiplied on matrix instructions, (`fma`) by
    each thread's register tile of fused multiply-adds, or (`f64_matrix`) f64 on matrix instructions.
    `staged`: the (x, y, w) strides the forward and data gradient read when the layout pass stages
    operands channels-last (codegen/gpu_staging.py); the weight gradient reads the caller's. `dgrad_b`:
    the data gradient reads a copy of the weight with filters innermost (16-byte copies of B when its
    reduction is tap-major)."""
    from math import prod

    wg_y_strides = y_strides
    if staged is not None:
        x_strides, y_strides, w_strides = staged

    side = _fma_side if fma or f64_matrix else _side

    vector = vector_of(itemsize)   # elements of one 16-byte copy

    g = max(normal.groups, 1)
    cg, kg = normal.channels // g, normal.filters // g
    taps, ov = prod(normal.kernel), prod(normal.out_size)
    tap_phase = max(1, prod(-(-r // (s // _gcd(s, d))) for r, s, d in zip(normal.kernel, normal.stride, normal.dilation)))
    positions = max(1, prod(normal.in_size) // prod(normal.stride))
    aligned_c = normal.channels % vector == 0 and cg % vector == 0
    aligned_k = normal.filters % vector == 0 and kg % vector == 0
    steps = lambda reduction: max(1, -(-reduction // block_k_of(itemsize)))

    # forward: A = input (rows pixels, reduction (channel, tap)), B = weight (columns filters)
    fwd_tap = _channels_last(x_strides) and aligned_c
    fwd_b = (fwd_tap and _channels_last(w_strides)) or (
        not fwd_tap and _contiguous(w_strides, (cg,) + tuple(normal.kernel)) and (cg * taps) % vector == 0)
    fm, fn = _fitted(target, side(ov), side(kg), itemsize)
    fwd = GemmTile(fm, fn, _stages(target, fm, fn, steps(cg * taps), itemsize)[0], fwd_tap, fwd_tap, fwd_b, itemsize)
    # data gradient: A = grad_output (rows input positions of a phase, reduction (filter, tap))
    dg_tap = _channels_last(y_strides) and aligned_k
    dm, dn = _fitted(target, side(positions), side(cg), itemsize)
    dgrad = GemmTile(dm, dn, _stages(target, dm, dn, steps(kg * tap_phase), itemsize)[0], dg_tap, dg_tap,
                     dg_tap and dgrad_b, itemsize)
    # weight gradient: A = grad_output (rows filters, reduction (image, pixel)), B = input gathered
    wg_a = _contiguous(wg_y_strides, (normal.filters,) + tuple(normal.out_size)) and ov % vector == 0
    wm, wn = _fitted(target, side(kg), side(cg * taps), itemsize)
    wgrad = GemmTile(wm, wn, _stages(target, wm, wn, steps(ov), itemsize)[0], False, wg_a, False, itemsize)

    gpu = target.gpu
    how = (f"up to {MAX_STAGES} stages of cp.async copies in flight while two blocks fit an SM's "
           f"{gpu.shared_bytes_per_sm // 1024} KiB of shared memory, no more stages than reduction steps"
           if target.kind is TargetKind.CUDA and gpu.async_copy else _stages(target, 64, 64, 1)[1])
    unit = "warps" if target.kind is TargetKind.CUDA else "waves"
    lanes = target.gpu.warp_size
    per_thread = 32 * 32 // lanes
    multiply = (f"on FMAs: each thread of a {lanes}-wide {unit[:-1]} keeps {per_thread} results in registers "
                f"({32 // (lanes // 8)} rows x 4 columns, strided over the quarter so a {unit[:-1]}'s shared-memory "
                f"reads do not conflict), {itemsize}-byte operands, fused multiply-adds in "
                f"{'f64' if itemsize == 8 else 'f32'}; tiles 64 a side to keep those registers"
                if fma else
                ("on the f64 tensor cores (mma.sync m8n8k4 .f64, two per 16 x 8 x 4 step), f64 accumulation; tiles 64 a "
                 "side: a warp's 32 x 32 quarter is 32 f64 accumulators (64 registers) a thread"
                 if target.kind is TargetKind.CUDA else
                 "on the matrix cores (v_mfma_f64_16x16x4f64, one 16 x 16 x 4 block each), f64 accumulation; tiles 64 "
                 "a side: a wave's 32 x 32 quarter is 16 f64 accumulators (32 registers) a lane")
                if f64_matrix else "on the matrix instructions")
    reasons = (f"block tiles (4 {unit} each, a 128 side where the GEMM has 128 along it, CUTLASS/CK-like; "
               f"{multiply}): "
               f"forward {fwd.describe(target.kind is TargetKind.CUDA)}; data gradient "
               f"{dgrad.describe(target.kind is TargetKind.CUDA)}; weight gradient "
               f"{wgrad.describe(target.kind is TargetKind.CUDA)}",
               f"pipeline: {how}; data visible to the warps only after the copies' wait and a barrier")
    return IgemmTiles(fwd, dgrad, wgrad, reasons)


def _gcd(a: int, b: int) -> int:
    from math import gcd

    return gcd(a, b)
