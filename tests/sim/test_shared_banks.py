"""The 16-bit implicit GEMM on CUDA reads its fragments without shared-memory bank conflicts (issue 47):
each fragment is one ldmatrix.x4 from unpadded shared rows whose 16-byte chunks are XOR-swizzled
(templates/gpu/igemm.cu.j2's tile_at, cuda.h's convgen_mma_load_a_x4 / _b2_x4), and the channels-last
weight gradient's, the NCHW 1x1's A and the 1x1 data gradient's weight from tiles of reduction rows
whose chunks are swizzled too (tile_mn, convgen_mma_load_a_x4_trans / _b2_x4_trans).

The kernels run in the simulator with its profile on (templates/gpu/sim/checks.h: a warp's shared
request takes as many wavefronts as the most distinct 4-byte words one bank serves in a phase of
32, 16 or 8 lanes; ideal: one per phase). bf16 and f16, the forward, the data gradient with stride
1 and 2 (every stride phase's launch) and the weight gradient: every GEMM launch's shared wavefronts
are its ideal. The problems move their operands by 16-byte copies or by element stores along the
reduction, both conflict-free, so the launch's totals are the main loop's: the ldmatrix rows, the
copies and stores. (The one element path left out, activations whose rows are contiguous in memory
-- NCHW input or grad_output gathered -- stores 32 rows at one k and conflicts 4 ways, padded or
swizzled: its copies are issue 47's third deliverable.)

The same kernels with the swizzles taken out of tile_at and tile_mn (the layouts stay consistent,
only unpadded and unswizzled) conflict in every GEMM launch: the ldmatrix phases' 8 rows, 64 (or
128, 256) bytes apart, fall on 4 bank groups or fewer. So the test sees the fragment loads.

On HIP (gfx90a) every dtype's fragment is one 16-byte read a lane (hip.h's packs of MFMAs): the
16-bit tiles swizzle their rows as above, the f32 and f64 ones pad theirs by 16 bytes; the
channels-last cases' every launch is ideal there too, and conflicts without the swizzle or the
padding.
"""

from __future__ import annotations

import ctypes
import re

import pytest
import torch

from convgen.building import sim_build
from convgen.codegen.gpu.igemm import igemm_context, render_igemm
from convgen.codegen.ir import DType, Layout
from convgen.codegen.target import parse_target
from convgen.devices import sim

from support.problems import conv_problem
from support.reference import generator_for, in_layout, randn

pytestmark = pytest.mark.skipif(sim_build.fp16_include_dir() is None,
                                reason="NVIDIA's cuda_fp16.h/cuda_bf16.h (CUDA toolkit) not found: bf16 kernels need them")

TARGET = parse_target("cuda-sm_90")
DTYPES = {"bf16": (DType.BF16, torch.bfloat16), "f16": (DType.F16, torch.float16)}
# HIP (gfx90a): every dtype's fragments are 16-byte reads (hip.h's packs), 16-bit rows swizzled, 4- and
# 8-byte rows padded by 16 bytes; the channels-last cases' GEMMs (the 16-bit weight gradient's copies
# along filters and channels land transposed, a phase of lanes over 32 reduction rows)
HIP = parse_target("hip-gfx90a")
HIP_DTYPES = {"bf16": (DType.BF16, torch.bfloat16), "f32": (DType.F32, torch.float32), "f64": (DType.F64, torch.float64)}
HIP_CASES = ("cl_s1", "cl_s2")
GEMMS = {"FWD": "fwd", "DGRAD": "bwd_data", "WGRAD": "bwd_weight_partial"}
# name: (batch, C, K, size, stride, layout, staged, the GEMMs checked)
CASES = {
    # channels-last, channels in whole 16-byte copies: the forward's and the data gradient's operands
    # by copies (the data gradient's weight from its filters-innermost copy, staged "W"); the weight
    # gradient's along filters and channels into tiles of reduction rows (mn_major)
    "cl_s1": (2, 16, 24, (6, 6), 1, Layout.CHANNELS_LAST, ("W",), ("FWD", "DGRAD", "WGRAD")),
    "cl_s2": (2, 16, 16, (7, 7), 2, Layout.CHANNELS_LAST, ("W",), ("FWD", "DGRAD", "WGRAD")),   # 4 stride phases
    # NCHW grad_output along 64 pixels: the weight gradient's A by copies
    "nchw": (2, 8, 16, (8, 8), 1, Layout.CONTIGUOUS, (), ("WGRAD",)),
    # NCHW 1x1: the forward's input and the data gradient's grad_output along their 64 pixels into tiles
    # of reduction rows (a_mn), the data gradient's weight along its channels (b_mn)
    "nchw_1x1": (2, 16, 24, (8, 8), 1, Layout.CONTIGUOUS, (), ("FWD", "DGRAD")),
    # channels-last 1x1: the data gradient's weight along its channels (b_mn) beside grad_output along
    # the reduction
    "cl_1x1": (2, 16, 24, (6, 6), 1, Layout.CHANNELS_LAST, (), ("DGRAD",)),
}
SWIZZLE = r"const unsigned chunk = \(unsigned\)k / VECTOR \^ \(unsigned\)row / SWIZZLE_ROWS % SWIZZLE_CHUNKS;"
SWIZZLE_MN = r"swizzle = \(j & 1\) << 2 \| \(j & 2\) \| j >> 2;"


