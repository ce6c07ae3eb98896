"""GPU targets (codegen/arch/gpu.py, codegen/target.py): spellings, facts the passes read,
clear errors for unsupported archs, and CPU keys that did not move."""

from __future__ import annotations

import pytest

from convgen.codegen.errors import ConvSpecError
from convgen.codegen.target import TargetKind, cpu_target, parse_target

# (spelling, name, warp size, matrix instruction's m, n, k, async copy)
GPU_SPELLINGS = [
    ("cuda", "cuda-sm_90", 32, (16, 8, 16), True),
    ("cuda-sm_80", "cuda-sm_80", 32, (16, 8, 16), True),
    ("cuda-sm_86", "cuda-sm_86", 32, (16, 8, 16), True),
    ("cuda-sm_89", "cuda-sm_89", 32, (16, 8, 16), True),
    ("cuda-sm_90", "cuda-sm_90", 32, (16, 8, 16), True),
    ("cuda-sm_90a", "cuda-sm_90a", 32, (16, 8, 16), True),
    ("hip", "hip-gfx90a", 64, (16, 16, 16), False),
    ("hip-gfx90a", "hip-gfx90a", 64, (16, 16, 16), False),
    ("hip-gfx940", "hip-gfx940", 64, (16, 16, 16), False),
]
# what the implicit-GEMM kernel's wrappers (templates/gpu/hip.h) issue, as each arch's assembler spells it
MFMA_NAMES = {"hip-gfx90a": "v_mfma_f32_16x16x16bf16_1k", "hip-gfx940": "v_mfma_f32_16x16x16_bf16"}


@pytest.mark.parametrize("text,name,warp,mnk,async_copy", GPU_SPELLINGS)
def test_gpu_spellings_give_the_arch_facts(text, name, warp, mnk, async_copy):
    t = parse_target(text)
    assert t.kind is (TargetKind.CUDA if text.startswith("cuda") else TargetKind.HIP)
    assert t.name() == name and t.warp_size == warp == t.gpu.warp_size
    m = t.gpu.matrix
    assert (m.m, m.n, m.k) == mnk and "bf16" in m.inputs and m.accumulate == "f32"
    assert t.gpu.async_copy is async_copy
    assert 0 < t.gpu.shared_bytes_per_block <= t.gpu.shared_bytes_per_sm
    assert t.gpu.registers_per_thread in (255, 512) and t.gpu.sm_count > 0
    assert t == parse_target(name) and t.key() == parse_target(name).key()


@pytest.mark.parametrize("name", sorted(MFMA_NAMES))
def test_hip_matrix_instruction_is_the_kernels(name):
    from convgen.codegen.gpu.wrappers import vendor_wrappers

    t = parse_target(name)
    assert t.gpu.matrix.name == MFMA_NAMES[name]
    assert "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k" in vendor_wrappers("hip")


def test_gpu_keys_differ_per_arch():
    keys = {parse_target(name).key() for _, name, *_ in GPU_SPELLINGS}
    assert len(keys) == len({name for _, name, *_ in GPU_SPELLINGS})


def test_only_sm_90a_has_wgmma_and_sm_90_tma():
    assert parse_target("cuda-sm_90a").gpu.wgmma and not parse_target("cuda-sm_90").gpu.wgmma
    assert parse_target("cuda-sm_90").gpu.tma and not parse_target("cuda-sm_80").gpu.tma


@pytest.mark.parametrize("text,value,why", [
    ("cuda-sm_70", "sm_70", "sm_80+"),
    ("hip-gfx942", "gfx942", "ROCm 5.2"),
    ("hip-gfx1100", "gfx1100", "32-wide waves"),
    ("cuda-gfx90a", "gfx90a", "not a supported arch"),
    ("hip-sm_80", "sm_80", "not a supported arch"),
])
def test_unsupported_archs_are_named_with_the_supported_list(text, value, why):
    with pytest.raises(ConvSpecError) as e:
        parse_target(text)
    message = str(e.value)
    assert repr(text) in message and repr(value) in message and why in message
    vendor = text.split("-")[0]
    assert ("cuda-sm_80" in message and "cuda-sm_90a" in message) if vendor == "cuda" else \
           ("hip-gfx90a" in message and "hip-gfx940" in message)


def test_cpu_target_keys_are_those_from_before_gpu_targets():
    # pinned: the committed generated/resnet18 manifest and every cache entry depend on them
    assert cpu_target("avx2", 32768, 524288).key() == "7ff1de1cec863ccf30414c0d2d504e6422b03da63f7fce71a3a6ae4a7c0bf64e"
    assert cpu_target("generic").key() == "6ecbd9db90e2d1383443d07610973151438ec20030c26cd0e550e1bfa9cc0644"
    assert cpu_target("avx2").gpu is None and cpu_target("avx2").warp_size == 1
