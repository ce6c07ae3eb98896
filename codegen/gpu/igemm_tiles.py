"""The implicit-GEMM kernel's per-GEMM decisions (igemm.py): how it multiplies, block tile, pipeline
stages, reduction order and which operands travel by 16-byte asynchronous copies. The candidates are
the arch's data (codegen/arch/gpu.py `IgemmTiling`); the choice per problem is made here.

- Multiply: bf16/f16 on matrix instructions; f32 with tf32 on CUDA's tf32 ones, on HIP's
  v_mfma_f32_16x16x4f32; f64 on matrix instructions on both (`on_f64_matrix`); CUDA f32 without tf32
  on FMAs (`on_fma`), each lane keeping a register tile of its warp's quarter.
- Block tile BLOCK_M x BLOCK_N from the arch's sides for the operands' class (64, 96 or 128 for
  matrix instructions on every arch today), WARPS warps (waves) of (BLOCK_M/2) x (BLOCK_N/2). Rows of
  pixels (the forward's and data gradient's, which grow with the run-time batch) take the largest
  side an image has that many of; filters and (channel, tap) columns a side that pads them little
  while keeping warp tiles wide (_padded_side: 96 filters one 96 tile, not two 64 ones computing
  128; 48 one 64 tile). A 96 side
  only where the kernel takes it (_sides: mma.sync or MFMA, not wgmma; not rows of pixels; not tiles of
  reduction rows; whole 16-byte copies a thread). A side is taken down to the smallest until two
  stages fit a block's shared memory.
- Reduction step: the arch's depth (32), or 64 on ldmatrix where the reduction is long enough and
  little more padded by it (a sixth; a third where the GEMM has NARROW_COLUMNS columns or fewer:
  step_depth); the weight gradient's 64 on ldmatrix, 128 where its filters and columns are one 64 x 64
  tile (its warps' quarters are 32 x 32: a step twice as deep weighs its fixed costs against twice the
  matrix instructions).
- Stages: on CUDA (sm_80+, cp.async) the copies of the next STAGES-1 reduction steps are in flight while
  the tensor cores work on the current one; up to the arch's max_stages while two blocks still fit an
  SM's shared memory (sm_90a's warp-specialised blocks: one), fewer where the reduction has fewer steps:
  sm_80's 128x128 bf16 tiles take 5 (16 KiB a stage), sm_90's 6, 64-wide ones 6; tf32's 128x128 tiles 2
  on sm_80, 3 on sm_90 (not timed on a device: the copies in flight are what hides global memory). On
  HIP (gfx90a, gfx940) copies are staged through registers into two LDS buffers.
- Async operands: an operand travels by 16-byte copies (8 bf16/f16 elements, 4 f32 ones for tf32)
  when that many consecutive reduction indices are consecutive, 16-byte aligned elements in memory:
  channels-last activations (the caller's, or the copies the layout pass stages: `staged`,
  staging.py) with channel counts (per group and in all) multiple of the vector and the reduction
  ordered tap-major (tap, channel) instead of (channel, tap); a contiguous weight with a (channel,
  tap) reduction of a multiple of it; a contiguous grad_output along its pixels (weight gradient,
  output pixels a multiple of it), and so the weight gradient's input too where its pixels are the
  output's (1x1 at unit stride, no padding); on swizzled rows, the weight gradient's channels-last
  grad_output and input along their filters and channels (whole vectors of both, in all and per group):
  into shared tiles whose rows are the reduction's (mn_major; ldmatrix.trans), on HIP landed from the
  registers transposed into the K-major rows, with (tap, channel) columns; on ldmatrix too, the
  data gradient's weight along its channels (b_mn: the caller's weight, a filter's channels contiguous
  at every tap and whole vectors of them -- channels-last, or any 1x1 -- its rows (tap, filter)
  tap-major as grad_output's, or one tap; dgrad_weight_along_channels), which then needs no staging. The launch entry
  also checks the pointers' 16-byte alignment at run time; the other operands (and misaligned
  pointers) are gathered element by element, with the same predicates, into the same stages (of
  rows along the reduction).
- Shared layout: a tile keeps each row's (column's, for B) step of the reduction contiguous. With
  `ldmatrix` (16-bit operands on CUDA, `on_ldmatrix`) rows are the step's depth long, unpadded, their
  16-byte chunks XOR-swizzled by the row (the PTX ISA's 32/64/128-byte swizzle: 64 bytes for a step
  of 32), and each fragment comes from one `ldmatrix.x4`: the 8 rows of each of its phases, and the
  8 lanes of a 16-byte copy's phase, fall in 8 different 16-byte groups of banks (HIP's 16-bit rows
  too: swizzled_rows). Otherwise rows are one 16-byte vector longer, padded.
- Element size: 2 bytes (bf16/f16 bits), 4 (f32, as tf32 or on FMAs) or 8 (f64): a stage's bytes scale.
"""

