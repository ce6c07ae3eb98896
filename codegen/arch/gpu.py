"""GPU architectures as data: everything convgen knows of a CUDA or HIP arch, in one table.

`GPU_ARCHS` holds one `GpuArch` per supported arch: its sizes (warp, shared memory, registers, SM
count of its reference part, named in `part`), its matrix instruction and async copies, the
occupancy limits `explain` computes with (`Occupancy`), the datasheet peaks of its reference part
(`Peaks`, None where there are no figures) and the implicit-GEMM kernel's tile configuration
(`IgemmTiling`: the block sides it chooses among per dtype class and its pipeline's stage cap;
codegen/gpu/igemm_tiles.py makes the per-problem choice from them). A new arch is one entry here;
changing an arch's tiles is its `igemm=` argument. `parse_gpu_arch()` checks a command-line spelling
against the table. The runtime may later replace an entry's sizes with the present device's;
nothing here reads the machine, and nothing here imports the rest of the compiler but its errors.

Peak figures are the vendors' datasheet numbers for the reference part of each arch (dense, no
sparsity), in TFLOP/s and TB/s:
- A100 SXM (sm_80): NVIDIA A100 Tensor Core GPU datasheet: bf16/f16 tensor 312, tf32 156, f32 19.5,
  f64 9.7 (f64 tensor 19.5), HBM2e 2.039 TB/s (80 GB).
- H100 SXM (sm_90, sm_90a): NVIDIA H100 Tensor Core GPU datasheet: bf16/f16 tensor 989, tf32 495,
  f32 67, f64 34 (f64 tensor 67), HBM3 3.35 TB/s.
- MI250X (gfx90a): AMD Instinct MI250X datasheet gives the two-die OAM: bf16/f16 matrix 383, f32
  matrix 95.7, f32 vector 47.9, f64 vector 47.9, HBM2e 3.2768 TB/s; convgen's gfx90a target is one
  die (110 CUs), so half of each.
- MI300A (gfx940): AMD Instinct MI300A datasheet: bf16/f16 matrix 980.6, tf32 490.3, f32 vector
  122.6, f32 matrix 122.6, f64 vector 61.3, HBM3 5.3 TB/s.
Other archs (sm_86, sm_89) have no figures here; explain says so.
"""

from __future__ import annotations

import dataclasses

from ..errors import ConvSpecError


@dataclasses.dataclass(frozen=True)
class MatrixInstruction:
    """One warp-level matrix multiply-accumulate: D(m x n, accumulate) += A(m x k) B(k x n).

    name: the instruction (`mma.sync.aligned.m16n8k16` on CUDA, `v_mfma_f32_16x16x16bf16_1k` ...).
    inputs: the operand dtypes it takes ("f16", "bf16"); accumulate: the accumulator dtype.
    """

    name: str
    m: int
    n: int
    k: int
    inputs: tuple[str, ...]
    accumulate: str = "f32"


@dataclasses.dataclass(frozen=True)
class Peaks:
    """Datasheet peaks of an arch's reference part (TFLOP/s, TB/s) and where they come from."""

    matrix16: float     # bf16/f16 on tensor (matrix) cores, f32 accumulation, dense
    tf32: float
    f32: float          # CUDA cores / vector ALUs
    f64: float
    memory: float       # HBM, TB/s
    source: str
    matrix32: float = 0.0   # true f32 on matrix cores (AMD's v_mfma_f32_*; none on NVIDIA)
    matrix64: float = 0.0   # f64 on tensor (matrix) cores: NVIDIA's DMMA, AMD's v_mfma_f64_*
    # dense bf16/f16 multiply-adds one SM's tensor cores do a clock (the other units' in proportion
    # to their peaks); 0 where not given. What `explain` weighs a main loop's issue rate against.
    sm_matrix16_macs: int = 0


@dataclasses.dataclass(frozen=True)
class Occupancy:
    """Threads, warps and shared-memory limits per SM (CU) that decide how many blocks are resident."""

    threads_per_sm: int
    blocks_per_sm: int
    register_unit: int        # registers allocated per warp in units of this many (CUDA); VGPR granule (HIP)
    shared_reserved: int      # bytes the runtime reserves per block (CUDA sm_80+: 1 KiB)


@dataclasses.dataclass(frozen=True)
class BlockTiles:
    """The implicit GEMM's block tiles for one class of operands: the sides a GEMM's rows and
    columns choose among (smallest first; a side takes the largest the GEMM has that many of along
    it) and the reduction step's depth (BLOCK_K)."""

    sides: tuple[int, ...]
    depth: int


