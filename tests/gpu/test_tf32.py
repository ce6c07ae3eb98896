"""f32 convolutions on tf32 matrix instructions when torch allows it (torch.backends.cudnn.allow_tf32).

- The decision is part of the problem: ConvProblem.tf32 enters the key and the name (`_tf32`), is
  set at dispatch for GPU targets only (CPU problems keep their keys: tests/aot/test_generated.py) and
  follows torch's switch on every call.
- With it on, CUDA f32 problems run on the implicit-GEMM kernel: operands rounded to tf32 as
  cvt.rna.tf32.f32 does, mma.sync m16n8k8 .tf32 (templates/gpu/cuda.h), emulated in the simulator
  from PTX's fragment layout (templates/gpu/sim/mma.h). Every pass and output_mask of strided,
  dilated, grouped, transposed, ragged, 3-D, NCHW and channels-last cases, in forward, reversed and
  shuffled thread/block orders, against ATen in float64 within tests/support/reference.py's tf32 bound
  (TF32_TOLERANCE, derived there). Launch counts and the runtime's own plan entries prove igemm ran.
- With it off, f32 stays on the CUDA cores (igemm on FMAs), within f32's 1e-6.
- HIP computes f32 in f32 (v_mfma_f32_16x16x4f32); a tf32 problem for HIP goes to direct and says why.
- The kernels build for sm_80 and sm_90 with nvcc without spills, with HMMA .TF32 in the machine code.

tests/conftest.py turns tf32 off for every test; the tests here turn it on where they test it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest
import torch

import convgen
from convgen.building import sim_build
from convgen.codegen.emit import emit
from convgen.codegen.errors import SimulatorError
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import TargetKind, parse_target
from convgen.devices import sim
from convgen.dispatch import dispatch
from convgen.dispatch.problem import gpu_problem
from convgen.api.ops import call_problems

from support import cases
from support.builds import prebuild, problems_of_runs
from support.gpu_plans import algorithm_of, launches_of
from support.toolchain import cuda_tool

PROBLEM = ConvProblem(Op.FWD, 2, 8, 16, (9, 9), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1))


@pytest.fixture
def tf32_on():
    torch.backends.cudnn.allow_tf32 = True   # conftest's fixture restores it


# ------------------------------------------------------------------------------- identity


def test_tf32_is_part_of_the_problem_identity_and_leaves_old_keys_alone():
    on = dataclasses.replace(PROBLEM, tf32=True).validate()
    assert "tf32" not in PROBLEM.to_json() and '"tf32":true' in on.to_json()
    assert PROBLEM.key() != on.key() and PROBLEM.kernel_key() != on.kernel_key()
    assert on.name() == PROBLEM.name() + "_tf32"
    assert ConvProblem.from_dict(__import__("json").loads(on.to_json())) == on
    # the key of a problem without tf32 is the one it had before the field existed
    from convgen.codegen.keys import canonical_json, sha256_text, to_jsonable
    old = to_jsonable(PROBLEM)
    del old["tf32"]
    assert PROBLEM.key() == sha256_text(canonical_json(old))


def test_tf32_needs_an_f32_problem():
    with pytest.raises(convgen.ConvSpecError, match="tf32=True with dtype bf16"):
        dataclasses.replace(PROBLEM, dtype=DType.BF16, tf32=True).validate()


def test_gpu_problem_follows_torchs_switch_and_other_dtypes_are_untouched():
    torch.backends.cudnn.allow_tf32 = True
    assert gpu_problem(PROBLEM).tf32
    torch.backends.cudnn.allow_tf32 = False
    assert gpu_problem(PROBLEM) == PROBLEM
    bf16 = dataclasses.replace(PROBLEM, dtype=DType.BF16)
    torch.backends.cudnn.allow_tf32 = True
    assert gpu_problem(bf16) is bf16
    assert gpu_problem(PROBLEM, TargetKind.HIP) is PROBLEM   # no tf32 kernel on HIP: its f32 keys stay


def test_torch_allows_tf32_for_convolutions_by_default_and_explain_says_why():
    """A fresh process: torch's default (True) reaches `convgen explain --target cuda-sm_90 --dtype float32`."""
    code = ("import torch, sys; from convgen.cli import main; assert torch.backends.cudnn.allow_tf32; "
            "sys.exit(main(['explain', '--input', '2,8,9,9', '--weight', '16,8,3,3', '--padding', '1', "
            "'--target', 'cuda-sm_90', '--dtype', 'float32']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "CONVGEN_NVCC": "/nonexistent/nvcc"})
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "_f32_tf32" in out and "algorithm:   igemm" in out, out
    assert "f32 as tf32 because torch allows it (torch.backends.cudnn.allow_tf32" in out, out
    assert "mma.sync m16n8k8" in out and "tf32 matrix" in out, out   # the reason, and the roofline's units


def test_explain_with_tf32_off_keeps_f32_on_the_cuda_cores(tf32_on):
    from support.commands import run_cli

    flags = ["explain", "--input", "2,8,9,9", "--weight", "16,8,3,3", "--target", "cuda-sm_90", "--dtype", "float32"]
    code, out, err = run_cli(*flags)   # torch allows tf32 here
    assert code == 0, err
    assert "_f32_tf32" in out and "mma.sync m16n8k8" in out, out
    code, out, err = run_cli(*flags, "--no-tf32")
    assert code == 0, err
    assert "_f32_tf32" not in out and "algorithm:   igemm" in out and "f32 on the CUDA cores" in out, out
    assert "f32 FMA" in out   # the roofline's units
    assert torch.backends.cudnn.allow_tf32   # --no-tf32 leaves the caller's switch as it was


@pytest.mark.parametrize("target", ["cuda-sm_80", "cuda-sm_90"])
def test_cuda_f32_with_tf32_plans_igemm_with_4_byte_tiles(target):
    on = dataclasses.replace(PROBLEM, tf32=True).validate()
    plan = lower(on, parse_target(target))
    assert plan.algorithm == "igemm"
    off = lower(PROBLEM, parse_target(target))   # f32 in f32: the same kernel on FMAs
    assert off.algorithm == "igemm" and "typedef float Bits;" in emit(off).text
    text = emit(plan).text
    assert "typedef unsigned Bits;" in text and "VECTOR = 4;" in text and "LDS = 36;" in text
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in text and "cvt.rna.tf32.f32" in text
    from convgen.codegen.gpu.igemm import tiles_of
    tiles = tiles_of(on, parse_target(target))
    for tile in (tiles.fwd, tiles.dgrad, tiles.wgrad):
        assert tile.itemsize == 4 and tile.shared_bytes == tile.stages * (tile.m + tile.n) * 36 * 4


def test_hip_has_no_tf32_kernel_and_says_why():
    on = dataclasses.replace(PROBLEM, tf32=True).validate()   # (the runtime never sets tf32 for HIP: gpu_problem)
    plan = lower(on, parse_target("hip-gfx90a"))
    assert plan.algorithm == "direct"
    assert "not igemm: tf32 on hip-gfx90a" in " ".join(r for _, r in plan.reasons)


# ------------------------------------------------------------------------------- the simulator's tf32


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _rna_reference(bits: int) -> int:
    """cvt.rna.tf32.f32 by arithmetic: to 11 significant bits (a quantum of 2^-136 below 2^-126,
    where tf32, like f32, is subnormal), ties away from zero; past tf32's largest finite, infinity."""
    v = _f32(bits)
    if math.isinf(v) or v == 0.0:
        return bits
    _, e = math.frexp(abs(v))
    quantum = 2.0 ** (max(e, -125) - 11)
    r = math.floor(abs(v) / quantum + 0.5) * quantum
    if r >= 2.0 ** 128:
        r = math.inf
    return _bits(math.copysign(r, v))


ROUND = r"""
#include "cuda.h"
__global__ void round_all(const unsigned* in, unsigned* out, int n) {
    for (int i = threadIdx.x; i < n; i += CONVGEN_WARP) out[i] = convgen_tf32(in[i]);
}
// One warp: C (16 x 8) = A (16 x 8, row-major) B (8 x 8, given as B^T) through the tf32 wrappers.
__global__ void gemm(const unsigned* a, const unsigned* bt, float* c, int round) {
    __shared__ unsigned a_tile[16 * 8], b_tile[8 * 8];
    int lane = threadIdx.x;
    for (int e = lane; e < 16 * 8; e += CONVGEN_WARP) a_tile[e] = a[e];
    for (int e = lane; e < 8 * 8; e += CONVGEN_WARP) b_tile[e] = bt[e];
    __syncthreads();
    convgen_mma_a<float> fa;
    convgen_mma_b<float> fb;
    convgen_mma_load_a(fa, a_tile, 8, lane);
    convgen_mma_load_b(fb, b_tile, 8, lane);
    if (!round) fa.r[0] = a_tile[(lane >> 2) * 8 + (lane & 3)];   // an operand the wrapper did not round
    convgen_mma_acc acc = {{0.0f, 0.0f, 0.0f, 0.0f}};
    convgen_mma_sync(acc, fa, fb);
    for (int e = 0; e < 4; ++e) c[convgen_mma_acc_row(lane, e) * 8 + convgen_mma_acc_col(lane, e)] = acc.c[e];
}
extern "C" int round_tf32(const unsigned* in, unsigned* out, int n) {
    return CONVGEN_LAUNCH(round_all, 1, CONVGEN_WARP, 0, 0, in, out, n);
}
extern "C" int gemm_tf32(const unsigned* a, const unsigned* bt, float* c, int round) {
    return CONVGEN_LAUNCH(gemm, 1, CONVGEN_WARP, 0, 0, a, bt, c, round);
}
"""


@pytest.fixture(scope="module")
def tf32_lib(tmp_path_factory):
    return sim.build(ROUND, tmp_path_factory.mktemp("tf32"), "tf32", "cuda")


def test_the_simulators_rounding_is_cvt_rna(tf32_lib):
    one = 0x3F800000
    edges = [one + 0x1000, one + 0x0FFF, one + 0x3000, one | 0x80000000 | 0x1000, 0x7F7FFFFF, 0xFF7FFFFF,
             0x7F7FEFFF, 0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x00001000, 0x00000FFF, 0x00003000,
             0x807FF000, 0x007FFFFF, 0x00800000 - 0x1000]
    g = torch.Generator().manual_seed(20)
    randoms = torch.randint(0, 2**32, (4000,), generator=g, dtype=torch.int64).tolist()
    values = [b for b in edges + randoms if (b & 0x7F800000) != 0x7F800000 or not (b & 0x7FFFFF)]   # no NaNs
    inp = torch.tensor([b - 2**32 if b >= 2**31 else b for b in values], dtype=torch.int32)
    out = torch.zeros_like(inp)
    tf32_lib.call("round_tf32", sim.pointer(inp), sim.pointer(out), len(values))
    got = [b & 0xFFFFFFFF for b in out.tolist()]
    want = [_rna_reference(b) for b in values]
    bad = [(hex(v), hex(g_), hex(w)) for v, g_, w in zip(values, got, want) if g_ != w]
    assert not bad, bad[:10]
    assert got[:4] == [one + 0x2000, one, one + 0x4000, 0x80000000 | one | 0x2000]   # ties go away from zero
    assert got[4] == 0x7F800000 and got[5] == 0xFF800000   # past the largest tf32: infinity
    nan = torch.tensor([0x7FC00001, 0x7F800001], dtype=torch.int32)
    out = torch.zeros_like(nan)
    tf32_lib.call("round_tf32", sim.pointer(nan), sim.pointer(out), 2)
    assert all(math.isnan(_f32(b & 0xFFFFFFFF)) for b in out.tolist())   # NaN stays NaN (never infinity)


def test_the_m16n8k8_layout_places_every_element_and_rounds(tf32_lib):
    g = torch.Generator().manual_seed(8)
    a = torch.randint(-8, 9, (16, 8), generator=g).float()
    b = torch.randint(-8, 9, (8, 8), generator=g).float()
    c = torch.full((16, 8), float("nan"))
    bt = b.t().contiguous()
    tf32_lib.call("gemm_tf32", sim.pointer(a), sim.pointer(bt), sim.pointer(c), 1)
    assert torch.equal(c, a @ b)   # small integers: exact, so a misplaced element is a mismatch
    # random f32: the result is the f32 sum of exact products of the tf32-rounded operands
    a, b = torch.randn(16, 8, generator=g), torch.randn(8, 8, generator=g)
    rounded = lambda t: torch.tensor([_f32(_rna_reference(_bits(v))) for v in t.flatten().tolist()]).view(t.shape)
    bt = b.t().contiguous()
    tf32_lib.call("gemm_tf32", sim.pointer(a), sim.pointer(bt), sim.pointer(c), 1)
    ra, rb = rounded(a).double(), rounded(b).double()
    assert torch.allclose(c.double(), ra @ rb, rtol=0, atol=8 * 2.0**-24 * (ra.abs() @ rb.abs()).max().item())
    assert not torch.allclose(c, a @ b, rtol=1e-6, atol=0)   # it did round: f32 operands would give f32's result


def test_an_unrounded_tf32_operand_is_refused(tf32_lib):
    a = torch.full((16, 8), 1.0 + 2.0**-20)   # not a tf32 value
    b = torch.ones(8, 8)
    c = torch.zeros(16, 8)
    with pytest.raises(SimulatorError):
        tf32_lib.call("gemm_tf32", sim.pointer(a), sim.pointer(b), sim.pointer(c), 0)


# ------------------------------------------------------------------------------- through the runtime

OWN = {c.id: c for c in (
    cases.Case("tf32-s3d2-ragged", (2, 5, 11, 10), 7, (3, 3), stride=3, padding=1, dilation=2),
    cases.Case("tf32-grouped-nonsquare", (2, 10, 6, 5), 6, (3, 2), groups=2),
    cases.Case("tf32-3d-groups2", (2, 10, 3, 4, 6), 4, (2, 2, 3), stride=(1, 2, 2), padding=(0, 1, 1), groups=2),
    cases.Case("tf32-transposed-s3-op2", (2, 5, 4, 5), 6, (3, 2), stride=3, padding=1, output_padding=2,
               transposed=True),
    # channels multiples of 4 and 8x8 outputs: the 16-byte copies of 4 f32 (channels-last activations,
    # a contiguous weight, a contiguous grad_output along its pixels)
    cases.Case("tf32-vector-c8-k12", (2, 8, 8, 8), 12, (3, 3), padding=1),
)}
BY_ID = {**cases.BY_ID, **OWN}

# (case, operand layout variant, thread/block order)
MATRIX = [
    ("tf32-s3d2-ragged", "contiguous", "shuffle"),
    ("tf32-s3d2-ragged", "channels_last", "reverse"),
    ("tf32-grouped-nonsquare", "channels_last", "forward"),
    ("tf32-3d-groups2", "channels_last_weight", "shuffle"),
    ("tf32-transposed-s3-op2", "noncontig_input", "reverse"),
    ("19a-1d-stride2-padding2-dilation2", "noncontig_grad", "shuffle"),
    ("tf32-vector-c8-k12", "channels_last", "shuffle"),
    ("tf32-vector-c8-k12", "contiguous", "forward"),
]


def _plans(ops, case, masks) -> tuple[int, set[str]]:
    """Launches and algorithms of a case's calls (tests/support/gpu_plans.py) as the runtime plans them now:
    tf32 from torch's switch."""
    total, algorithms = 0, set()
    for i, mask in enumerate(masks):
        for p in call_problems(ops.x, ops.w, ops.b, *case.args(), output_mask=mask, grad_output=ops.gy)[(0 if i == 0 else 1):]:
            p = gpu_problem(p, TargetKind.CUDA)
            total += launches_of(p, "cuda")
            if lower(p, parse_target("cuda")).algorithm != "empty":
                algorithms.add(algorithm_of(p, "cuda"))
    return total, algorithms


def _runtime_algorithms(ops, case, masks) -> set[str]:
    """The algorithms of the dispatch table's own entries for the case's problems (memory hits)."""
    found = set()
    for mask in masks:
        for p in call_problems(ops.x, ops.w, ops.b, *case.args(), output_mask=mask, grad_output=ops.gy):
            entry = dispatch.kernel_for(p)
            if entry.plan.algorithm != "empty":
                found.add((entry.plan.algorithm, entry.plan.problem.tf32))
    return found


@pytest.fixture(scope="module")
def prebuilt():
    """Every kernel of the matrix (tf32 on) in one ninja run."""
    return prebuild(problems_of_runs((BY_ID[case_id], torch.float32, variant) for case_id, variant, _ in MATRIX),
                    sim="cuda", tf32=True)


@pytest.mark.parametrize("case_id, variant, order", MATRIX, ids=["-".join(row) for row in MATRIX])
def test_f32_runs_on_tf32_igemm_in_the_simulator(case_id, variant, order, prebuilt, tf32_on, monkeypatch):
    monkeypatch.setenv("CONVGEN_SIM", "cuda")
    monkeypatch.setenv("CONVGEN_SIM_ORDER", order)
    monkeypatch.setenv("CONVGEN_SIM_SEED", "20")
    case = BY_ID[case_id]
    ops = cases.operands(case, torch.float32, variant)
    launches, algorithms = _plans(ops, case, cases.MASKS)
    # igemm for every pass but a stem weight gradient (at most 4 channels per group: 19a's 2) and the
    # bias gradient alone, which igemm computes without the matrix instruction
    assert "igemm" in algorithms and algorithms <= {"igemm", "stem"}, algorithms
    before = convgen.stats()
    cases.check_case(case, torch.float32, ops, tf32=True)
    after = convgen.stats()
    assert after["sim_launches"] - before["sim_launches"] == launches
    assert after["builds"] == before["builds"], "the prebuild missed a kernel of this test"
    assert ("igemm", True) in _runtime_algorithms(ops, case, cases.MASKS)


def test_with_tf32_off_f32_runs_on_fmas(monkeypatch):
    monkeypatch.setenv("CONVGEN_SIM", "cuda")
    case = OWN["tf32-grouped-nonsquare"]
    ops = cases.operands(case, torch.float32, "contiguous")
    masks = [(True, True, True)]
    launches, algorithms = _plans(ops, case, masks)
    assert algorithms == {"igemm"}
    before = convgen.stats()["sim_launches"]
    cases.check_case(case, torch.float32, ops, masks=masks)   # f32's own 1e-6
    assert convgen.stats()["sim_launches"] - before == launches
    assert _runtime_algorithms(ops, case, masks) == {("igemm", False)}


def test_toggling_torchs_switch_between_calls_changes_the_kernel(monkeypatch):
    """The eager path remembers calls by signature: the switch is part of it."""
    monkeypatch.setenv("CONVGEN_SIM", "cuda")
    case = OWN["tf32-grouped-nonsquare"]
    ops = cases.operands(case, torch.float32, "contiguous")
    y_f32 = convgen.convolution(ops.x, ops.w, ops.b, *case.args())
    torch.backends.cudnn.allow_tf32 = True
    y_tf32 = convgen.convolution(ops.x, ops.w, ops.b, *case.args())
    torch.backends.cudnn.allow_tf32 = False
    y_again = convgen.convolution(ops.x, ops.w, ops.b, *case.args())
    assert not torch.equal(y_f32, y_tf32) and torch.equal(y_f32, y_again)


# ------------------------------------------------------------------------------- machine code


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tf32_kernels_build_without_spills_and_issue_hmma_tf32(tmp_path, arch):
    """Every pass, NCHW and channels-last (the 16-byte copy path), with runtime/building/gpu_build.py's
    flags (-Xptxas -warn-spills -Werror): 0 spills, HMMA.1688.F32.TF32 (m16n8k8) in each GEMM kernel,
    and LDGSTS.E.BYPASS.128 (cp.async of 16 bytes) where the plan moves an operand by 16-byte copies."""
    from convgen.codegen.gpu.igemm import tiles_of

    base = ConvProblem(Op.FWD, 2, 16, 32, (12, 12), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), tf32=True)
    nvdisasm = cuda_tool("nvdisasm")
    for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT):
        for layout in (Layout.CONTIGUOUS, Layout.CHANNELS_LAST):
            p = dataclasses.replace(base, op=op, input_layout=layout, weight_layout=layout, output_layout=layout,
                                    bias=op is not Op.BWD_DATA).validate()
            plan = lower(p, parse_target(f"cuda-{arch}"))
            assert plan.algorithm == "igemm"
            src, cubin = tmp_path / f"{p.name()}.cu", tmp_path / f"{p.name()}.cubin"
            src.write_text(emit(plan).text)
            done = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-Xptxas", "-warn-spills",
                                   "-Xptxas", "-Werror", str(src), "-o", str(cubin)], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
            assert spills and all(s == ("0", "0") for s in spills), done.stderr
            if nvdisasm is None:
                continue
            sass = subprocess.run([nvdisasm, str(cubin)], capture_output=True, text=True, check=True).stdout
            functions = re.split(r"\n\s*\.text\.", sass)
            name = {Op.FWD: "3fwd", Op.BWD_DATA: "8bwd_data", Op.BWD_WEIGHT: "18bwd_weight_partial"}[op]
            bodies = [f for f in functions if re.match(rf"_ZN\w+{name}E", f)]
            assert len(bodies) == 1, (p.name(), name)
            assert re.search(r"HMMA\.1688\.F32\.TF32", bodies[0]), (p.name(), name)   # m16n8k8, tf32
            tiles = tiles_of(p, parse_target(f"cuda-{arch}"))
            tile = {Op.FWD: tiles.fwd, Op.BWD_DATA: tiles.dgrad, Op.BWD_WEIGHT: tiles.wgrad}[op]
            if tile.vector_a or tile.vector_b:   # 16-byte cp.async of 4 f32
                assert re.search(r"LDGSTS\.E\.BYPASS\.128", bodies[0]), (p.name(), name)
    if nvdisasm is None:
        pytest.skip("nvdisasm not found (CUDA toolkit or `pip install nvidia-cuda-nvdisasm`): spills checked, "
                    "machine code not")


def test_hip_f32_runs_in_f32_on_the_f32_mfma_whatever_torchs_switch(tf32_on, monkeypatch):
    """No tf32 kernel on HIP: the switch leaves its f32 problems (and their keys) alone."""
    monkeypatch.setenv("CONVGEN_SIM", "hip")
    case = OWN["tf32-grouped-nonsquare"]
    ops = cases.operands(case, torch.float32, "contiguous")
    masks = [(True, True, True)]
    cases.check_case(case, torch.float32, ops, masks=masks)   # f32's own 1e-6
    assert _runtime_algorithms(ops, case, masks) == {("igemm", False)}