from __future__ import annotations

import dataclasses
import math

from ..arch.gpu import BlockTiles
from ..ir import ConvProblem, DType, Layout
from ..render import operand_strides
from ..target import Target, TargetKind
from .normal import Normal

WARPS = 4   # warps (waves) a block, each a quarter of its tile: the template's 2 x 2 layout
MN_MAJOR_SIDE = 64   # a tile of reduction rows (mn_major) swizzles 8 chunks of 8 elements a row
NARROW_COLUMNS = 32  # a GEMM's columns (a group's filters or channels) that leave its warps few matrix instructions
DEEP_STEP = 64       # the reduction step on ldmatrix where the launched GEMM's reduction is whole such steps
STATIC_SHARED = 1024  # a block's static shared memory beside its stages: the tap tables (two of 33 8-byte entries
                      # at most, CUDA) and the epilogue's warp sums
WIDE_STEP = 128      # the weight gradient's where filters and (channel, tap) columns are one 64 x 64 tile: its
                     # warps' 32 x 32 quarters do half the matrix instructions a step of a 128-wide tile's


def on_f64_matrix(problem: ConvProblem, target: Target) -> bool:
    """Whether the kernel multiplies f64 on matrix instructions, which every GPU arch convgen targets
    has: the f64 tensor cores' `mma.sync` m8n8k4 .f64 (DMMA) on CUDA (sm_80 and later), the matrix
    cores' `v_mfma_f64_16x16x4f64` on HIP (gfx90a, gfx940)."""
    return problem.dtype is DType.F64 and target.kind in (TargetKind.CUDA, TargetKind.HIP)


def on_fma(problem: ConvProblem, target: Target) -> bool:
    """Whether the kernel multiplies on the vector units (CUDA cores, AMD's SIMDs) with fused
    multiply-adds instead of matrix instructions: on CUDA f32 without tf32 (HIP's f32 takes
    v_mfma_f32_16x16x4f32; f64 takes matrix instructions on both, `on_f64_matrix`)."""
    return (problem.dtype is DType.F64 and not on_f64_matrix(problem, target)) or (
        problem.dtype is DType.F32 and not problem.tf32 and target.kind is TargetKind.CUDA)


def vector_of(itemsize: int) -> int:
    """Elements of one 16-byte copy: 8 of 2 bytes, 4 of 4 bytes."""
    return 16 // itemsize


def on_ldmatrix(target: Target, itemsize: int) -> bool:
    """Whether the kernel's fragments come from `ldmatrix.x4` out of XOR-swizzled, unpadded shared
    rows: 16-bit operands (bf16/f16 on the tensor cores) on an arch with ldmatrix (CUDA)."""
    return itemsize == 2 and target.gpu.ldmatrix


def on_wgmma(target: Target, itemsize: int) -> bool:
    """Whether the kernel multiplies on sm_90a's warpgroup MMA (`wgmma.mma_async` m64nNk16, both operands
    read by the tensor cores from the shared stages through descriptors) instead of ldmatrix and
    `mma.sync`: 16-bit operands on an arch with wgmma. The stages are the ldmatrix path's (their
    K-major swizzle is wgmma's); tiles of reduction rows take wgmma's MN-major layout."""
    return on_ldmatrix(target, itemsize) and target.gpu.wgmma


def swizzled_rows(target: Target, itemsize: int) -> bool:
    """Whether the shared tiles' rows are unpadded with XOR-swizzled 16-byte chunks: 16-bit operands on
    ldmatrix (CUDA), and on HIP, whose fragments are one 16-byte read a lane (hip.h): there a padded
    32-deep row (80 bytes) puts the two rows a phase of 8 copies writes on overlapping banks, the
    swizzle neither those nor the 8 rows a phase of fragment reads takes. (4- and 8-byte operands
    keep padded rows, 144 bytes: conflict-free for both.)"""
    return itemsize == 2 and (target.gpu.ldmatrix or target.kind is TargetKind.HIP)


def _row(depth: int, itemsize: int, swizzled: bool) -> int:
    """A shared row's elements: the step's depth, plus one 16-byte vector of padding unless swizzled."""
    return depth if swizzled else depth + vector_of(itemsize)


