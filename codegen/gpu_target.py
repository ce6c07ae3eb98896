"""GPU architectures: what the passes need to know about a CUDA or HIP target, as data.

`GpuArch` is a frozen description of one arch (warp size, shared memory, registers, SM count,
matrix instruction, async copies); `GPU_ARCHS` lists the supported ones; `gpu_target()` builds the
`Target` for one and `parse_gpu_arch()` checks a command-line spelling against the list. The SM
count and memory sizes are those of the arch's reference part (named in `part`); the runtime may
later replace them with the present device's. Nothing here reads the machine.
"""

from __future__ import annotations

import dataclasses


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
class GpuArch:
    """A GPU architecture as the passes see it.

    vendor: "cuda" or "hip"; arch: "sm_80", "gfx90a", ...; part: the reference part whose sizes
    these are. warp_size: lanes per warp (wave). shared_bytes_per_block: the most shared memory
    (LDS) one block may use (with CUDA's opt-in); shared_bytes_per_sm: per SM (CU).
    registers_per_thread: the most 32-bit registers one thread may use; registers_per_sm: per
    SM (CU). max_threads_per_block. sm_count: SMs (CUs) of the reference part. matrix: the
    dense matrix instruction, or None. async_copy: global-to-shared copies that bypass registers
    (cp.async on sm_80+). tma: sm_90's tensor memory accelerator; wgmma: sm_90a's warpgroup MMA.
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
    tma: bool = False
    wgmma: bool = False


_MMA = MatrixInstruction("mma.sync.aligned.m16n8k16", 16, 8, 16, ("f16", "bf16"))
# the MFMA shape the implicit-GEMM kernel uses (hip.h): gfx90a spells it v_mfma_f32_16x16x16bf16_1k
# (and _16x16x16f16), gfx940 v_mfma_f32_16x16x16_bf16
_MFMA_GFX90A = MatrixInstruction("v_mfma_f32_16x16x16bf16_1k", 16, 16, 16, ("f16", "bf16"))
_MFMA_GFX940 = MatrixInstruction("v_mfma_f32_16x16x16_bf16", 16, 16, 16, ("f16", "bf16"))


def _cuda(arch: str, part: str, smem_block: int, smem_sm: int, sms: int, **extra) -> GpuArch:
    return GpuArch("cuda", arch, part, 32, smem_block, smem_sm, 255, 65536, 1024, sms, _MMA, True, **extra)


def _hip(arch: str, part: str, cus: int, mfma: MatrixInstruction) -> GpuArch:
    # CDNA2/3: 64 KiB LDS per CU and per workgroup; 512 VGPRs per lane (256 arch + 256 acc);
    # 4 SIMDs x 512 VGPRs x 64 lanes per CU. No async global-to-LDS copy in the wrappers yet.
    return GpuArch("hip", arch, part, 64, 65536, 65536, 512, 4 * 512 * 64, 1024, cus, mfma, False)


GPU_ARCHS: dict[str, GpuArch] = {a.arch: a for a in (
    _cuda("sm_80", "A100 SXM", 166912, 167936, 108),
    _cuda("sm_86", "RTX 3090", 101376, 102400, 82),
    _cuda("sm_89", "L40S", 101376, 102400, 142),
    _cuda("sm_90", "H100 SXM", 232448, 233472, 132, tma=True),
    _cuda("sm_90a", "H100 SXM", 232448, 233472, 132, tma=True, wgmma=True),
    _hip("gfx90a", "MI250X (one die)", 110, _MFMA_GFX90A),
    _hip("gfx940", "MI300A", 228, _MFMA_GFX940),
)}

DEFAULT_ARCH = {"cuda": "sm_90", "hip": "gfx90a"}

# Archs people ask for that convgen does not build, and why (named in the error).
_WHY_NOT = {
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
    from .errors import ConvSpecError

    arch = arch or DEFAULT_ARCH[vendor]
    found = GPU_ARCHS.get(arch)
    if found is None or found.vendor != vendor:
        why = _WHY_NOT.get(arch, "not a supported arch")
        raise ConvSpecError(f"target {text!r}: {vendor} arch {arch!r} is not supported ({why}); supported: "
                            f"{', '.join([vendor] + supported(vendor))}")
    return found
