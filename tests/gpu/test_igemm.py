"""The implicit-GEMM GPU kernel (codegen/gpu/igemm.py, templates/gpu/igemm.cu.j2) on the matrix
instructions of templates/gpu/cuda.h and hip.h.

- The rendered kernels run in the simulator at warp 32 and 64 against ATen in float64 for the
  forward, data, weight and bias gradients, bf16 and f16, with the tolerances of tests/support/reference.py.
- The weight gradient's split-K sum is bitwise the same under forward, reversed and shuffled orders.
- Every rendered variant builds with nvcc for sm_80 and sm_90 with spills as errors and with hipcc
  for gfx90a and gfx940, and its machine code holds tensor-core (HMMA) / matrix-core (v_mfma) instructions;
  on CUDA each main loop loads its fragments by ldmatrix.x4 (LDSM), with no scalar shared load (LDS).
(The wrappers themselves and their emulation are tested in sim/test_mma.py.)

Entry prefixes name the vendor and the case, so that failures say which library ran.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from convgen.devices import sim
from convgen.building import sim_build
from convgen.building.machine_code import main_loop, main_loop_parts
from convgen.codegen.errors import ConvSpecError
from convgen.codegen.gpu.igemm import igemm_context, render_igemm, wgrad_split
from convgen.codegen.gpu.normal import axis_phases
from convgen.codegen.gpu.staging import staging
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.target import parse_target

from support.gpu_plans import bias_partials, bias_partials_at
from support.problems import case_problem, conv_problem
from support.reference import assert_close, generator_for, in_layout, randn, reduction_terms
from support.toolchain import cuda_tool, require_fp16, run_sanitized, sim_libraries

# One worker runs this module, whole (pyproject.toml: --dist loadgroup): its `libs` fixture builds one
# simulator library per vendor of every case of the 16-bit implicit GEMM (a single file of tens of thousands
# of lines, 20-50 s of CPU each); split across workers, each worker built them all again.
pytestmark = pytest.mark.xdist_group("gpu_igemm")


# (name, input N,C,*spatial, K, kernel, stride, padding (low, high) per axis, dilation, groups)
CASES = [
    ("c1", (1, 3, 4, 4), 3, (3, 3), (2, 2), ((2, 2), (2, 2)), (1, 1), 1),              # CASES 1: padding as large as allowed
    ("c2", (2, 4, 8, 8), 2, (3, 3), (3, 2), ((2, 2), (1, 1)), (4, 4), 2),              # CASES 2: mixed stride, dilation 4, groups
    ("c5", (1, 4, 5, 5), 1, (2, 3), (1, 1), ((1, 2), (3, 3)), (3, 3), 1),              # CASES 5: 'same', asymmetric padding
    ("c8", (2, 4, 6, 5), 6, (3, 2), (1, 1), ((0, 0), (0, 0)), (1, 1), 2),              # CASES 8: grouped, non-square
    ("c13", (2, 2, 4, 20), 2, (3, 5), (1, 10), ((0, 0), (0, 0)), (1, 1), 2),           # CASES 13: stride larger than the kernel
    ("c19", (4, 8, 50), 16, (5,), (2,), ((2, 2),), (2,), 1),                           # CASES 19: 1-D
    ("c20", (3, 9, 3, 1, 9), 3, (3, 1, 9), (2, 2, 2), ((0, 0),) * 3, (1, 1, 1), 3),    # CASES 20: 3-D, groups
    ("ragged", (2, 3, 9, 7), 5, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),          # C=3, K=5: nothing a multiple of 8
    ("tiles", (2, 20, 6, 6), 70, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),         # several block tiles along M and N
    # data-gradient stride phases (the CK bug: stride > dilation left slices of dx zero)
    ("s3d1", (1, 4, 10, 11), 4, (2, 2), (3, 3), ((0, 0), (0, 0)), (1, 1), 1),          # kernel smaller than stride: taps-free residues
    ("s2d2", (2, 3, 9, 9), 5, (3, 3), (2, 2), ((2, 2), (2, 2)), (2, 2), 1),            # gcd 2: half the residues have no taps
    ("s3d2", (1, 5, 11, 10), 3, (3, 3), (3, 3), ((1, 1), (2, 2)), (2, 2), 1),          # gcd 1: three phases, steps of 3 taps
    ("s3d1_1d", (2, 5, 31), 3, (2,), (3,), ((1, 1),), (1,), 1),                        # 1-D, kernel smaller than stride
    ("s_3d", (1, 3, 5, 6, 7), 4, (2, 2, 3), (2, 3, 2), ((0, 0), (1, 1), (1, 1)), (1, 2, 2), 1),  # 3-D phases, mixed
    ("split", (2, 3, 1024), 5, (3,), (1,), ((1, 1),), (1,), 1),                        # weight gradient split several ways
    ("empty", (0, 6, 7, 8), 12, (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 3),          # CASES 15: empty batch
    # 16-byte copies (codegen/gpu/igemm_tiles.py), reductions longer than the pipeline's stages:
    ("vec_cl", (2, 16, 6, 6), 40, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),        # fwd A, B and dgrad A by vectors, tap-major
    ("vec_nchw", (2, 8, 8, 8), 16, (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 1),       # fwd B (C*taps % 8 == 0), wgrad A (16 pixels)
    ("vec_groups", (2, 32, 5, 5), 16, (3, 3), (1, 1), ((1, 1), (2, 0)), (1, 1), 2),    # grouped, asymmetric padding, tap-major
    ("vec_xcl", (1, 16, 7, 7), 8, (3, 3), (2, 1), ((1, 1), (1, 1)), (1, 2), 1),        # input channels-last only: B gathered
    # staged channels-last (nchw_staged): 3-D with stride and dilation, a 1x1 whose tiles span images
    ("vec_3d", (2, 8, 3, 5, 4), 16, (3, 2, 3), (1, 2, 1), ((1, 1), (0, 0), (1, 1)), (1, 1, 2), 1),
    ("vec_1x1", (3, 16, 5, 7), 24, (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1),
    # copies by iterator (channels per group a multiple of the 32-deep step; copy_iterators): padding
    # past both edges and ragged tiles, stride 2 with dilation (data-gradient phases of 2 and 1 taps
    # a side), groups, 49 taps (a 64-bit mask), 3-D with stride
    ("it_pad", (2, 32, 7, 9), 64, (3, 3), (1, 1), ((1, 1), (2, 0)), (1, 1), 1),
    ("it_s2", (2, 32, 9, 8), 32, (3, 3), (2, 2), ((1, 1), (1, 1)), (2, 1), 1),
    ("it_groups", (1, 64, 5, 6), 64, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 2),
    ("it_7x7", (1, 32, 8, 8), 32, (7, 7), (1, 1), ((3, 3), (3, 3)), (1, 1), 1),
    ("it_3d", (1, 32, 3, 4, 5), 32, (3, 3, 3), (1, 2, 1), ((1, 1), (1, 1), (0, 2)), (1, 1, 1), 1),
    # steps straddling taps (channels or filters a group not whole steps: TapWalk), the reduction's last
    # step past its end: 48 channels 64 deep (a tap and 16 channels a step) and 40 filters (the data
    # gradient's); 16 channels 32 deep (two taps a step) with 24 filters over stride-2 phases of 4, 2
    # and 1 taps; 8 channels and filters a group (four taps a step)
    ("it_c48", (2, 48, 5, 6), 40, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    ("it_c16", (1, 16, 9, 8), 40, (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 1),
    ("it_c8", (1, 16, 6, 6), 16, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 2),
    # tiles 96 wide: 96 filters and channels (one 96 tile each, not two of 64); 81 taps (too many for the
    # iterators' masks: the per-step decode over a channels-last input)
    ("wide96", (1, 96, 4, 5), 96, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    ("dec_9x9", (1, 16, 9, 9), 8, (9, 9), (1, 1), ((4, 4), (4, 4)), (1, 1), 1),
    # the weight gradient's copies: NCHW 1x1 at unit stride along pixels for both operands (64 a
    # plane); channels-last along channels with 64 channels, two taps a 128-column tile, the last
    # tile half past the (channel, tap) columns
    ("px_1x1", (2, 16, 8, 8), 24, (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1),
    # the data gradient's NCHW grad_output along its pixels (a 1x1 at unit stride, ldmatrix: CUDA): 40
    # filters, the reduction's second step past their end; with the weight staged (nchw_w) too
    ("dpx_1x1", (3, 24, 8, 16), 40, (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1),
    # the data gradient's 1x1 weight along its channels (ldmatrix: CUDA), grad_output channels-last: 40
    # channels on a 64-wide tile; two groups of 16 channels and 8 filters (one step, past their end), stride
    # 2 with padding (phases without taps: zeros)
    ("dmn_1x1", (2, 40, 5, 6), 24, (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1),
    ("dmn_s2_g2", (2, 32, 7, 6), 16, (1, 1), (2, 2), ((1, 1), (0, 0)), (1, 1), 2),
    ("mn_64", (2, 64, 6, 6), 16, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    # the epilogue's 16-byte stores along the tile's rows (out_along 2): NCHW output and grad_input of
    # 64-pixel images at unit stride, 3 images (192 rows: the last 128-row tile half past them), 24 filters
    ("ep_rows", (3, 16, 8, 8), 24, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    # an RGB stem: 3 channels, 7x7 at stride 2 (49 taps, more than a tap table's: the forward's walk by
    # the tap's index); staged ("cl_staged", and "ragged" in "nchw_staged"), its copies padded to whole
    # 16-byte copies of channels (padding.padded_channels)
    ("stem", (2, 3, 19, 21), 16, (7, 7), (2, 2), ((3, 3), (3, 3)), (1, 1), 1),
]
ITERATOR_CASES = {"it_pad", "it_s2", "it_groups", "it_7x7", "it_3d", "it_c48", "it_c16", "it_c8", "dec_9x9"}   # not in NCHW: their layouts below
BY_NAME = {c[0]: c for c in CASES}
DTYPES = {"bf16": (DType.BF16, torch.bfloat16), "f16": (DType.F16, torch.float16)}
F16_CASES = {"c2", "c19", "c20", "ragged", "s3d2", "s_3d"}
# layouts (support/problems.py's GPU_LAYOUTS): "nchw" all contiguous, "cl" all channels-last, "x_cl" the
# input only ("nchw_staged": NCHW tensors with every GEMM's operand that can be staged channels-last
# staged -- the forward's input and weight and the data gradient's grad_output, codegen/gpu/staging.py --
# where the layout pass would stage only the ones its problem's own GEMM reads, when they pay)
CHANNELS_LAST_CASES = {"c2": "cl", "c20": "cl", "ragged": "cl", "s3d2": "cl", "s_3d": "cl", "tiles": "x_cl",
                       "vec_cl": "cl", "vec_groups": "cl", "vec_xcl": "x_cl", "it_pad": "cl", "it_groups": "cl",
                       "it_3d": "cl", "mn_64": "cl", "it_c48": "cl", "it_c16": "cl", "it_c8": "cl", "wide96": "cl",
                       "dec_9x9": "cl", "dmn_1x1": "cl", "dmn_s2_g2": "cl"}
F16_CASES |= {"vec_nchw"}
NCHW_ONLY_IN_LAYOUT = {"vec_cl", "vec_groups", "vec_xcl", "dmn_1x1", "dmn_s2_g2"}   # these run in their channels-last layout only
STAGED_CASES = {"vec_nchw": "bf16", "vec_groups": "f16", "c19": "bf16", "vec_3d": "bf16", "vec_1x1": "bf16",
                "it_pad": "bf16", "it_s2": "f16", "it_7x7": "bf16", "it_c48": "f16", "it_c16": "bf16"}
PARAMS = ([(c[0], d, "nchw") for c in CASES for d in DTYPES
           if (d == "bf16" or c[0] in F16_CASES) and c[0] not in NCHW_ONLY_IN_LAYOUT | ITERATOR_CASES | {"vec_3d", "vec_1x1"}]
          + [(name, "bf16", layout) for name, layout in CHANNELS_LAST_CASES.items()]
          + [(name, d, "nchw_staged") for name, d in STAGED_CASES.items()])
ORDERS = ("forward", "reverse", "shuffle")


def _random_cases(count: int, seed: int) -> list[tuple]:
    """Small valid problems drawn over every axis (rank, groups, ragged channels, kernel, stride,
    dilation, asymmetric padding), the same on every run."""
    rng, cases = random.Random(seed), []
    while len(cases) < count:
        rank, groups = rng.randint(1, 3), rng.randint(1, 3)
        kernel = tuple(rng.randint(1, 4) for _ in range(rank))
        stride = tuple(rng.randint(1, 3) for _ in range(rank))
        dilation = tuple(rng.randint(1, 3) for _ in range(rank))
        padding = tuple((rng.randint(0, 2), rng.randint(0, 2)) for _ in range(rank))
        size = tuple(rng.randint(1, 9 if rank < 3 else 5) for _ in range(rank))
        shape = (rng.randint(1, 3), groups * rng.randint(1, 6), *size)
        case = (f"rand{len(cases)}", shape, groups * rng.randint(1, 7), kernel, stride, padding, dilation, groups)
        try:
            case_problem(case, DType.BF16)
        except ConvSpecError:
            continue   # the kernel does not fit the padded input: draw again
        cases.append(case)
    return cases


RANDOM_CASES = _random_cases(8, seed=17)
BY_NAME.update((c[0], c) for c in RANDOM_CASES)
PARAMS += [(c[0], "bf16" if i % 2 else "f16", "cl" if i % 3 == 0 and len(c[1]) > 3 else "nchw")
           for i, c in enumerate(RANDOM_CASES)]
PARAMS += [("dpx_1x1", "f16", "nchw_w")]   # grad_output along its pixels, the staged weight along the reduction
# the input staged alone: the caller's 1x1 weight, contiguous, is read linearly in the staged input's tap-major
# reduction (a 1x1 has no tap stride to keep)
PARAMS += [("vec_1x1", "bf16", "nchw_x")]
# the forward's input and weight staged with their 3 channels padded to 8 (zeros): NCHW with grad_output
# staged too, and channels-last (the copies made from channels-last tensors)
PARAMS += [("ragged", "bf16", "nchw_staged"), ("stem", "f16", "cl_staged")]


def _prefix(vendor: str, name: str, dtype: str, layout: str = "nchw") -> str:
    return f"{vendor}_{name}_{dtype}_{layout}"


def _staged(layout: str) -> tuple[str, ...] | None:
    """The operands a layout key stages: all three for nchw_staged, the weight for nchw_w, the input for
    nchw_x, the forward's input and weight for cl_staged, else the layout pass's rule (None)."""
    return {"nchw_staged": ("X", "W", "Y"), "nchw_w": ("W",), "nchw_x": ("X",), "cl_staged": ("X", "W")}.get(layout)


def _staged_of_prefix(prefix: str) -> tuple[str, ...] | None:
    """_staged of the layout key a kernel prefix ends with (_prefix's)."""
    return next((_staged(key) for key in ("nchw_staged", "nchw_w", "nchw_x", "cl_staged") if prefix.endswith(f"_{key}")),
                None)


def _source(vendor: str, arch: str | None = None) -> str:
    target = parse_target(f"{vendor}-{arch}" if arch else vendor)
    return "".join(render_igemm(case_problem(BY_NAME[n], DTYPES[d][0], lay), target, _prefix(vendor, n, d, lay),
                                staged=_staged(lay))
                   for n, d, lay in PARAMS)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    return sim_libraries(tmp_path_factory, "gpu_igemm", _source, lambda vendor: "igemm")


# ----------------------------------------------------------------------- the kernel's decisions


def test_stride_phases_cover_every_input_position_once_with_the_right_taps():
    for size, out, kernel, stride, pad, dilation in [(10, 3, 2, 3, 0, 1), (9, 5, 3, 2, 2, 2), (11, 3, 3, 3, 1, 2),
                                                     (31, 11, 2, 3, 1, 1), (7, 4, 3, 2, 1, 1)]:
        phases = axis_phases(size, out, kernel, stride, pad, dilation)
        covered = sorted(p.first + stride * t for p in phases for t in range(p.count))
        assert covered == list(range(size))
        for p in phases:
            for t in range(p.count):
                i = p.first + stride * t
                expected = [r for r in range(kernel) if (i + pad - r * dilation) % stride == 0]
                got = [p.tap0 + j * p.tap_step for j in range(p.taps)]
                assert got == expected
                for j, r in enumerate(got):
                    assert p.base + t - j * p.out_step == (i + pad - r * dilation) // stride


def test_what_the_kernel_does_not_take_is_refused_by_name():
    base = case_problem(BY_NAME["ragged"], DType.BF16)
    cuda = parse_target("cuda-sm_80")
    with pytest.raises(ConvSpecError, match="tf32 on hip-gfx90a"):   # f32 as tf32 is CUDA's path (f32 alone runs on FMAs)
        igemm_context(dataclasses.replace(base, dtype=DType.F32, tf32=True), parse_target("hip-gfx90a"), "p")
    for change, word in [({"groups": 65537, "c": 65537, "k": 65537}, "groups=65537"),
                         ({"in_size": (1 << 15, 1 << 15)}, "an input image has 3221225472 elements")]:
        with pytest.raises(ConvSpecError, match=word):
            igemm_context(dataclasses.replace(base, **change), cuda, "p")
    with pytest.raises(ConvSpecError, match="cuda or hip"):
        igemm_context(base, parse_target("cpu"), "p")
    with pytest.raises(ConvSpecError, match="prefix"):
        igemm_context(base, cuda, "not an identifier")
    with pytest.raises(ConvSpecError, match="threads=256"):
        igemm_context(base, cuda, "p", threads=256)
    # sm_90a's GEMM kernels are two warpgroups (the producer, the consumer), its bias kernel one
    for threads in (128, 256):
        igemm_context(base, parse_target("cuda-sm_90a"), "p", threads=threads)
    with pytest.raises(ConvSpecError, match="threads=384: the implicit-GEMM kernel's block is 4 or 8 warps"):
        igemm_context(base, parse_target("cuda-sm_90a"), "p", threads=384)
    with pytest.raises(ConvSpecError, match="entries"):
        igemm_context(base, cuda, "p", entries=("bwd_everything",))


# ----------------------------------------------------------------------- against ATen


def _reference(case, x, w, b, dy):
    """ATen's results in float64, padding applied explicitly so asymmetric pairs work too."""
    _, _, _, _, stride, padding, dilation, groups = case
    pads = [p for pair in reversed(padding) for p in pair]
    x64 = F.pad(x.double(), pads)
    zeros = [0] * len(stride)
    y = torch.ops.aten.convolution(x64, w.double(), b.double(), list(stride), zeros, list(dilation), False, zeros, groups)
    dxp, dw, db = torch.ops.aten.convolution_backward(dy.double(), x64, w.double(), [b.numel()], list(stride), zeros,
                                                      list(dilation), False, zeros, groups, [True, True, True])
    slices = [slice(None), slice(None)] + [slice(lo, dxp.shape[2 + i] - hi) for i, (lo, hi) in enumerate(padding)]
    return y, dxp[tuple(slices)], dw, db


def _run(lib, prefix, problem, torch_dtype, x, w, b, dy, order, seed=0, keep=None):
    """Every pass of `prefix`'s kernels on poisoned outputs: y, dx, dw, db (alone), then dw and db
    fused (bwd_weight_bias: the weight gradient's two launches, no third); `keep` (a dict) receives
    the workspaces ("workspace", "fused workspace")."""
    p, n = sim.pointer, ctypes.c_longlong(problem.n)
    x, w, dy = in_layout(x, problem.input_layout), in_layout(w, problem.weight_layout), in_layout(dy, problem.output_layout)
    y, dx, dw, db = (in_layout(torch.full(s, float("nan"), dtype=torch_dtype), layout) for s, layout in
                     ((problem.output_shape, problem.output_layout), (problem.input_shape, problem.input_layout),
                      (problem.weight_shape, problem.weight_layout), ((problem.k,), Layout.CONTIGUOUS)))
    dw_fused, db_fused = torch.full_like(dw, float("nan")), torch.full_like(db, float("nan"))

    def workspace(entry):   # poisoned: every partial is written (whole floats: at least the bytes asked)
        lib.lib[f"{prefix}_{entry}_workspace_bytes"].restype = ctypes.c_ulonglong
        return torch.full((-(-lib.lib[f"{prefix}_{entry}_workspace_bytes"](n) // 4),), float("nan"), dtype=torch.float32)

    plain, fused = workspace("bwd_weight"), workspace("bwd_weight_bias")
    # the entries that stage operands channels-last take a workspace too (poisoned: what the GEMM
    # reads there is what the conversion wrote)
    staged = {entry: (workspace(entry),) if hasattr(lib.lib, f"{prefix}_{entry}_workspace_bytes") else ()
              for entry in ("fwd", "bwd_data")}   # the tensors, alive through the calls
    lib.call(f"{prefix}_fwd", p(x), p(w), p(b), p(y), *map(p, staged["fwd"]), n, None, order=order, seed=seed)
    lib.call(f"{prefix}_bwd_data", p(dy), p(w), p(dx), *map(p, staged["bwd_data"]), n, None, order=order, seed=seed)
    lib.call(f"{prefix}_bwd_weight", p(dy), p(x), p(dw), p(plain), n, None, order=order, seed=seed)
    lib.call(f"{prefix}_bwd_bias", p(dy), p(db), n, None, order=order, seed=seed)
    launches = lib.launches()
    lib.call(f"{prefix}_bwd_weight_bias", p(dy), p(x), p(dw_fused), p(db_fused), p(fused), n, None, order=order,
             seed=seed)
    # partials and their ordered sum, the bias gradient inside them (after the layout pass's conversions)
    context = igemm_context(problem, parse_target("cuda" if lib.warp_size == 32 else "hip"), "p",
                            staged=_staged_of_prefix(prefix))
    converted = dict(context.converts)["WGRAD"]
    assert lib.launches() - launches == 2 + (bool(converted) and problem.n > 0)   # (one conversion launch for both)
    # the workspaces: the split's partials (f32 or f64), the bias's (f64) after the weight's from an
    # 8-byte boundary, then (from a 256-byte boundary) the conversions' copies, each a whole number of 256 bytes
    split, acc = wgrad_split(context, problem.n), 8 if torch_dtype == torch.float64 else 4
    whole = lambda size: -(-size // 256) * 256 if converted else size
    copies = sum(whole(problem.n * math.prod(shape[1:]) * problem.dtype.itemsize)
                 for kind, shape in (("X", problem.input_shape), ("Y", problem.output_shape)) if kind in converted)
    if problem.transposed:   # the normal convolution's input is this problem's grad_output, and back
        copies = sum(whole(problem.n * math.prod(shape[1:]) * problem.dtype.itemsize)
                     for kind, shape in (("X", problem.output_shape), ("Y", problem.input_shape)) if kind in converted)
    assert plain.numel() * 4 == whole(split * dw.numel() * acc) + copies
    assert fused.numel() * 4 == whole(bias_partials_at(split * dw.numel() * acc) + split * problem.k * 8) + copies
    if keep is not None:
        keep["workspace"], keep["fused workspace"] = plain, fused
    return y, dx, dw, db, dw_fused, db_fused


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("name,dtype,layout", PARAMS)
def test_every_pass_matches_aten(libs, vendor, name, dtype, layout):
    check_every_pass(libs[vendor], _prefix(vendor, name, dtype, layout), BY_NAME[name], DTYPES[dtype], layout,
                     ORDERS[(len(name) + (vendor == "hip")) % 3], f"igemm-{vendor}-{name}-{dtype}-{layout}")


def check_every_pass(lib, prefix: str, case, dtypes, layout: str, order: str, seed_name: str) -> None:
    """`prefix`'s kernels of `case` ((DType, torch dtype) `dtypes`, `layout`) against ATen in float64:
    every pass and the fused bias gradient, in `order`, on data drawn for `seed_name`."""
    problem = case_problem(case, dtypes[0], layout)
    torch_dtype = dtypes[1]
    g = generator_for(seed_name)
    x, w = randn(problem.input_shape, torch_dtype, g), randn(problem.weight_shape, torch_dtype, g)
    b, dy = randn((problem.k,), torch_dtype, g), randn(problem.output_shape, torch_dtype, g)
    out = _run(lib, prefix, problem, torch_dtype, x, w, b, dy, order, seed=len(case[0]))
    terms = reduction_terms(problem.input_shape, problem.weight_shape, problem.output_shape)
    names = ("forward", "grad_input", "grad_weight", "grad_bias", "grad_weight (fused)", "grad_bias (fused)")
    reference = _reference(case, x, w, b, dy)
    for what, got, ref in zip(names, out, reference + reference[2:]):
        assert_close(got, ref, torch_dtype, f"{prefix} {what} ({order})", terms[what.split(" ")[0]])
    assert torch.equal(out[4], out[2])   # fusing the bias changes no weight's sum


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
def test_the_weight_gradient_is_bitwise_the_same_in_any_order(libs, vendor):
    problem = case_problem(BY_NAME["split"], DType.BF16)
    assert wgrad_split(igemm_context(problem, parse_target(vendor), "p"), problem.n) > 1
    g = generator_for(f"igemm-determinism-{vendor}")
    x, dy = randn(problem.input_shape, torch.bfloat16, g), randn(problem.output_shape, torch.bfloat16, g)
    w, b = randn(problem.weight_shape, torch.bfloat16, g), randn((problem.k,), torch.bfloat16, g)
    kept = [{} for _ in range(4)]
    results = [_run(libs[vendor], _prefix(vendor, "split", "bf16"), problem, torch.bfloat16, x, w, b, dy, order, seed,
                    keep) for (order, seed), keep in zip((("forward", 0), ("reverse", 0), ("shuffle", 1), ("shuffle", 2)), kept)]
    for other, keep in zip(results[1:], kept[1:]):
        for i in (2, 4, 5):   # grad_weight, and fused with grad_bias
            assert torch.equal(results[0][i].view(torch.int16), other[i].view(torch.int16))
        for space in ("workspace", "fused workspace"):
            assert torch.equal(kept[0][space].view(torch.int32), keep[space].view(torch.int32)), space


def test_the_weight_gradient_rounds_once_after_summing_f32_partials_in_split_order(libs):
    """The workspace holds full f32 partials (not rounded to bf16) and grad_weight is their sum in
    split order, in f32, rounded to bf16 once."""
    problem = case_problem(BY_NAME["split"], DType.BF16)
    split = wgrad_split(igemm_context(problem, parse_target("cuda"), "p"), problem.n)
    g = generator_for("igemm-split-rounding")
    x, dy = randn(problem.input_shape, torch.bfloat16, g), randn(problem.output_shape, torch.bfloat16, g)
    w, b = randn(problem.weight_shape, torch.bfloat16, g), randn((problem.k,), torch.bfloat16, g)
    keep = {}
    out = _run(libs["cuda"], _prefix("cuda", "split", "bf16"), problem, torch.bfloat16, x, w, b, dy, "shuffle", 5, keep)
    dw = out[2]
    partials = keep["workspace"].view(split, *problem.weight_shape)
    assert torch.isfinite(partials).all()
    assert not torch.equal(partials, partials.bfloat16().float())   # f32 precision, not bf16
    total = torch.zeros(problem.weight_shape, dtype=torch.float32)
    for s in range(split):
        total += partials[s]
    assert torch.equal(dw.view(torch.int16), total.bfloat16().view(torch.int16))
    # fused: the bias partials (f64) follow the weight's; grad_bias is their in-order sum, rounded once
    # (to the f32 accumulator, then to bf16)
    partial = bias_partials(keep["fused workspace"], partials.numel() * 4, split, problem.k)
    assert torch.isfinite(partial).all()
    assert not torch.equal(partial, partial.bfloat16().double())
    bias = torch.zeros(problem.k, dtype=torch.float64)
    for s in range(split):
        bias += partial[s]
    assert torch.equal(out[5].view(torch.int16), bias.float().bfloat16().view(torch.int16))


def test_the_weight_gradient_splits_by_the_launch_batch(libs):
    """The split is the launch's (wgrad_split): a batch of one image splits fewer ways than two, its
    workspace is that many partials, and both sums match ATen."""
    case = BY_NAME["split"]
    prefix = _prefix("cuda", "split", "bf16")
    context = igemm_context(case_problem(case, DType.BF16), parse_target("cuda"), "p")
    sizes = libs["cuda"].lib[f"{prefix}_bwd_weight_workspace_bytes"]
    sizes.restype = ctypes.c_ulonglong
    splits = [wgrad_split(context, n) for n in (1, 2)]
    assert 1 < splits[0] < splits[1] <= context.split
    for n, split in zip((1, 2), splits):
        problem = dataclasses.replace(case_problem(case, DType.BF16), n=n)
        weights = problem.k * problem.c * 3
        assert sizes(ctypes.c_longlong(n)) == split * weights * 4
        g = generator_for(f"igemm-split-batch-{n}")
        x, w = randn(problem.input_shape, torch.bfloat16, g), randn(problem.weight_shape, torch.bfloat16, g)
        b, dy = randn((problem.k,), torch.bfloat16, g), randn(problem.output_shape, torch.bfloat16, g)
        out = _run(libs["cuda"], prefix, problem, torch.bfloat16, x, w, b, dy, "shuffle", n)
        terms = reduction_terms(problem.input_shape, problem.weight_shape, problem.output_shape)
        reference = _reference((case[0], (n, *case[1][1:]), *case[2:]), x, w, b, dy)
        for what, i in (("grad_weight", 2), ("grad_bias", 3)):
            assert_close(out[i], reference[i], torch.bfloat16, f"batch {n} {what}", terms[what])


def test_the_vector_cases_take_the_16_byte_copies():
    """The vec_* cases exercise what they are for: operands by 16-byte copies, more reduction steps
    than pipeline stages (so the ring of stages wraps), tap-major reductions for channels-last."""
    for vendor in sim_build.WARP:
        target = parse_target(vendor)
        tiles = {name: dict(igemm_context(case_problem(BY_NAME[name], DType.BF16, layout), target, "p", staged=()).tiles)
                 for name, layout in (("vec_cl", "cl"), ("vec_nchw", "nchw"), ("vec_groups", "cl"), ("vec_xcl", "x_cl"),
                                      ("px_1x1", "nchw"), ("mn_64", "cl"))}
        # staged (codegen/gpu/staging.py): the forward and data gradient copy 16 bytes, tap-major, from
        # the NCHW tensors' channels-last copies and (data gradient) the weight's filters-innermost one;
        # the weight gradient from both activations' copies along channels (CUDA: ldmatrix.trans; HIP:
        # landed transposed into K-major rows)
        staged = dict(igemm_context(case_problem(BY_NAME["vec_nchw"], DType.BF16), target, "p", staged=("X", "W", "Y")).tiles)
        assert staged["FWD"].vector_a and staged["FWD"].vector_b and staged["FWD"].tap_major
        assert staged["DGRAD"].vector_a and staged["DGRAD"].vector_b and staged["DGRAD"].tap_major
        # (the caller's channels-last weight along its channels, by ldmatrix.trans: CUDA; gathered on HIP)
        assert tiles["vec_cl"]["DGRAD"].vector_b == tiles["vec_cl"]["DGRAD"].b_mn == (vendor == "cuda")
        cuda = vendor == "cuda"
        assert staged["WGRAD"].mn_major and staged["WGRAD"].vector_a and staged["WGRAD"].vector_b
        assert tiles["vec_cl"]["FWD"].vector_a and tiles["vec_cl"]["FWD"].vector_b and tiles["vec_cl"]["FWD"].tap_major
        assert tiles["vec_cl"]["DGRAD"].vector_a and tiles["vec_cl"]["DGRAD"].tap_major
        assert tiles["vec_nchw"]["FWD"].vector_b and not tiles["vec_nchw"]["FWD"].vector_a
        assert tiles["vec_nchw"]["WGRAD"].vector_a and not tiles["vec_nchw"]["WGRAD"].vector_b
        assert tiles["px_1x1"]["WGRAD"].vector_a and tiles["px_1x1"]["WGRAD"].vector_b
        assert not tiles["px_1x1"]["WGRAD"].mn_major
        # the forward's NCHW input along its pixels (ldmatrix: CUDA), into tiles of reduction rows
        assert tiles["px_1x1"]["FWD"].a_mn == cuda and tiles["px_1x1"]["FWD"].vector_a == cuda
        assert not tiles["px_1x1"]["FWD"].tap_major and not tiles["vec_nchw"]["FWD"].a_mn
        assert tiles["mn_64"]["WGRAD"].mn_major and (tiles["mn_64"]["WGRAD"].m, tiles["mn_64"]["WGRAD"].n) == (64, 128)
        assert tiles["vec_groups"]["FWD"].vector_a and tiles["vec_groups"]["DGRAD"].vector_a
        assert tiles["vec_xcl"]["FWD"].vector_a and not tiles["vec_xcl"]["FWD"].vector_b
        assert tiles["vec_cl"]["FWD"].stages == (5 if cuda else 2)   # 16 x 9 = 144: five steps of 32, five stages
        assert tiles["vec_cl"]["DGRAD"].stages == (6 if cuda else 2)   # 40 x 9 = 360: twelve steps, the ring wraps


def test_the_straddling_and_wide_cases_take_their_steps_and_tiles():
    """it_c48 / it_c16 / it_c8 step across taps as they are meant to (a tap and 16 channels, two taps,
    four taps a step; tails past the reduction's end), wide96 tiles its 96 filters and channels by one
    96 side where the kernel can (mma.sync; not HIP's 16-bit copies, not wgmma, not rows of pixels),
    and a side pads little while keeping warp tiles wide (_padded_side)."""
    from convgen.codegen.gpu.igemm_tiles import _padded_side

    for vendor in sim_build.WARP:
        target, cuda = parse_target(vendor), vendor == "cuda"
        ctx = {name: igemm_context(case_problem(BY_NAME[name], DType.BF16, "cl"), target, "p", staged=())
               for name in ("it_c48", "it_c16", "it_c8", "wide96")}
        tiles = {name: dict(c.tiles) for name, c in ctx.items()}
        c48, c16, c8 = tiles["it_c48"], tiles["it_c16"], tiles["it_c8"]
        assert (c48["FWD"].depth, c48["DGRAD"].depth) == ((64, 64) if cuda else (32, 32))   # 432, 360: 64 pads no more
        assert (c16["FWD"].depth, c8["FWD"].depth) == (32, 32)   # 144: 64 would pad 192, a fifth more than 160
        # few columns (24 filters; a data gradient's 24 channels): the warps' matrix instructions a step are
        # few, so the deeper step may pad a third (144 -> 24 and 24 <- 144 1x1s: 192 against 160)
        for op in (Op.FWD, Op.BWD_DATA):
            narrow = conv_problem(8, 144 if op is Op.FWD else 24, 24 if op is Op.FWD else 144, (28, 28), (1, 1), pad=0,
                                  op=op, dtype=DType.BF16, layout=Layout.CHANNELS_LAST)
            wide = conv_problem(8, 144 if op is Op.FWD else 40, 40 if op is Op.FWD else 144, (28, 28), (1, 1), pad=0,
                                op=op, dtype=DType.BF16, layout=Layout.CHANNELS_LAST)
            depth = [dict(igemm_context(p, target, "p", staged=()).tiles)["FWD" if op is Op.FWD else "DGRAD"].depth
                     for p in (narrow, wide)]
            assert depth == ([64, 32] if cuda else [32, 32]), (op, depth)
        for name in ("it_c48", "it_c16", "it_c8"):
            assert dict(ctx[name].iterators) == {"FWD_A": True, "FWD_B": True, "DGRAD_A": True, "DGRAD_B": False}, name
        wide = tiles["wide96"]
        # (rows: 20 pixels an image, the smallest side)
        assert (wide["FWD"].m, wide["FWD"].n, wide["DGRAD"].n) == ((64, 96, 96) if cuda else (64, 128, 128))
        nchw = dict(igemm_context(case_problem(BY_NAME["wide96"], DType.BF16), target, "p", staged=()).tiles)
        assert (nchw["WGRAD"].m, nchw["WGRAD"].n) == ((96, 128) if cuda else (128, 128))   # 96 filters: rows of a 96 tile
    sm90a = dict(igemm_context(case_problem(BY_NAME["wide96"], DType.BF16, "cl"), parse_target("cuda-sm_90a"), "p",
                               staged=()).tiles)
    assert (sm90a["FWD"].n, sm90a["DGRAD"].n) == (128, 128)   # wgmma: sides of 64 and 128
    for length, side in [(96, 96), (192, 96), (160, 96), (320, 128), (48, 64), (112, 128), (288, 96), (864, 128),
                         (480, 128), (64, 64), (80, 96), (8, 64), (1000, 128)]:
        assert _padded_side((64, 96, 128), length) == side, length
    for length, side in [(96, 128), (192, 128), (160, 128), (48, 64), (64, 64), (320, 128)]:   # wgmma's, HIP's 16-bit
        assert _padded_side((64, 128), length) == side, length


def test_the_iterator_cases_take_the_iterators():
    """The it_* cases run the copies by iterator they are for (codegen/gpu/igemm.py copy_iterators):
    channels-last activations with whole 16-byte copies of a group's channels (filters), steps
    straddling taps where those are not whole steps; a contiguous NCHW weight read linearly where its
    (channel, tap) reduction is whole copies. The rest decode each step's reduction index (dec_9x9's
    81 taps, vec_xcl's weight, the caller's weight in every data gradient), so both stay checked
    against ATen."""
    expect = {("it_pad", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"), ("it_groups", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"),
              ("it_3d", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"), ("mn_64", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"),
              ("vec_cl", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"), ("vec_groups", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"),
              ("it_c48", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"), ("it_c16", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"),
              ("it_c8", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"), ("wide96", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"),
              ("dmn_1x1", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"), ("dmn_s2_g2", "cl"): ("FWD_A", "FWD_B", "DGRAD_A"),
              ("vec_xcl", "x_cl"): ("FWD_A",),   # the weight in NCHW with a tap-major reduction: decoded
              ("dec_9x9", "cl"): ("FWD_B",),     # 81 taps: more than a mask holds
              # the forward's copies padded to 8 channels; ragged's 5 filters: the data gradient's not whole
              # copies, the stem's 16 (its weight staged filters innermost too: the copy the data gradient reads)
              ("ragged", "nchw_staged"): ("FWD_A", "FWD_B"),
              ("stem", "cl_staged"): ("FWD_A", "FWD_B", "DGRAD_A", "DGRAD_B")}
    for vendor in sim_build.WARP:
        for name, dtype, layout in PARAMS:
            problem = case_problem(BY_NAME[name], DTYPES[dtype][0], layout)
            iterators = dict(igemm_context(problem, parse_target(vendor), "p", staged=_staged(layout)).iterators)
            taken = tuple(k for k, v in iterators.items() if v)
            if (name, layout) in expect:
                wanted = expect[name, layout]
            elif layout == "nchw_staged":   # every operand staged: all four (channels and filters whole copies)
                wanted = ("FWD_A", "FWD_B", "DGRAD_A", "DGRAD_B")
            elif layout == "nchw":   # the weight linearly where C/g x taps is whole 8-element copies; CUDA's
                # 1x1 input (and grad_output) along their pixels; what the layout pass stages (the gathers'
                # latency outweighing a conversion: mn_64's forward on HIP) by iterator from its copy
                _, shape, _, kernel, *_, groups = BY_NAME[name]
                pixels = vendor == "cuda" and name in ("px_1x1", "dpx_1x1")
                kinds = staging(problem, parse_target(vendor)).kinds
                wanted = (("FWD_A",) if pixels or "X" in kinds else ()) + (
                    ("FWD_B",) if shape[1] // groups * math.prod(kernel) % 8 == 0 or "W" in kinds else ()) + (
                    ("DGRAD_A",) if pixels else ())
            elif layout == "nchw_w":   # CUDA: grad_output along its pixels, the staged weight along the reduction
                wanted = ("FWD_A", "DGRAD_A", "DGRAD_B") if vendor == "cuda" else ()
            elif layout == "nchw_x":   # the staged input tap-major, the caller's 1x1 weight read linearly
                wanted = ("FWD_A", "FWD_B")
            else:
                wanted = expect.get((name, layout), ())
            assert taken == wanted, (vendor, name, layout, taken)


def test_data_gradients_copy_the_callers_weight_along_its_channels():
    """The data gradient reads the caller's weight by 16-byte copies along its channels into tiles of
    reduction rows (DGRAD_B_MN, fragments by ldmatrix.trans, MN-major for wgmma) where a filter's channels
    are contiguous at every tap and whole copies: a channels-last weight with grad_output channels-last
    (the reduction tap-major), or a 1x1 in either activation layout with grad_output along the
    reduction or along its pixels (NCHW); not an NCHW weight of more than one tap, not where the layout
    pass stages the weight (its copy, filters innermost, goes along the reduction), not a group of 2
    channels (c2), not 96 channels of a 3x3 where a 96-wide tile of the staged copy pads less than tiles of
    reduction rows (wide96; wgmma's tiles are all 64 or 128 wide), not on HIP (no ldmatrix), not in f32
    (tf32 fragments element by element)."""
    takes = [("dmn_1x1", "bf16", "cl"), ("dmn_s2_g2", "bf16", "cl"), ("dpx_1x1", "bf16", "nchw"),
             ("px_1x1", "bf16", "nchw"), ("vec_1x1", "bf16", "nchw_x"), ("it_pad", "bf16", "cl"),
             ("it_3d", "bf16", "cl"), ("it_c16", "bf16", "cl")]
    others = [("dpx_1x1", "f16", "nchw_w"), ("vec_1x1", "bf16", "nchw_staged"), ("vec_xcl", "bf16", "x_cl"),
              ("c2", "bf16", "cl"), ("vec_nchw", "bf16", "nchw"), ("wide96", "bf16", "cl")]
    for name, dtype, layout in takes + others:
        problem = case_problem(BY_NAME[name], DTYPES[dtype][0], layout)
        for target in ("cuda-sm_80", "cuda-sm_90", "cuda-sm_90a", "hip-gfx90a"):
            dgrad = dict(igemm_context(problem, parse_target(target), "p", staged=_staged(layout)).tiles)["DGRAD"]
            wanted = ((name, dtype, layout) in takes and target.startswith("cuda")) or (
                name == "wide96" and target == "cuda-sm_90a")
            assert (dgrad.b_mn, dgrad.vector_b) == (wanted, wanted or dgrad.vector_b), (name, layout, target)
        f32 = case_problem(BY_NAME[name], DType.F32, layout)
        assert not dict(igemm_context(f32, parse_target("cuda"), "p", staged=_staged(layout)).tiles)["DGRAD"].b_mn
    source = render_igemm(case_problem(BY_NAME["dmn_1x1"], DType.BF16, "cl"), parse_target("cuda"), "p")
    assert "constexpr bool DGRAD_B_MN = true;" in source


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("name, layout", [("vec_nchw", "nchw"), ("it_pad", "cl"), ("dpx_1x1", "nchw")])
def test_misaligned_pointers_fall_back_to_element_copies(libs, vendor, name, layout):
    """Tensors whose data starts 2 bytes past a 16-byte boundary: the launch sees it and gathers
    element by element (a 16-byte copy there would fault on a device); results still match ATen.
    (it_pad: the kernel whose aligned loop copies by iterator; dpx_1x1: grad_output along its pixels.)"""
    case = BY_NAME[name]
    problem = case_problem(case, DType.BF16, layout)
    g = generator_for(f"igemm-misaligned-{vendor}")

    def shifted(shape, memory):   # storage beginning one bf16 element past an aligned one, in `memory`'s order
        flat = randn((1 + torch.Size(shape).numel(),), torch.bfloat16, g)[1:]
        if memory is not Layout.CHANNELS_LAST:
            return flat.view(shape)
        last = len(shape) - 1   # channels innermost: (N, *spatial, C) seen as (N, C, *spatial)
        return flat.view(shape[0], *shape[2:], shape[1]).permute(0, last, *range(1, last))

    x, w = shifted(problem.input_shape, problem.input_layout), shifted(problem.weight_shape, problem.weight_layout)
    dy = shifted(problem.output_shape, problem.output_layout)
    assert in_layout(x, problem.input_layout).data_ptr() == x.data_ptr()   # no aligned copy on the way in
    b = randn((problem.k,), torch.bfloat16, g)
    assert x.data_ptr() % 16 and w.data_ptr() % 16 and dy.data_ptr() % 16
    out = _run(libs[vendor], _prefix(vendor, name, "bf16", layout), problem, torch.bfloat16, x, w, b, dy, "shuffle", 3)
    terms = reduction_terms(problem.input_shape, problem.weight_shape, problem.output_shape)
    for what, got, ref in zip(("forward", "grad_input", "grad_weight", "grad_bias"), out, _reference(case, x, w, b, dy)):
        assert_close(got, ref, torch.bfloat16, f"{vendor} misaligned {what}", terms[what])


def test_the_batch_size_is_a_run_time_argument(libs):
    case = BY_NAME["c2"]
    problem = case_problem(case, DType.BF16)
    g = generator_for("igemm-batch")
    x = randn((1, *problem.input_shape[1:]), torch.bfloat16, g)
    w, b = randn(problem.weight_shape, torch.bfloat16, g), randn((problem.k,), torch.bfloat16, g)
    y = torch.full((1, *problem.output_shape[1:]), float("nan"), dtype=torch.bfloat16)
    p = sim.pointer
    libs["cuda"].call("cuda_c2_bf16_nchw_fwd", p(x), p(w), p(b), p(y), ctypes.c_longlong(1), None)
    assert_close(y, _reference(case, x, w, b, torch.zeros_like(y))[0], torch.bfloat16, "batch 1 forward", 36)


# ----------------------------------------------------------------------- the vendors' compilers


def _scalar_shared_loads(loop: list[str]) -> list[str]:
    """A main loop's scalar shared loads other than its tap tables' (igemm.cu.j2 TAP_TABLE: one LDS.64 a
    step for each operand's iterator that reads one, two at most): fragments come from ldmatrix."""
    loads = [x for x in loop if re.match(r"(@!?U?P\d\s+)?LDS\b", x)]
    tables = [x for x in loads if re.match(r"(@!?U?P\d\s+)?LDS\.64\s", x)]
    return loads if len(tables) > 2 else [x for x in loads if x not in tables]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
# sm_80 and sm_90 build the same mma.sync code (sm_90, the default CUDA target, differs in its stages:
# every configuration of it builds, with HMMA checked, in tests/gpu/test_cases_build.py); sm_90a its own
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_kernels_build_with_nvcc_without_spills_and_use_tensor_cores(tmp_path, arch):
    """sm_80 (as sm_90): mma.sync (HMMA.16816) on fragments by ldmatrix.x4 (LDSM); sm_90a: warpgroup MMA
    (HGMMA.64xNx16) reading both operands from the shared stages, no fragment loads at all."""
    wgmma = arch == "sm_90a"
    src = tmp_path / f"igemm_{arch}.cu"
    src.write_text(_source("cuda", arch))
    cubin = tmp_path / "igemm.cubin"
    done = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v,-warn-spills,-Werror",
                           "-I", str(sim_build.gpu_templates_dir()), str(src), "-o", str(cubin)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    report = done.stdout + done.stderr
    assert re.findall(r"(\d+) bytes spill stores", report) and set(re.findall(r"(\d+) bytes spill stores", report)) == {"0"}
    nvdisasm = cuda_tool("nvdisasm")
    if nvdisasm is None:
        pytest.skip("nvdisasm not found (CUDA toolkit or `pip install nvidia-cuda-nvdisasm`): machine code not checked")
    sass = subprocess.run([nvdisasm, str(cubin)], capture_output=True, text=True, check=True).stdout
    # every matrix kernel (fwd, bwd_data, bwd_weight_partial) of every variant uses the tensor cores
    functions = re.split(r"\n\s*\.text\.", sass)
    gemm_kernels = [f for f in functions if re.match(r"_ZN\w+(3fwd|8bwd_data|18bwd_weight_partial)E", f)]
    assert len(gemm_kernels) == 3 * len(PARAMS)
    for body in gemm_kernels:
        assert re.search(r"HGMMA\.64x(64|128)x16\.F32(\.BF16)? " if wgmma else r"HMMA\.16816\.F32(\.BF16)?", body), \
            body.split(":", 1)[0]
    # the GEMMs whose plan moves an operand by 16-byte copies do so with cp.async (LDGSTS), the
    # others never (their operands are gathered element by element)
    target = parse_target(f"cuda-{arch}")
    kernel_of = {"FWD": "3fwd", "DGRAD": "8bwd_data", "WGRAD": "18bwd_weight_partial"}
    for n, d, lay in PARAMS:
        context = igemm_context(case_problem(BY_NAME[n], DTYPES[d][0], lay), target, "p", staged=_staged(lay))
        tiles, alongs = dict(context.tiles), dict(context.out_along)
        prefix = _prefix("cuda", n, d, lay)
        for gemm, symbol in kernel_of.items():
            (body,) = [f for f in gemm_kernels if re.match(rf"_ZN{len(prefix)}{prefix}{symbol}E", f)]
            uses = bool(re.search(r"\bLDGSTS\b", body))
            assert uses == (tiles[gemm].vector_a or tiles[gemm].vector_b), (prefix, symbol, uses)
            # the epilogue: 16-byte stores (from the tile staged in shared memory) exactly where the
            # output is contiguous along the tile's columns or rows (out_along)
            assert bool(re.search(r"\bSTG\.E\.128\b", body)) == (alongs[gemm] != 0), (prefix, symbol, alongs[gemm])
            # the main loop's fragments come from ldmatrix.x4, none from scalar shared loads (LDS.U16
            # before issue 47; LDS.128 would match too, LDS.64 beyond the tap tables' one a step and operand). (How many LDSM per HMMA is not fixed:
            # ptxas drops the matrix instructions and loads of fragments no output column needs.)
            loop = main_loop(body)
            if wgmma:
                assert any(x.startswith("HGMMA.64x") for x in loop), (prefix, symbol)
                assert not [x for x in loop if x.startswith(("HMMA", "LDSM"))], (prefix, symbol)
                assert not _scalar_shared_loads(loop), (prefix, symbol)
                # warp-specialised: the consumer's loop waits on its stage's mbarrier, never at a block
                # barrier, and copies nothing; the producer's copies arrive on the stage's mbarrier. (Where
                # the reduction is one step, ptxas unrolls it: main_loop's span from the function's start
                # holds the barriers' initialisation and its __syncthreads before the first wait.)
                waits = [i for i, x in enumerate(loop) if x.startswith("SYNCS.PHASECHK")]
                assert waits, (prefix, symbol)
                assert not [x for x in loop[waits[0]:] if re.match(r"(@!?U?P\d\s+)?(BAR\.SYNC|LDGSTS)\b", x)], \
                    (prefix, symbol)
                assert bool(re.search(r"\bARRIVES\.LDGSTSBAR", body)) == uses, (prefix, symbol)
                continue
            assert any(x.startswith("HMMA.16816") for x in loop), (prefix, symbol)
            # (.MT88: transposed, from tiles of reduction rows: the channels-last weight gradient's, the
            # NCHW 1x1's A, the 1x1 data gradient's B; .M88 the others)
            transposed = (gemm == "WGRAD" and tiles[gemm].mn_major) or (tiles[gemm].a_mn and tiles[gemm].b_mn)
            assert any(x.startswith("LDSM.16.MT88.4 " if transposed else "LDSM.16.M88.4 ") for x in loop), (prefix, symbol)
            if tiles[gemm].a_mn or tiles[gemm].b_mn:
                assert any(x.startswith("LDSM.16.MT88.4 ") for x in loop), (prefix, symbol)
            assert not _scalar_shared_loads(loop), (prefix, symbol)


def hipcc_functions(directory: Path, source: str, name: str) -> dict[str, list[str]]:
    """`source` built by hipcc for gfx90a and gfx940 (HIP_PLATFORM=amd), asserted to succeed without
    scratch (spills); each arch's assembly split into its functions. The device code alone, to assembly
    (each arch's <name>-hip-amdgcn-amd-amdhsa-<arch>.s): the instructions `-c -save-temps` leaves, in
    about 70% of its CPU time (no host compile, no separate preprocessing; a 46,000-line file: 16.8 s
    against 23.2 s a arch)."""
    src = directory / f"{name}.cu"
    src.write_text(source)
    done = subprocess.run(["hipcc", "-x", "hip", "--offload-arch=gfx90a", "--offload-arch=gfx940", "--cuda-device-only",
                           "-S", "-Wno-unused-command-line-argument", "-Rpass-analysis=kernel-resource-usage", "-I", str(sim_build.gpu_templates_dir()),
                           str(src)], capture_output=True, text=True, cwd=directory,
                          env={**os.environ, "HIP_PLATFORM": "amd"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(re.findall(r"ScratchSize \[bytes/lane\]: (\d+)", done.stderr)) == {"0"}   # no spills to scratch
    return {arch: re.split(r"\n(?=_ZN\w+:)", next(directory.glob(f"{name}*{arch}*.s")).read_text())
            for arch in ("gfx90a", "gfx940")}


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="hipcc (apt: hipcc libamdhip64-dev) is not on PATH")
def test_the_kernels_build_with_hipcc_for_gfx90a_and_gfx940_and_use_matrix_cores(tmp_path):
    # the HIP source is the same for both archs; gfx90a spells the instructions
    # v_mfma_f32_16x16x16bf16_1k / ...f16, gfx940 ..._bf16 / ..._f16
    for arch, functions in hipcc_functions(tmp_path, _source("hip", "gfx90a"), "igemm_hip").items():
        gemm_kernels = [f for f in functions if re.match(r"_ZN\w+(3fwd|8bwd_data|18bwd_weight_partial)E\w*:", f)]
        assert len(gemm_kernels) == 3 * len(PARAMS), arch
        for body in gemm_kernels:
            assert re.search(r"v_mfma_f32_16x16x16_?(bf16_1k|bf16|f16)\b", body), (arch, body.split(":", 1)[0])
        # 16-byte staged copies: dwordx4 global loads and b128 LDS stores (not flat accesses)
        for n, d, lay in PARAMS:
            context = igemm_context(case_problem(BY_NAME[n], DTYPES[d][0], lay), parse_target(f"hip-{arch}"), "p",
                                    staged=_staged(lay))
            tiles, alongs = dict(context.tiles), dict(context.out_along)
            prefix = _prefix("hip", n, d, lay)
            for gemm, symbol in {"FWD": "3fwd", "DGRAD": "8bwd_data", "WGRAD": "18bwd_weight_partial"}.items():
                (body,) = [f for f in gemm_kernels if re.match(rf"_ZN{len(prefix)}{prefix}{symbol}E", f)]
                vector = tiles[gemm].vector_a or tiles[gemm].vector_b
                # (a copy whose address the compiler proves uniform may load with s_load_dwordx4 instead;
                # the weight gradient's fused bias loads channels-last rows 16 bytes a lane: context.bias_rows)
                bias_loads = gemm == "WGRAD" and context.bias_rows[0] > 1
                assert vector or bias_loads or not re.search(r"\bglobal_load_dwordx4\b", body), (arch, prefix, symbol)
                # (a weight gradient's copies along filters and channels land each chunk's 8 elements
                # in 8 K-major rows: ds_write_b16, the odd ones' high halves ds_write_b16_d16_hi)
                stores_of = r"\bds_write_b16_d16_hi\b" if tiles[gemm].mn_major else r"\bds_write_b128\b"
                assert vector == bool(re.search(stores_of, body)), (arch, prefix, symbol)
                # the epilogue's 16-byte stores where the output is contiguous along the tile's columns or rows
                # (a weight gradient's fused bias with channels-last rows keeps a lane's sums of consecutive
                # channels, f64 partials, which hipcc stores two a dwordx4: the stem's 16 filters)
                stores = bool(re.search(r"\bglobal_store_dwordx4\b", body))
                assert stores == (alongs[gemm] != 0) or (bias_loads and stores), (arch, prefix, symbol)
                # the main loop (machine_code's reading of hipcc's assembly): every fragment one 16-byte
                # read (hip.h's packs), the accumulators in ordinary registers (no AGPR copies a k-step:
                # CONVGEN_LAUNCH_BOUNDS' waves per SIMD), no narrower shared reads
                loop, _ = main_loop_parts(body, amd=True)
                ops = [x.split()[0] for x in loop]
                assert "ds_read_b128" in ops and any(op.startswith("v_mfma") for op in ops), (arch, prefix, symbol)
                assert not [op for op in ops if op.startswith(("v_accvgpr", "ds_read2", "ds_read_u16", "ds_read_b32",
                                                               "ds_read_b64"))], (arch, prefix, symbol, ops)


# ----------------------------------------------------------------------- sanitizers

ASAN_SCRIPT = r"""
import sys
from pathlib import Path
import test_igemm as T
from convgen.devices import sim
from convgen.building import sim_build
from convgen.codegen.gpu.igemm import render_igemm
from convgen.codegen.target import parse_target
from support.problems import case_problem, conv_problem
from support.reference import generator_for, randn
for vendor in sim_build.WARP:
    target = parse_target(vendor)
    source = "".join(render_igemm(case_problem(T.BY_NAME[n], T.DTYPES[d][0], lay), target, T._prefix(vendor, n, d, lay),
                                  staged=T._staged(lay))
                     for n, d, lay in T.SANITIZED)
    lib = sim.build(source, Path(sys.argv[1]), "asan_" + vendor, vendor, sanitize=True)
    for n, d, lay in T.SANITIZED:
        problem, torch_dtype = case_problem(T.BY_NAME[n], T.DTYPES[d][0], lay), T.DTYPES[d][1]
        g = generator_for("asan")
        x, w = randn(problem.input_shape, torch_dtype, g), randn(problem.weight_shape, torch_dtype, g)
        b, dy = randn((problem.k,), torch_dtype, g), randn(problem.output_shape, torch_dtype, g)
        T._run(lib, T._prefix(vendor, n, d, lay), problem, torch_dtype, x, w, b, dy, "shuffle", 3)
        print("ran", vendor, n, d, lay, flush=True)
print("all ran")
"""
# the edges: ragged channels in channels-last, taps-free phases, several tiles along M and N
SANITIZED = [("ragged", "bf16", "cl"), ("s3d1", "bf16", "nchw"), ("tiles", "bf16", "x_cl"),
             ("vec_cl", "bf16", "cl"), ("vec_nchw", "bf16", "nchw"),   # and the 16-byte copies' paths
             ("vec_3d", "bf16", "nchw_staged")]   # and the channels-last conversions


def test_the_kernels_run_clean_under_asan_and_ubsan(tmp_path):
    """Every access of every pass stays inside its tensor, workspace and shared array."""
    require_fp16()
    done = run_sanitized(ASAN_SCRIPT, tmp_path, __file__)
    text = done.stdout + done.stderr
    assert done.returncode == 0 and "all ran" in text, text
    assert "AddressSanitizer" not in text and "runtime error" not in text, text
    assert text.count("ran ") == 2 * len(SANITIZED)