def _problem(name: str, dtype: str):
    n, c, k, size, stride, layout, _, _ = CASES[name]
    kernel, padding = (1, 0) if name.endswith("_1x1") else (3, 1)
    return conv_problem(n, c, k, size, kernel, stride, padding, dtype={**HIP_DTYPES, **DTYPES}[dtype][0], layout=layout,
                        bias=True).validate()


def _prefix(name: str, dtype: str) -> str:
    return f"banks_{name}_{dtype}"


def _source(unswizzled: bool = False) -> str:
    text = "".join(render_igemm(_problem(name, dtype), TARGET, _prefix(name, dtype), staged=CASES[name][6])
                   for name in CASES for dtype in DTYPES)
    if unswizzled:
        text, count = re.subn(SWIZZLE, "const unsigned chunk = (unsigned)k / VECTOR;", text)
        assert count == len(CASES) * len(DTYPES), "tile_at's swizzle is no longer where this test takes it out"
        text, count = re.subn(SWIZZLE_MN, "swizzle = 0;", text)
        assert count == len(CASES) * len(DTYPES), "tile_mn's swizzle is no longer where this test takes it out"
    return text


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("shared_banks")
    return {False: sim.build(_source(), d, "banks", "cuda"), True: sim.build(_source(True), d, "banks_unswizzled", "cuda")}


