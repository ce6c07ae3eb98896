"""bf16/f16 problems reach the implicit-GEMM kernel (codegen/gpu/igemm.py) through the normal
runtime in the SIMT simulator (CONVGEN_SIM=cuda, warp 32, mma.sync m16n8k16; =cuda-sm_90a, warpgroup
MMA m64nNk16; =hip, waves of 64, MFMA 16x16x16), for the forward pass and every output_mask of the backward pass, against ATen in
float64 with tests/support/reference.py's tolerances. Each test asserts that the `algorithm` pass chose
igemm for every problem of the call and counts the launches its plan entries make (a launch per
data-gradient stride phase, two per split-K weight gradient), so a fallback to the direct kernel
cannot pass. tests/sim/test_runtime.py runs a few more bf16/f16 cases through the same path.

The cases spread the axes igemm has to get right: stride phases with stride 3 and dilation 2
(residues with and without taps: the CK bug that left slices of dx zero), ragged channel counts
(5 in, 7 out: nothing a multiple of 8; more than 4 channels per group, or the weight gradient
would be the stem kernel's), groups, 1-D and 3-D, contiguous, channels-last and
non-contiguous operands, transposed convolutions (a transposed forward is igemm's data gradient
with the bias added, with output_padding), thread and block orders forward, reversed and shuffled.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import convgen
from convgen.api.ops import call_problems

from support import cases
from support.builds import prebuild, problems_of_runs
from support.gpu_plans import call_launches

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
    # channel counts in whole 16-byte copies, NCHW (staged channels-last in the allocator test)
    cases.Case("igemm-staged", (2, 16, 9, 7), 24, (3, 3), stride=(2, 1), padding=1),
    # 1x1, unit stride, no padding, 24 pixels an image: the NCHW forward copies its input along pixels
    cases.Case("igemm-1x1-pixels", (2, 16, 4, 6), 24, (1, 1)),
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
    # sm_90a: warpgroup MMA from the shared stages (K-major tiles; the channels-last weight gradient's
    # tiles of reduction rows MN-major; the NCHW 1x1 forward's A along pixels MN-major), element gathers
    ("cuda-sm_90a", "igemm-staged", "bf16", "channels_last", "shuffle"),
    ("cuda-sm_90a", "igemm-1x1-pixels", "f16", "contiguous", "reverse"),
    # (the data gradient's 1x1 weight along its channels MN-major: beside A along pixels above, and beside a
    # channels-last grad_output's K-major A here)
    ("cuda-sm_90a", "igemm-1x1-pixels", "bf16", "channels_last", "shuffle"),
    ("cuda-sm_90a", "igemm-s3d2-ragged", "bf16", "noncontig_grad", "shuffle"),
    ("cuda-sm_90a", "igemm-3d-groups2", "f16", "channels_last", "forward"),
]


@pytest.fixture(scope="module")
def prebuilt():
    """Every kernel of the matrix, built in one ninja run per vendor."""
    for vendor in sorted({row[0] for row in MATRIX}):
        prebuild(problems_of_runs((BY_ID[case_id], DTYPES[dtype], variant)
                                  for v, case_id, dtype, variant, _ in MATRIX if v == vendor), sim=vendor)
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


def test_workspaces_come_from_the_allocator_the_caller_sets(tmp_path):
    """A plan entry with a workspace takes it from the allocator given to `<entry>_set_allocator`
    (the runtime gives torch's caching allocator on a device) and hands it back after the launches
    on the same stream; a null allocation is the out-of-memory status, with nothing launched."""
    import ctypes

    from convgen.codegen.emit import emit
    from convgen.codegen.pipeline import lower
    from convgen.codegen.target import parse_target
    from convgen.devices import sim
    from support.reference import generator_for, randn

    case = OWN["igemm-staged"]
    ops = cases.operands(case, torch.bfloat16, "contiguous")
    problem = call_problems(ops.x, ops.w, None, *case.args())[0]   # the forward
    # staged whatever the cost model says of so small a problem: the conversions' workspace
    plan = dataclasses.replace(lower(problem, parse_target("cuda")), staged=("W", "X"))
    source = emit(plan)
    library = sim.build(source.text, tmp_path, "allocator", "cuda")
    entry = library.lib[source.entry]
    entry.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_void_p]
    workspace_bytes = library.lib[source.entry.replace("cg_", "cgk_", 1) + "_fwd_workspace_bytes"]
    workspace_bytes.restype = ctypes.c_ulonglong
    g = generator_for("allocator")
    x, w = randn(problem.input_shape, torch.bfloat16, g), randn(problem.weight_shape, torch.bfloat16, g)
    plain, hooked = torch.full(problem.output_shape, float("nan"), dtype=torch.bfloat16), \
        torch.full(problem.output_shape, float("nan"), dtype=torch.bfloat16)
    stream = ctypes.c_void_p(0x5000)
    assert entry(x.data_ptr(), w.data_ptr(), None, plain.data_ptr(), problem.n, stream) == 0   # the vendor's

    blocks, seen = {}, []
    alloc_type = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p)
    release_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
    fail = []

    @alloc_type
    def alloc(nbytes, on):
        seen.append(("alloc", nbytes, on))
        if fail:
            return None
        block = torch.full((nbytes,), 255, dtype=torch.uint8)   # poisoned: the conversion writes what is read
        blocks[block.data_ptr()] = block
        return block.data_ptr()

    @release_type
    def release(pointer, on):
        seen.append(("release", pointer, on))
        blocks.pop(pointer)

    setter = library.lib[source.entry + "_set_allocator"]
    setter.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    setter(ctypes.cast(alloc, ctypes.c_void_p), ctypes.cast(release, ctypes.c_void_p))
    before = library.launches()
    assert entry(x.data_ptr(), w.data_ptr(), None, hooked.data_ptr(), problem.n, stream) == 0
    assert library.launches() - before == 1 + bool(plan.staged)   # the conversions (one launch), then the GEMM
    (kind, nbytes, on), (released, pointer, on_release) = seen
    assert (kind, released, on, on_release) == ("alloc", "release", 0x5000, 0x5000) and not blocks
    assert nbytes == workspace_bytes(problem.n) > 0
    assert torch.equal(hooked.view(torch.int16), plain.view(torch.int16))
    fail.append(1)
    before = library.launches()
    assert entry(x.data_ptr(), w.data_ptr(), None, hooked.data_ptr(), problem.n, stream) == 2
    assert library.launches() == before and seen[-1][0] == "alloc"
    setter(None, None)   # back to the vendor's
    assert entry(x.data_ptr(), w.data_ptr(), None, hooked.data_ptr(), problem.n, stream) == 0


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