@dataclasses.dataclass(frozen=True)
class IgemmTiling:
    """The implicit-GEMM kernel's tile configuration on an arch, per dtype class.

    matrix: 2- and 4-byte operands on matrix instructions (bf16/f16, tf32, HIP's f32).
    fma: f32 on the vector units (CUDA f32 without tf32): a lane's register tile of the warp's
      quarter must fit its registers.
    f64: 8-byte operands (matrix instructions or FMAs).
    max_stages: the most shared-memory stages in flight where copies are asynchronous (cp.async).
    """

    matrix: BlockTiles
    fma: BlockTiles
    f64: BlockTiles
    max_stages: int


@dataclasses.dataclass(frozen=True)
class GpuArch:
    """A GPU architecture as the passes see it.

    vendor: "cuda" or "hip"; arch: "sm_80", "gfx90a", ...; part: the reference part whose sizes
    these are. warp_size: lanes per warp (wave). shared_bytes_per_block: the most shared memory
    (LDS) one block may use (with CUDA's opt-in); shared_bytes_per_sm: per SM (CU).
    registers_per_thread: the most 32-bit registers one thread may use; registers_per_sm: per
    SM (CU). max_threads_per_block. sm_count: SMs (CUs) of the reference part. matrix: the
    dense matrix instruction, or None. async_copy: global-to-shared copies that bypass registers
    (cp.async on sm_80+). occupancy: the resident-block limits. igemm: the implicit GEMM's tiles.
    peaks: the reference part's datasheet peaks, or None. tma: sm_90's tensor memory accelerator;
    wgmma: sm_90a's warpgroup MMA. ldmatrix: the warp's 8x8 16-bit matrix loads from shared memory
    (`ldmatrix`, sm_75+), which the implicit GEMM's 16-bit fragments come from.
    """

    vendor: str
    arch: str
    part: str
    warp_size: int
    shared_bytes_per_block: int
    shared_bytes_per_sm: int
    registers_per_thread: int
    registers_per_sm: int
    max_threads_per_block: int
    sm_count: int
    matrix: MatrixInstruction | None
    async_copy: bool
    occupancy: Occupancy
    igemm: IgemmTiling
    peaks: Peaks | None = None
    tma: bool = False
    wgmma: bool = False
    ldmatrix: bool = False


_MMA = MatrixInstruction("mma.sync.aligned.m16n8k16", 16, 8, 16, ("f16", "bf16"))
# the MFMA shape the implicit-GEMM kernel uses (hip.h): gfx90a spells it v_mfma_f32_16x16x16bf16_1k
# (and _16x16x16f16), gfx940 v_mfma_f32_16x16x16_bf16
_MFMA_GFX90A = MatrixInstruction("v_mfma_f32_16x16x16bf16_1k", 16, 16, 16, ("f16", "bf16"))
_MFMA_GFX940 = MatrixInstruction("v_mfma_f32_16x16x16_bf16", 16, 16, 16, ("f16", "bf16"))

# A100: 4 tensor cores an SM, 256 dense f16 multiply-adds each a clock (A100 whitepaper); H100 twice
# A100's per SM and clock (H100 whitepaper): 132 SMs x 2048 x 2 x 1.83 GHz = its 989 TFLOP/s.
_A100 = Peaks(312, 156, 19.5, 9.7, 2.039, "NVIDIA A100 datasheet (SXM, 80 GB)", matrix64=19.5, sm_matrix16_macs=1024)
_H100 = Peaks(989, 495, 67, 34, 3.35, "NVIDIA H100 datasheet (SXM)", matrix64=67, sm_matrix16_macs=2048)
_MI250X_DIE = Peaks(191.5, 47.85, 23.95, 23.95, 1.638, "AMD Instinct MI250X datasheet, one of its two dies", 47.85,
                    matrix64=47.85)
_MI300A = Peaks(980.6, 490.3, 122.6, 61.3, 5.3, "AMD Instinct MI300A datasheet", 122.6, matrix64=122.6)

# CDNA: 4 SIMDs per CU, at most 8 waves per SIMD, 512 VGPRs (arch + acc) per lane, granule 8
_CDNA_OCCUPANCY = Occupancy(4 * 8 * 64, 32, 8, 0)

# CUTLASS's sm_80 conv instances and CK's xdl instances centre on 128x128 (and 128x64, 64x64 for
# small GEMMs) with 4 warps; 256-wide sides would need 8 warps a block. A 96 side serves filters and
# channels of 96 (192, 288): one tile where 64-wide ones would compute a third more, with warp tiles of
# 48 (igemm_tiles.py says where a kernel cannot take it). FMA and f64 tiles stay 64 a
# side (a lane's accumulators must fit its registers); f64 steps 16 deep, so that two stages of two
# 64-row tiles fit HIP's 64 KiB of LDS. CUTLASS's sm_80 instances use 3-6 stages.
IGEMM_TILES = IgemmTiling(matrix=BlockTiles((64, 96, 128), 32), fma=BlockTiles((64,), 32), f64=BlockTiles((64,), 16),
                          max_stages=6)