def wgrad_copies_along_channels(normal: Normal, target: Target, itemsize: int) -> bool:
    """Whether the weight gradient can copy both operands along filters and channels (mn_major) once
    they are channels-last: 16-bit operands on swizzled rows (ldmatrix.trans; HIP's copies land
    transposed), channels and filters (in all and per group) whole 16-byte copies."""
    vector, g = vector_of(itemsize), max(normal.groups, 1)
    return (swizzled_rows(target, itemsize) and normal.channels % vector == 0 and (normal.channels // g) % vector == 0
            and normal.filters % vector == 0 and (normal.filters // g) % vector == 0)


def block_tiles(target: Target, itemsize: int, fma: bool) -> BlockTiles:
    """The arch's block tiles for operands of `itemsize` bytes (on FMAs with `fma`)."""
    tiling = target.gpu.igemm
    return tiling.f64 if itemsize == 8 else tiling.fma if fma else tiling.matrix


@dataclasses.dataclass(frozen=True)
class GemmTile:
    """One GEMM's block tile, pipeline depth and operand access."""

    m: int
    n: int
    stages: int
    tap_major: bool     # reduction (tap, channel) instead of (channel, tap)
    vector_a: bool      # A by 16-byte copies (when the pointers are aligned)
    vector_b: bool
    itemsize: int       # bytes of one operand element in shared memory (2: bf16/f16 bits, 4: f32, 8: f64)
    depth: int          # the reduction step (BLOCK_K)
    swizzled: bool      # unpadded rows, 16-byte chunks XOR-swizzled (swizzled_rows): fragments by ldmatrix on
                        # CUDA, 16-byte reads on HIP
    mn_major: bool = False   # both operands copied along their rows / columns (filters, channels), not along the
                             # reduction: shared tiles of reduction rows, fragments by ldmatrix.trans
    a_mn: bool = False       # A alone so (the forward's NCHW input along its pixels: 1x1 at unit stride)
    b_mn: bool = False       # B so (the data gradient's weight along its channels: channels-last or 1x1), A either way

    @property
    def lds(self) -> int:
        """A shared row's elements: the step's depth, plus 16 bytes of padding (fragment loads spread
        over banks) unless the rows are swizzled."""
        return _row(self.depth, self.itemsize, self.swizzled)

    @property
    def shared_bytes(self) -> int:
        return self.stages * (self.m + self.n) * self.lds * self.itemsize

    def describe(self, async_copy: bool, wgmma: bool = False) -> str:
        how = "cp.async" if async_copy else "register-staged"
        operands = [name for name, on in (("A", self.vector_a), ("B", self.vector_b)) if on]
        copies = (f"{' and '.join(operands)} by 16-byte {how} copies" if operands
                  else "operands gathered element by element")
        read = ("reduction rows in shared memory, " + ("read MN-major by wgmma" if wgmma else "fragments by ldmatrix.trans")
                if async_copy else "each chunk's 8 elements landed from registers into 8 K-major rows")
        if self.mn_major:
            copies += f" along filters and channels ({read})"
        elif self.a_mn or self.b_mn:
            along = [what for what, on in (("A along its pixels", self.a_mn), ("B along its channels", self.b_mn)) if on]
            copies += f", {' and '.join(along)} ({read})"
        return (f"{self.m}x{self.n}x{self.depth}, {self.stages} stages ({self.shared_bytes // 1024} KiB shared), "
                f"{copies}{', reduction tap-major' if self.tap_major else ''}")


@dataclasses.dataclass(frozen=True)
class IgemmTiles:
    fwd: GemmTile
    dgrad: GemmTile
    wgrad: GemmTile
    reasons: tuple[str, ...]


def _side(sides: tuple[int, ...], length: int) -> int:
    """The largest side the GEMM has `length` of along it, else the smallest (rows of pixels, whose count
    grows with the run-time batch)."""
    return max([s for s in sides if length >= s], default=sides[0])


def _padded_side(sides: tuple[int, ...], length: int) -> int:
    """For a side of fixed `length` (filters, (channel, tap) columns): among the sides above the
    smallest, the largest that pads `length` at most an eighth more than the least padded of them (96
    filters: one 96 tile, not a 128 one; 864 columns: seven of 128, not nine of 96); the smallest side
    only where it pads a quarter less than that (48 filters: one 64 tile). Narrow warp tiles cost
    more than their share: a 32-wide one issues twice the fragment loads per matrix instruction of a
    64-wide one, more than shared memory serves at the tensor cores' rate on H100."""
    if length <= 0:
        return sides[0]
    padded = {s: -(-length // s) * s for s in sides}
    large = sides[1:] or sides
    least = min(padded[s] for s in large)
    side = max(s for s in large if 8 * padded[s] <= 9 * least)
    return sides[0] if 4 * padded[sides[0]] < 3 * padded[side] else side


def _sides(target: Target, shape: BlockTiles, itemsize: int, pixels: bool, mn: bool) -> tuple[int, ...]:
    """The arch's sides a GEMM side may take in this kernel: not a 96 (any side not a multiple of 64)
    where wgmma multiplies (its m64 instructions, the template's 64- and 128-column ones), along rows of
    pixels (the forward's and data gradient's rows: one gathered a thread, THREADS a multiple of the
    side), into tiles of reduction rows (`mn`: blocks of 64 elements), or where a thread's 16-byte copies
    of a stage of that side would not be whole (HIP's 256 threads, 16-bit operands 32 deep)."""
    threads, chunks = WARPS * target.gpu.warp_size, shape.depth // vector_of(itemsize)
    odd_ok = not on_wgmma(target, itemsize) and not pixels and not mn
    return tuple(s for s in shape.sides if s % 64 == 0 or (odd_ok and s * chunks % threads == 0))


def _fitted(target: Target, shape: BlockTiles, m: int, n: int, itemsize: int) -> tuple[int, int]:
    """(m, n), the longer side taken down to the smallest until two stages fit a block's shared
    memory: HIP's 64 KiB of LDS holds two 128x128 stages of 2-byte operands, not of 4-byte ones."""
    row = _row(shape.depth, itemsize, swizzled_rows(target, itemsize)) * itemsize
    while 2 * (m + n) * row > target.gpu.shared_bytes_per_block and max(m, n) > shape.sides[0]:
        m, n = (shape.sides[0], n) if m >= n else (m, shape.sides[0])
    return m, n


def _stages(target: Target, per_stage: int, steps: int, blocks: int = 2) -> int:
    """Pipeline stages of one GEMM whose stage is `per_stage` bytes, `blocks` of them an SM (see the
    module)."""
    gpu = target.gpu
    if target.kind is not TargetKind.CUDA or not gpu.async_copy:
        return 2
    fit = (min(gpu.shared_bytes_per_block, gpu.shared_bytes_per_sm // blocks) - STATIC_SHARED) // per_stage
    return max(2, min(gpu.igemm.max_stages, fit, steps))


def _tile(target: Target, shape: BlockTiles, rows: int, columns: int, reduction: int, itemsize: int,
          tap_major: bool, vector_a: bool, vector_b: bool, mn_major: bool = False, a_mn: bool = False,
          pixels: bool = True, b_mn: bool = False) -> GemmTile:
    """A GEMM's tile: `rows` of pixels (growing with the batch: the largest side they have) unless not
    `pixels` (filters: _padded_side), `columns` by _padded_side."""
    row_sides = _sides(target, shape, itemsize, pixels, mn_major or a_mn)
    column_sides = _sides(target, shape, itemsize, False, mn_major or b_mn)
    m = _side(row_sides, rows) if pixels else _padded_side(row_sides, rows)
    m, n = _fitted(target, shape, m, _padded_side(column_sides, columns), itemsize)
    steps = max(1, -(-reduction // shape.depth))
    swizzled = swizzled_rows(target, itemsize)
    per_stage = (m + n) * _row(shape.depth, itemsize, swizzled) * itemsize
    blocks = 1 if on_wgmma(target, itemsize) else 2   # (warp-specialised warpgroup MMA: one block an SM)
    return GemmTile(m, n, _stages(target, per_stage, steps, blocks), tap_major, vector_a, vector_b, itemsize, shape.depth,
                    swizzled, mn_major and swizzled and min(m, n) >= MN_MAJOR_SIDE,
                    a_mn and swizzled and m >= MN_MAJOR_SIDE, b_mn and swizzled and n >= MN_MAJOR_SIDE)


def _contiguous(strides: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """strides of (outer, c, d, h, w) are the dense row-major ones for sizes (c, d, h, w)."""
    expected, step = [], 1
    for size in reversed(sizes):
        expected.append(step)
        step *= size
    return tuple(strides[1:]) == tuple(reversed(expected))


def _channels_last(strides: tuple[int, ...]) -> bool:
    return strides[1] == 1


def step_depth(normal: Normal, target: Target, itemsize: int, gemm: str | None, depth: int) -> int:
    """The reduction step (BLOCK_K) of a kernel file launching `gemm`: DEEP_STEP on ldmatrix for the weight
    gradient always (batch x pixels, at run time), and for the forward (data gradient) where its
    reduction is two such steps at least, a tap's channels (filters) per group are whole 16-byte copies
    (the iterators' steps may straddle taps) and the deeper step pads the reduction at most a sixth
    more than the arch's `depth` does (a tap's channels whole steps of it pad nothing; 24 channels of
    a 3x3, 216 deep: 256 against 224, whose 32-deep steps issue 24 matrix instructions a warp against
    the same fixed costs, 3.2 non-tensor instructions per HMMA against 2.2 on sm_90); else `depth`.
    Where the GEMM's columns (a group's filters; the data gradient's channels) are NARROW_COLUMNS or
    fewer, a warp's step issues a matrix instruction a live 8-column fragment only (nvcc drops those
    of columns past the end: 24 filters, 3 of 4 a warp, the other warp column none), so the step's
    fixed costs weigh the more: the deeper step is taken from two steps of the arch's on, padding a
    third more at most (sm_90, bf16, nvcc 13.0 machine code, non-tensor per 2048 multiply-adds:
    MobileNetV2's 1x1 144 -> 24 forward 2.7 -> 2.0 channels-last, 3.1 -> 2.4 NCHW; 16 <- 96 data
    gradient 2.0 -> 1.5, 4.4 -> 3.5 NCHW; 24 <- 144 2.2 -> 1.6, 3.4 -> 2.5; read, not timed). Such
    layers are bound by memory: the padded multiplies cost issue slots the loop has.
    A step twice as deep halves what a k-step's fixed costs (barrier, wait, the stage ring, the
    iterators' steps) weigh against its matrix instructions (CUTLASS's 16-bit tiles are 64 deep as
    well), for half the stages in the same shared memory. The weight gradient's is WIDE_STEP where its
    GEMM is one 64 x 64 tile (a group's filters and (channel, tap) columns 64 at most) on mma.sync;
    wgmma's K-major operands are rows of at most 128 bytes (its widest swizzle), 64 elements."""
    if gemm is None or not on_ldmatrix(target, itemsize):
        return depth
    g = max(normal.groups, 1)
    if gemm == "WGRAD":   # (64 x 64 tiles: twice as deep, see WIDE_STEP; not on wgmma, whose swizzles span 128 bytes)
        small = normal.filters // g <= MN_MAJOR_SIDE and normal.channels // g * math.prod(normal.kernel) <= MN_MAJOR_SIDE
        return WIDE_STEP if small and not on_wgmma(target, itemsize) else DEEP_STEP
    per_tap, taps = ((normal.channels // g, math.prod(normal.kernel)) if gemm == "FWD"
                     else (normal.filters // g, _phase_taps(normal)))
    reduction = per_tap * taps
    columns = normal.filters // g if gemm == "FWD" else normal.channels // g
    narrow = columns <= NARROW_COLUMNS
    if reduction < (DEEP_STEP + depth if narrow else 2 * DEEP_STEP) or per_tap % vector_of(itemsize):
        return depth   # (one step: no pipeline, no loop)
    deep, arch = (-(-reduction // step) * step for step in (DEEP_STEP, depth))   # the reductions padded
    return DEEP_STEP if (3 * deep <= 4 * arch if narrow else 6 * deep <= 7 * arch) else depth


def _phase_taps(normal: Normal) -> int:
    """The taps of the data gradient's largest stride phase."""
    return max(1, math.prod(-(-r // (s // math.gcd(s, d))) for r, s, d in zip(normal.kernel, normal.stride, normal.dilation)))


def _pixels_are_outputs(normal: Normal) -> bool:
    """Each input pixel is its output pixel's: 1x1 taps at unit stride without padding."""
    return (math.prod(normal.kernel) == 1 and tuple(normal.in_size) == tuple(normal.out_size)
            and all(s == 1 for s in normal.stride) and not any(normal.pad))


def kernel_strides(normal: Normal, staged: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(x, y, w) element strides the forward and data gradient read: the caller's layouts, channels-last
    for `staged` kinds (the data gradient reads a staged weight through its own accessor, wt_at). For
    the strides of padded copies, pass padding.forward_normal's `normal`."""
    lay = {k: Layout.CHANNELS_LAST if k in staged else v for k, v in zip("XWY", normal.layouts)}
    g = normal.groups or 1
    return (operand_strides(lay["X"], normal.channels, normal.in_size),
            operand_strides(lay["Y"], normal.filters, normal.out_size),
            operand_strides(lay["W"], normal.channels // g, normal.kernel))


def dgrad_weight_along_channels(normal: Normal, w_strides, target: Target, itemsize: int) -> bool:
    """Whether the data gradient can copy a weight of element strides `w_strides` (filter, channel, d, h,
    w) along its channels (b_mn, on ldmatrix): a filter's channels contiguous at every tap, each tap's
    start 16-byte aligned and a group's channels whole 16-byte copies -- a channels-last weight, or any
    1x1 (its reduction rows must also be tap-major, or one tap: choose_tiles). Its tiles of reduction rows
    are 64 or 128 wide: where a kernel of several taps has channels that pads more than a 96-wide tile
    (80 or 96 channels: 128 columns, a third or a half more work), the weight is staged with filters
    innermost instead, a copy the taps share; a 1x1's copies along channels save its weight's conversion
    (a launch, most of a small layer's time) for those columns."""
    vector, cg = vector_of(itemsize), normal.channels // max(normal.groups, 1)
    if not on_ldmatrix(target, itemsize):
        return False
    whole_rows = all(extent == 1 or stride % vector == 0 for extent, stride in zip(normal.kernel, w_strides[2:]))
    shape = block_tiles(target, itemsize, False)
    return (w_strides[1] == 1 and w_strides[0] % vector == 0 and whole_rows and cg % vector == 0
            and (math.prod(normal.kernel) == 1 or _columns(_sides(target, shape, itemsize, False, True), cg)
                 <= _columns(_sides(target, shape, itemsize, False, False), cg)))


def _columns(sides: tuple[int, ...], length: int) -> int:
    """`length` padded to whole tiles of the side _padded_side takes among `sides`."""
    side = _padded_side(sides, length)
    return -(-length // side) * side


def choose_tiles(normal: Normal, x_strides, y_strides, w_strides, target: Target, itemsize: int = 2,
                 fma: bool = False, f64_matrix: bool = False, staged=None, dgrad_b: bool = False,
                 wgrad_staged: bool = False, gemm: str | None = None, fwd_normal: Normal | None = None) -> IgemmTiles:
    """The three GEMMs' tiles for `normal` on GPU `target`, for operands of `itemsize` bytes in shared
    memory, multiplied on matrix instructions, (`fma`) by each thread's register tile of fused
    multiply-adds, or (`f64_matrix`) f64 on matrix instructions. `staged`: the (x, y, w) strides the
    forward and data gradient read when the layout pass stages operands channels-last (staging.py);
    the weight gradient reads the caller's, or (`wgrad_staged`) those copies too. `dgrad_b`: the data
    gradient reads a copy of the weight with filters innermost (16-byte copies of B when its reduction
    is tap-major). `gemm`: the GEMM the kernel file launches ("FWD", "DGRAD", "WGRAD"), whose
    reduction picks the step's depth (step_depth; None: the arch's). `fwd_normal`: the forward's problem
    where the layout pass pads its copies' channels (padding.py; `staged`'s x and w strides theirs)."""
    fwd_normal = fwd_normal or normal
    wg_x_strides, wg_y_strides = x_strides, y_strides
    if staged is not None:
        x_strides, y_strides, w_strides = staged
        if wgrad_staged:
            wg_x_strides, wg_y_strides = x_strides, y_strides
    shape = block_tiles(target, itemsize, fma)
    shape = dataclasses.replace(shape, depth=step_depth(fwd_normal if gemm == "FWD" else normal, target, itemsize,
                                                        gemm, shape.depth))
    vector = vector_of(itemsize)   # elements of one 16-byte copy

    g = max(normal.groups, 1)
    cg, kg = normal.channels // g, normal.filters // g
    taps, ov = math.prod(normal.kernel), math.prod(normal.out_size)
    tap_phase = _phase_taps(normal)
    positions = max(1, math.prod(normal.in_size) // math.prod(normal.stride))
    aligned_c = normal.channels % vector == 0 and cg % vector == 0
    aligned_k = normal.filters % vector == 0 and kg % vector == 0

    # forward: A = input (rows pixels, reduction (channel, tap)), B = weight (columns filters)
    cgf = fwd_normal.channels // g   # (its channels: the padded copies' where the layout pass pads them)
    fwd_tap = _channels_last(x_strides) and fwd_normal.channels % vector == 0 and cgf % vector == 0
    fwd_b = (fwd_tap and _channels_last(w_strides)) or (
        not fwd_tap and _contiguous(w_strides, (cgf,) + tuple(normal.kernel)) and (cgf * taps) % vector == 0)
    # (or, on ldmatrix, A along its pixels where each input pixel is its output pixel's: a contiguous NCHW
    # input, 1x1 taps at unit stride without padding, whole 16-byte copies of an image's pixels: the rows
    # of A, into tiles of reduction rows)
    fwd_mn = (not fwd_tap and on_ldmatrix(target, itemsize) and _pixels_are_outputs(normal)
              and _contiguous(x_strides, (fwd_normal.channels,) + tuple(normal.in_size)) and ov % vector == 0)
    fwd = _tile(target, shape, ov, kg, cgf * taps, itemsize, fwd_tap, fwd_tap or fwd_mn, fwd_b, a_mn=fwd_mn)
    if fwd_mn and not fwd.a_mn:   # (never with today's sides: a tile of reduction rows needs 64 of them)
        fwd = _tile(target, shape, ov, kg, cgf * taps, itemsize, False, False, fwd_b)
    # data gradient: A = grad_output (rows input positions of a phase, reduction (filter, tap))
    dg_tap = _channels_last(y_strides) and aligned_k
    # (or, on ldmatrix, A along its pixels where each input position is its output position, as the
    # forward's fwd_mn: a contiguous NCHW grad_output, 1x1 taps at unit stride without padding; one
    # tap, so the reduction is filters alone, tap-major as the staged weight's B copies ask)
    dg_mn = (not dg_tap and on_ldmatrix(target, itemsize) and _pixels_are_outputs(normal)
             and _contiguous(y_strides, (normal.filters,) + tuple(normal.out_size)) and ov % vector == 0)
    dg_major = dg_tap or dg_mn
    # (and, on ldmatrix, B along its channels from the caller's weight where a filter's channels are
    # contiguous at every tap and whole 16-byte copies (a group's too, each tap's start aligned): a
    # channels-last weight, or any 1x1; its reduction rows (tap, filter) tap-major as A's, or one tap --
    # a 1x1 at any stride, padding or layout of the activations)
    dg_b_mn = not dgrad_b and (taps == 1 or dg_tap) and dgrad_weight_along_channels(normal, w_strides, target, itemsize)
    dgrad = _tile(target, shape, positions, cg, kg * tap_phase, itemsize, dg_major, dg_major,
                  (dg_major and dgrad_b) or dg_b_mn, a_mn=dg_mn, b_mn=dg_b_mn)
    # (never with today's sides, either: a tile of reduction rows needs 64 of them)
    if dg_b_mn and not dgrad.b_mn:
        dgrad = _tile(target, shape, positions, cg, kg * tap_phase, itemsize, dg_major, dg_major, dg_major and dgrad_b,
                      a_mn=dg_mn)
    if dg_mn and not dgrad.a_mn:
        dgrad = _tile(target, shape, positions, cg, kg * tap_phase, itemsize, False, False, False)
    # weight gradient: A = grad_output (rows filters, reduction (image, pixel)), B = input gathered
    # (or, both channels-last with whole vectors of filters and channels, on ldmatrix: A along filters and
    # B along channels, columns (tap, channel), by 16-byte copies into tiles of reduction rows: mn_major)
    # (and B too along its pixels where each input pixel is its output pixel's: a contiguous input, 1x1
    # taps at unit stride without padding)
    wg_a = _contiguous(wg_y_strides, (normal.filters,) + tuple(normal.out_size)) and ov % vector == 0
    wg_b = (wg_a and _pixels_are_outputs(normal)
            and _contiguous(wg_x_strides, (normal.channels,) + tuple(normal.in_size)))
    wg_mn = (swizzled_rows(target, itemsize) and _channels_last(wg_x_strides) and _channels_last(wg_y_strides)
             and aligned_c and aligned_k)
    wgrad = _tile(target, shape, kg, cg * taps, ov, itemsize, wg_mn, wg_a or wg_mn, wg_b or wg_mn, mn_major=wg_mn,
                  pixels=False)
    if wg_mn and not wgrad.mn_major:   # (never with today's sides: the tiles' shared rows need 64 elements)
        wgrad = _tile(target, shape, kg, cg * taps, ov, itemsize, False, wg_a, wg_b, pixels=False)
    return IgemmTiles(fwd, dgrad, wgrad, _reasons(target, shape, fwd, dgrad, wgrad, itemsize, fma, f64_matrix))


def _multiply(target: Target, shape: BlockTiles, itemsize: int, fma: bool, f64_matrix: bool) -> str:
    """How the warps multiply, in words."""
    side = shape.sides[-1]
    quarter, lanes = side // 2, target.gpu.warp_size
    unit = "warp" if target.kind is TargetKind.CUDA else "wave"
    if fma:
        return (f"on FMAs: each thread of a {lanes}-wide {unit} keeps {quarter * quarter // lanes} results in "
                f"registers ({quarter // (lanes // 8)} rows x 4 columns, strided over the quarter so a {unit}'s "
                f"shared-memory reads do not conflict), {itemsize}-byte operands, fused multiply-adds in "
                f"{'f64' if itemsize == 8 else 'f32'}; tiles {side} a side to keep those registers")
    if f64_matrix and target.kind is TargetKind.CUDA:
        return (f"on the f64 tensor cores (mma.sync m8n8k4 .f64, two per 16 x 8 x 4 step), f64 accumulation; tiles "
                f"{side} a side: a warp's {quarter} x {quarter} quarter is {quarter * quarter // lanes} f64 "
                f"accumulators ({2 * quarter * quarter // lanes} registers) a thread")
    packs = ("each lane's fragment one 16-byte ds_read_b128 holding its operands of a pack of MFMAs along the "
             "reduction, from shared rows " + ("swizzled" if itemsize == 2 else "padded by 16 bytes")
             + " (no bank conflicts)")
    if f64_matrix:
        return (f"on the matrix cores (v_mfma_f64_16x16x4f64, one 16 x 16 x 4 block each), f64 accumulation; tiles "
                f"{side} a side: a wave's {quarter} x {quarter} quarter is {quarter * quarter // lanes} f64 "
                f"accumulators ({2 * quarter * quarter // lanes} registers) a lane; {packs}")
    if on_wgmma(target, itemsize):
        return ("on sm_90a's warpgroup MMA (wgmma.mma_async m64nNk16, HGMMA), warp-specialised: the block is two "
                "warpgroups of 4 warps, a producer that fills the stages and a consumer whose every instruction "
                "multiplies a 64-row half of the tile by all of B, both operands read by the tensor cores from the "
                "shared stages through descriptors (the stages' XOR swizzle is wgmma's 128/64/32-byte one; tiles of "
                "reduction rows in its MN-major layout); a stage's full and empty mbarriers hand it from one to the "
                "other, no block barrier in the main loop, and one step's MMAs stay in flight while the consumer "
                "waits for the next stage")
    if on_ldmatrix(target, itemsize):
        return ("on the matrix instructions, each fragment one ldmatrix.x4 from unpadded shared rows whose 16-byte "
                "chunks are XOR-swizzled (no bank conflicts)")
    if target.kind is TargetKind.HIP:
        return f"on the matrix cores, {packs}"
    return "on the matrix instructions"


def _reasons(target: Target, shape: BlockTiles, fwd: GemmTile, dgrad: GemmTile, wgrad: GemmTile, itemsize: int,
             fma: bool, f64_matrix: bool) -> tuple[str, str]:
    """The tiles and the pipeline, in the tiling pass's words."""
    gpu, cuda = target.gpu, target.kind is TargetKind.CUDA
    specialised = cuda and on_wgmma(target, itemsize)   # (sm_90a: a producer and a consumer warpgroup)
    if specialised and gpu.async_copy:
        how = (f"up to {gpu.igemm.max_stages} stages of cp.async copies in flight, filled by the producer warpgroup "
               f"as the consumer frees them, within one block's {gpu.shared_bytes_per_block // 1024} KiB of shared "
               f"memory (one block an SM), no more stages than reduction steps")
    elif cuda and gpu.async_copy:
        how = (f"up to {gpu.igemm.max_stages} stages of cp.async copies in flight while two blocks fit an SM's "
               f"{gpu.shared_bytes_per_sm // 1024} KiB of shared memory, no more stages than reduction steps")
    else:
        how = "two LDS buffers, the next stage's copies staged in registers while the block computes on the other"
    unit = "warps" if cuda else "waves"
    big = gpu.igemm.matrix.sides[-1]
    return (f"block tiles ({WARPS} {unit} each, a {big} side where the GEMM has {big} along it, CUTLASS/CK-like; "
            f"{_multiply(target, shape, itemsize, fma, f64_matrix)}): "
            f"forward {fwd.describe(cuda)}; data gradient {dgrad.describe(cuda)}; weight gradient "
            f"{wgrad.describe(cuda)}",
            f"pipeline: {how}; " + ("a stage's data visible to the consumer once its full mbarrier's phase completes "
                                     "(every producer thread's copies landed)" if specialised else
                                     "data visible to the warps only after the copies' wait and a barrier"))