def _launches(lib, name: str, dtype: str) -> dict[str, list[dict]]:
    """Every pass of the case, profiled: the launches of each GEMM kernel."""
    problem, torch_dtype = _problem(name, dtype), {**HIP_DTYPES, **DTYPES}[dtype][1]
    g = generator_for(f"banks-{name}-{dtype}")
    p, n = sim.pointer, ctypes.c_longlong(problem.n)
    x = in_layout(randn(problem.input_shape, torch_dtype, g), problem.input_layout)
    w = in_layout(randn(problem.weight_shape, torch_dtype, g), problem.weight_layout)
    dy = in_layout(randn(problem.output_shape, torch_dtype, g), problem.output_layout)
    b = randn((problem.k,), torch_dtype, g)
    y, dx, dw = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w)
    prefix = _prefix(name, dtype)

    def workspace(entry):
        sizes = getattr(lib.lib, f"{prefix}_{entry}_workspace_bytes", None)
        if sizes is None:
            return ()
        sizes.restype = ctypes.c_ulonglong
        return (torch.empty(max(1, sizes(n) // 4), dtype=torch.float32),)

    spaces = {entry: workspace(entry) for entry in ("fwd", "bwd_data", "bwd_weight")}
    launches = []
    launches += lib.call(f"{prefix}_fwd", p(x), p(w), p(b), p(y), *map(p, spaces["fwd"]), n, None, profile=True)
    launches += lib.call(f"{prefix}_bwd_data", p(dy), p(w), p(dx), *map(p, spaces["bwd_data"]), n, None, profile=True)
    launches += lib.call(f"{prefix}_bwd_weight", p(dy), p(x), p(dw), *map(p, spaces["bwd_weight"]), n, None,
                         profile=True)
    return {gemm: [launch for launch in launches if launch["kernel"] == kernel] for gemm, kernel in GEMMS.items()}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(CASES))
def test_every_gemm_launch_reads_and_writes_shared_memory_without_bank_conflicts(libs, name, dtype):
    problem = _problem(name, dtype)
    context = igemm_context(problem, TARGET, "p", staged=CASES[name][6])
    assert context.ldmatrix and context.lds == context.block_k   # unpadded, swizzled rows
    tiles = dict(context.tiles)
    layout_cl = CASES[name][5] is Layout.CHANNELS_LAST
    launches = _launches(libs[False], name, dtype)
    assert len(launches["DGRAD"]) == (4 if name == "cl_s2" else 1)   # a launch per stride phase
    for gemm in CASES[name][7]:
        # the case is about what it says: copies where rows are contiguous in memory, and the
        # channels-last weight gradient's along filters and channels
        assert tiles[gemm].mn_major == (gemm == "WGRAD" and layout_cl), (gemm, tiles[gemm])
        assert tiles[gemm].a_mn == (gemm != "WGRAD" and name == "nchw_1x1"), (gemm, tiles[gemm])
        assert tiles[gemm].b_mn == (gemm == "DGRAD" and name.endswith("_1x1")), (gemm, tiles[gemm])
        assert tiles[gemm].vector_a == (gemm != "WGRAD" or name == "nchw" or layout_cl), (gemm, tiles[gemm])
        assert tiles[gemm].vector_b == (gemm != "WGRAD" or layout_cl), (gemm, tiles[gemm])
        assert launches[gemm], gemm
        for launch in launches[gemm]:
            assert launch["tensor_instructions"] > 0 and launch["shared_requests"] > 0, launch
            assert launch["shared_wavefronts"] == launch["shared_ideal"], (gemm, launch)


ELEMENT_STORES = r"(constexpr int \w+_OUT_ALONG = )[12];"   # every GEMM's epilogue element by element


@pytest.fixture(scope="module")
def element_lib(tmp_path_factory):
    text, count = re.subn(ELEMENT_STORES, r"\g<1>0;", _source())
    assert count, "the epilogues' OUT_ALONG is no longer where this test takes it out"
    return sim.build(text, tmp_path_factory.mktemp("element_stores"), "banks_elements", "cuda")


def test_every_gemm_launch_stores_whole_sectors(libs, element_lib):
    """The epilogue (issue 47): each GEMM's results staged in shared memory, then stored 16 bytes a
    thread along the output's contiguous direction, consecutive threads consecutive chunks -- every
    store request of every GEMM launch writes whole 32-byte sectors (the weight gradient's f32
    partials too), where the element-by-element epilogue wrote a quarter (16-bit, channels-last) or
    half of each sector it touched, in as many requests or more (up to four times)."""
    for name in CASES:
        context = igemm_context(_problem(name, "bf16"), TARGET, "p", staged=CASES[name][6])
        assert all(along for _, along in context.out_along), (name, context.out_along)
        staged, elements = _launches(libs[False], name, "bf16"), _launches(element_lib, name, "bf16")
        for gemm in GEMMS:
            for launch, plain in zip(staged[gemm], elements[gemm], strict=True):
                assert launch["bytes_written"] == plain["bytes_written"] > 0, (name, gemm)
                assert launch["store_sectors"] * 32 == launch["bytes_written"], (name, gemm, launch)
                assert plain["store_sectors"] * 32 >= 2 * plain["bytes_written"], (name, gemm, plain)
                assert plain["store_requests"] >= launch["store_requests"], (name, gemm)


def test_without_the_swizzle_the_fragment_loads_conflict(libs):
    """tile_at without its XOR: the copies and stores still are conflict-free (a phase of 8 copies
    covers two whole 64-byte rows), the ldmatrix rows are not; tile_mn without its permutation
    likewise (nchw_1x1's forward and data gradient, whose A is one, and whose B is one in the data
    gradient, as cl_1x1's)."""
    for name, dtype in (("cl_s1", "bf16"), ("nchw", "f16"), ("nchw_1x1", "bf16"), ("cl_1x1", "f16")):
        launches = _launches(libs[True], name, dtype)
        for gemm in CASES[name][7]:
            for launch in launches[gemm]:
                assert launch["shared_wavefronts"] > launch["shared_ideal"], (name, dtype, gemm, launch)


# ----------------------------------------------------------------------- HIP (gfx90a)

def _hip_source(mutation: str = "") -> str:
    text = "".join(render_igemm(_problem(name, dtype), HIP, _prefix(name, dtype), staged=CASES[name][6])
                   for name in HIP_CASES for dtype in HIP_DTYPES)
    if mutation == "unswizzled":   # the 16-bit rows without their swizzle (unpadded: 64 bytes)
        text, count = re.subn(SWIZZLE, "const unsigned chunk = (unsigned)k / VECTOR;", text)
        assert count == len(HIP_CASES), "tile_at's swizzle is no longer where this test takes it out"
    elif mutation == "unpadded":   # the 4- and 8-byte rows without their 16 bytes of padding
        text, count = re.subn(r"constexpr int LDS = \d+;(?=   // BLOCK_K \+ 16 bytes of padding)",
                              "constexpr int LDS = BLOCK_K;", text)
        assert count == 2 * len(HIP_CASES), "the padded rows' LDS is no longer where this test takes it out"
    return text


@pytest.fixture(scope="module")
def hip_libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("shared_banks_hip")
    return {m: sim.build(_hip_source(m), d, f"banks_hip{m}", "hip") for m in ("", "unswizzled", "unpadded")}


@pytest.mark.parametrize("dtype", list(HIP_DTYPES))
@pytest.mark.parametrize("name", HIP_CASES)
def test_hip_gemm_launches_read_fragments_and_write_copies_without_bank_conflicts(hip_libs, name, dtype):
    """HIP's fragment loads (a ds_read_b128 a lane: 8 lanes a phase read 8 rows at one chunk) and
    staged copies (ds_write_b128: a phase writes 2 rows of 4 chunks, or one of 8): ideal in every
    launch of the forward, the data gradient (each stride phase) and the weight gradient."""
    context = igemm_context(_problem(name, dtype), HIP, "p", staged=CASES[name][6])
    assert not context.ldmatrix and context.swizzled == (dtype == "bf16")
    assert context.lds == context.block_k + (0 if dtype == "bf16" else 16 // {"f32": 4, "f64": 8}[dtype])
    launches = _launches(hip_libs[""], name, dtype)
    for gemm in ("FWD", "DGRAD", "WGRAD"):
        assert launches[gemm], gemm
        for launch in launches[gemm]:
            assert launch["tensor_instructions"] > 0 and launch["shared_requests"] > 0, launch
            assert launch["shared_wavefronts"] == launch["shared_ideal"], (gemm, launch)
            if dict(context.out_along)[gemm]:   # the epilogue's stores: whole sectors
                assert launch["store_sectors"] * 32 == launch["bytes_written"] > 0, (gemm, launch)


def test_hip_without_the_swizzle_or_the_padding_the_fragment_reads_conflict(hip_libs):
    """64-byte bf16 rows unswizzled put a phase's 8 rows on 2 groups of banks; f32 and f64 rows of
    128 bytes unpadded, on one."""
    for mutation, dtypes in (("unswizzled", ("bf16",)), ("unpadded", ("f32", "f64"))):
        for dtype in dtypes:
            launches = _launches(hip_libs[mutation], "cl_s1", dtype)
            for gemm in ("FWD", "DGRAD"):
                for launch in launches[gemm]:
                    assert launch["shared_wavefronts"] > launch["shared_ideal"], (mutation, dtype, gemm, launch)
