"""bf16/f16 problems reach the implicit-GEMM kernel (codegen/gpu_igemm.py) through the normal
runtime in the SIMT simulator (CONVGEN_SIM=cuda, warp 32, mma.sync m16n8k16; =hip, waves of 64,
MFMA 16x16x16), for the forward pass and every output_mask of the backward pass, against ATen in
float64 with tests/reference.py's tolerances. Each test asserts that the `algorithm` pass chose
igemm for every problem of the call and counts the launches its plan entries make (a launch per
data-gradient stride phase, two per split-K weight gradient), so a fallback to the direct kernel
cannot pass. tests/test_gpu_sim.py runs a few more bf16/f16 cases through the same path.

The cases spread the axes igemm has to get right: stride phases with stride 3 and dilation 2
(residues with and without taps: the CK bug that left slices of dx zero), ragged channel counts
(5 in, 7 out: nothing a multiple of 8; more than 4 channels per group, or the weight gradient
would be the stem kernel's), groups, 1-D and 3-D, contiguous, channels-last and
non-contiguous operands, transposed convolutions (a transposed forward is igemm's data gradient
with the bias added, with output_padding), thread and block orders forward, reversed and shuffled.
"""

from __future__ import annotations

import pytest
import torch

import convgen
from convgen.dispatch import dispatch
from convgen.api.ops import call_problems
import test_cases as cases
from gpu_plans import call_launches

OWN = {c.id: c for c in (
    # stride 3, dilation 2, padding 1: gcd 1, three phases per axis, taps 3 apart; C=5, K=7 ragged (more
    # than 4 channels, so that the weight gradient is igemm's, not the stem kernel's)
    cases.Case("igemm-s3d2-ragged", (2, 5, 11, 10), 7, (3, 3), stride=3, padding=1, dilation=2),
    # grouped, non-square kernel, 5 channels per group
    cases.Case("igemm-grouped-nonsquare", (2, 10, 6, 5), 6, (3, 2), groups=2),
    # 3-D, groups, mixed stride: phases along two axes
    cases.Case("igemm-3d-groups2", (2, 10, 3, 4, 6), 4, (2, 2, 3), stride=(1, 2, 2), padding=(0, 1, 1), groups=2),
    # a transposed stride-3 convolution with output_padding 2: its forward runs igemm's stride phases
    cases.Case("igemm-transposed-s3-op2", (2, 4, 4, 5), 6, (3, 2), stride=3, padding=1, output_padding=2,
               transposed=True),
)}
BY_ID = {**cases.BY_ID, **OWN}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}

# (vendor, case, dtype, operand layout variant, thread/block order)
MATRIX = [
    ("cuda", "igemm-s3d2-ragged", "bf16", "contiguous", "shuffle"),
    ("hip", "igemm-s3d2-ragged", "f16", "channels_last", "reverse"),
    ("cuda", "igemm-grouped-nonsquare", "f16", "channels_last", "forward"),
    ("hip", "19a-1d-stride2-padding2-dilation2", "bf16", "noncontig_grad", "shuffle"),
    ("cuda", "igemm-3d-groups2", "bf16", "channels_last_weight", "reverse"),
    ("hip", "17-transposed-groups4", "bf16", "channels_last", "shuffle"),
    ("cuda", "igemm-transposed-s3-op2", "f16", "noncontig_input", "forward"),
]


@pytest.fixture(scope="module")
def prebuilt():
    """Every kernel of the matrix, built in one ninja run per vendor."""
    for vendor in ("cuda", "hip"):
        problems = {}
        for v, case_id, dtype, variant, _ in MATRIX:
            if v == vendor:
                ops = cases.operands(BY_ID[case_id], DTYPES[dtype], variant)
                for mask in cases.MASKS:
                    for p in call_problems(ops.x, ops.w, ops.b, *BY_ID[case_id].args(), output_mask=mask,
                                           grad_output=ops.gy):
                        problems[p.key()] = p
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CONVGEN_SIM", vendor)
            dispatch.prepare(list(problems.values()))
    return convgen.stats()["builds"]


@pytest.mark.parametrize("vendor, case_id, dtype, variant, order", MATRIX,
                         ids=["-".join(row) for row in MATRIX])
def test_low_precision_case_runs_on_igemm(vendor, case_id, dtype, variant, order, prebuilt, monkeypatch):
    monkeypatch.setenv("CONVGEN_SIM", vendor)
    monkeypatch.setenv("CONVGEN_SIM_ORDER", order)
    monkeypatch.setenv("CONVGEN_SIM_SEED", "17")
    case = BY_ID[case_id]
    ops = cases.operands(case, DTYPES[dtype], variant)
    launches, algorithms = call_launches(ops, case, vendor, cases.MASKS)
    assert algorithms == {"igemm"}
    before = convgen.stats()
    cases.check_case(case, DTYPES[dtype], ops)
    after = convgen.stats()
    assert after["sim_launches"] - before["sim_launches"] == launches
    assert after["builds"] == before["builds"], "the prebuild missed a kernel of this test"


def test_stride_phases_are_all_launched():
    """stride 3, dilation 2: every residue of both axes is a launch of the data gradient (9)."""
    case = OWN["igemm-s3d2-ragged"]
    ops = cases.operands(case, torch.bfloat16, "contiguous")
    launches, _ = call_launches(ops, case, "cuda", [(True, False, False)])
    assert launches == 1 + 9   # the forward, then 3 x 3 phases


WORKSPACE_SCRIPT = r"""
import ctypes, resource, sys
from pathlib import Path
import torch
from convgen.devices import sim
from convgen.building import sim_build
from convgen.codegen.emit import emit
from convgen.codegen.errors import SimulatorError
from convgen.codegen.ir import ConvProblem, DType, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import parse_target

# a weight gradient whose split-K workspace (2048 x 2048 x 9 f32, one split) is 151 MB
problem = ConvProblem(Op.BWD_WEIGHT, 1, 2048, 2048, (3, 3), (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1),
                      dtype=DType.BF16).validate()
source = emit(lower(problem, parse_target("cuda")))
library = sim.build(source.text, Path(sys.argv[1]), "workspace", "cuda")
x, gy = torch.zeros(1, 2048, 3, 3, dtype=torch.bfloat16), torch.zeros(1, 2048, 1, 1, dtype=torch.bfloat16)
gw = torch.zeros(2048, 2048, 3, 3, dtype=torch.bfloat16)
size = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (64 << 20), resource.RLIM_INFINITY))   # 64 MB more, no more
try:
    library.call(source.entry, sim.pointer(gy), sim.pointer(x), sim.pointer(gw), ctypes.c_int64(1), ctypes.c_void_p(None))
except SimulatorError as e:
    print("SimulatorError:", e)
"""


def test_a_failed_workspace_allocation_is_a_clear_error(tmp_path):
    """The plan entry allocates the split-K workspace itself; when that fails (here: an address-space
    limit in a child process) it returns a status, and the runtime raises SimulatorError naming the
    entry and the bytes, without launching anything."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WORKSPACE_SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SimulatorError:" in done.stdout and "workspace: could not allocate 150994944 bytes" in done.stdout, \
        done.stdout + done.stderr
    assert "cg_conv2d_bwdw_c2048_k2048_3x3_r3x3_bf16_igemm" in done.stdout