def _cuda(arch: str, part: str, smem_block: int, smem_sm: int, sms: int, threads_per_sm: int, blocks_per_sm: int,
          **extra) -> GpuArch:
    return GpuArch("cuda", arch, part, 32, smem_block, smem_sm, 255, 65536, 1024, sms, _MMA, True,
                   Occupancy(threads_per_sm, blocks_per_sm, 256, 1024), ldmatrix=True, **extra)


def _hip(arch: str, part: str, cus: int, mfma: MatrixInstruction, **extra) -> GpuArch:
    # CDNA2/3: 64 KiB LDS per CU and per workgroup; 512 VGPRs per lane (256 arch + 256 acc);
    # 4 SIMDs x 512 VGPRs x 64 lanes per CU. No async global-to-LDS copy in the wrappers yet.
    return GpuArch("hip", arch, part, 64, 65536, 65536, 512, 4 * 512 * 64, 1024, cus, mfma, False, _CDNA_OCCUPANCY,
                   **extra)


# arch, part, shared bytes per block and per SM, SMs, threads and blocks per SM; the tiles; the peaks.
# An arch's own tiles are one argument, e.g. igemm=dataclasses.replace(IGEMM_TILES, max_stages=4).
GPU_ARCHS: dict[str, GpuArch] = {a.arch: a for a in (
    _cuda("sm_80", "A100 SXM", 166912, 167936, 108, 2048, 32, igemm=IGEMM_TILES, peaks=_A100),
    _cuda("sm_86", "RTX 3090", 101376, 102400, 82, 1536, 16, igemm=IGEMM_TILES),
    _cuda("sm_89", "L40S", 101376, 102400, 142, 1536, 24, igemm=IGEMM_TILES),
    _cuda("sm_90", "H100 SXM", 232448, 233472, 132, 2048, 32, igemm=IGEMM_TILES, peaks=_H100, tma=True),
    _cuda("sm_90a", "H100 SXM", 232448, 233472, 132, 2048, 32, igemm=IGEMM_TILES, peaks=_H100, tma=True,
          wgmma=True),
    _hip("gfx90a", "MI250X (one die)", 110, _MFMA_GFX90A, igemm=IGEMM_TILES, peaks=_MI250X_DIE),
    _hip("gfx940", "MI300A", 228, _MFMA_GFX940, igemm=IGEMM_TILES, peaks=_MI300A),
)}

DEFAULT_ARCH = {"cuda": "sm_90", "hip": "gfx90a"}

# The arch whose kernels serve a device of arch X when nobody chose one (CONVGEN_GPU_ARCH, --target
# cuda-ARCH): its own, except where an arch-specific sibling measured faster on it. sm_90a's
# warpgroup-MMA kernels on an H200, against sm_90's mma.sync ones (`convgen bench --suite all --dtype
# bf16 --layout channels_last --batch 64`, one run each, BENCHMARKS.md 2026-12-04 (fifth)): standard
# forward 1.05x torch against 0.84x, backward 0.50x against 0.46x, faster on 8 of 9 forwards and 8 of 9
# backwards. sm_90a code runs on compute capability 9.0 only, which is where this applies.
DEVICE_DEFAULT = {"sm_90": "sm_90a"}


def device_default(arch: str) -> str:
    """The arch whose kernels serve a device whose own arch is `arch`, unless one is chosen."""
    return DEVICE_DEFAULT.get(arch, arch)

# Archs people ask for that convgen does not build, and why (named in the error).
WHY_NOT = {
    "gfx942": "ROCm 5.2's hipcc cannot build it; use hip-gfx940",
    "gfx1100": "RDNA3 has 32-wide waves and no MFMA; convgen's HIP kernels target CDNA (gfx90a, gfx940)",
    "sm_70": "convgen's CUDA kernels need sm_80+ (mma.sync m16n8k16 bf16, cp.async)",
    "sm_75": "convgen's CUDA kernels need sm_80+ (mma.sync m16n8k16 bf16, cp.async)",
}


def supported(vendor: str) -> list[str]:
    return [f"{vendor}-{a.arch}" for a in GPU_ARCHS.values() if a.vendor == vendor]


def parse_gpu_arch(text: str, vendor: str, arch: str) -> GpuArch:
    """The GpuArch for `vendor`'s `arch` ("" for the default); ConvSpecError naming the target,
    the value and the supported list otherwise."""
    arch = arch or DEFAULT_ARCH[vendor]
    found = GPU_ARCHS.get(arch)
    if found is None or found.vendor != vendor:
        why = WHY_NOT.get(arch, "not a supported arch")
        raise ConvSpecError(f"target {text!r}: {vendor} arch {arch!r} is not supported ({why}); supported: "
                            f"{', '.join([vendor] + supported(vendor))}")
    return found
