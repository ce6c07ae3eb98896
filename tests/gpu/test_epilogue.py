"""The implicit GEMM's epilogue (issue 47, item 5): where each GEMM's output is contiguous in 16-byte
chunks along the tile's columns (1) or rows (2), it goes through shared memory and out 16 bytes a
thread; elsewhere element by element (0). codegen/gpu/igemm.py out_along decides, the template
(templates/gpu/igemm.cu.j2's gemm_steps) follows it, and explain says it. The kernels themselves
are checked against ATen in the simulator (tests/gpu/test_igemm.py, its ep_rows case for the rows),
their 16-byte stores in the machine code (test_igemm's nvcc and hipcc checks), their whole sectors
and conflict-free staging in the simulator's profile (tests/sim/test_shared_banks.py)."""

from __future__ import annotations

import pytest

from convgen.codegen.gpu.igemm import igemm_context, out_along, tiles_of, wgrad_weight_order
from convgen.codegen.gpu.normal import Normal
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import parse_target

from support.problems import conv_problem

SM90, SM90A, HIP = parse_target("cuda-sm_90"), parse_target("cuda-sm_90a"), parse_target("hip-gfx90a")


def _along(size, stride=1, c=64, k=64, groups=1, layout=Layout.CHANNELS_LAST, dtype=DType.BF16, target=SM90, kernel=3):
    problem = conv_problem(2, c, k, (size, size), kernel, stride, kernel // 2, dtype=dtype, layout=layout, groups=groups,
                           bias=True).validate()
    return out_along(problem, target), problem


@pytest.mark.parametrize("target", [SM90, SM90A, HIP], ids=lambda t: t.name())
def test_channels_last_results_go_along_columns(target):
    alongs, _ = _along(14, target=target)
    assert alongs["FWD"] == alongs["DGRAD"] == 1
    alongs, _ = _along(14, stride=2, target=target)   # every stride phase's rows hold whole channel runs
    assert alongs["FWD"] == alongs["DGRAD"] == 1


def test_nchw_results_go_along_rows_where_an_image_is_whole_chunks():
    alongs, _ = _along(8, layout=Layout.CONTIGUOUS)     # 64 pixels an image: 8 chunks of 8
    assert (alongs["FWD"], alongs["DGRAD"]) == (2, 2)
    alongs, _ = _along(14, layout=Layout.CONTIGUOUS)    # 196 pixels: a chunk would cross images
    assert (alongs["FWD"], alongs["DGRAD"]) == (0, 0)
    alongs, _ = _along(16, stride=2, layout=Layout.CONTIGUOUS)   # 8x8 outputs; grad_input's phases are strided rows
    assert (alongs["FWD"], alongs["DGRAD"]) == (2, 0)


def test_a_groups_channels_not_whole_chunks_store_elements():
    alongs, _ = _along(8, c=24, k=24, groups=2)   # 12 a group: chunks would straddle groups
    assert (alongs["FWD"], alongs["DGRAD"]) == (0, 0)
    alongs, _ = _along(8, c=32, k=32, groups=2)   # 16 a group
    assert (alongs["FWD"], alongs["DGRAD"]) == (1, 1)


def test_the_fma_path_stores_elements():
    alongs, _ = _along(8, dtype=DType.F32)   # f32 without tf32: the FMA path
    assert set(alongs.values()) == {0}


def test_weight_gradient_partials_are_in_the_gemms_order_and_summed_into_the_weights():
    # the 16-bit channels-last weight gradient (CUDA's and HIP's: copies along channels) has tap-major
    # columns: the weight's own order (KRSC)
    for layout, target in ((Layout.CHANNELS_LAST, SM90), (Layout.CONTIGUOUS, SM90), (Layout.CHANNELS_LAST, HIP)):
        alongs, problem = _along(14, layout=layout, target=target)
        context = igemm_context(problem, target, "p")
        assert alongs["WGRAD"] == 1 and context.wgrad_weight_order
    # HIP's f32 weight gradient gathers its input by (channel, tap) columns: not the weight's order, so
    # bwd_weight_sum places the sums; the partials still go out 16 bytes at a time
    alongs, problem = _along(14, target=HIP, dtype=DType.F32)
    context = igemm_context(problem, HIP, "p")
    assert alongs["WGRAD"] == 1 and not context.wgrad_weight_order
    assert not wgrad_weight_order(Normal.of(problem), tiles_of(problem, HIP))
    # a group's (channel, tap) columns not whole 16-byte chunks of f32: element stores
    alongs, _ = _along(8, c=3, k=16, kernel=1)
    assert alongs["WGRAD"] == 0


def test_a_pass_that_does_not_fit_the_stages_stores_elements():
    # sm_90a's weight gradient of a small problem: 2 stages of 64 + 64 rows of 32 bf16 (16 KiB), and
    # a wgmma pass is a 64-row half: 64 x (64 + 8) f32 would not fit
    problem = conv_problem(1, 4, 1, (5, 5), 3, 1, 1, dtype=DType.BF16, layout=Layout.CONTIGUOUS, bias=True).validate()
    tiles = dict(igemm_context(problem, SM90A, "p").tiles)
    assert tiles["WGRAD"].shared_bytes < 64 * (tiles["WGRAD"].n + 8) * 4
    assert out_along(problem, SM90A)["WGRAD"] == 0
    assert out_along(problem, SM90)["WGRAD"] == 1   # mma.sync's least pass: 16 rows of each warp row


@pytest.mark.parametrize("op,layout,phrase", [
    (Op.FWD, Layout.CHANNELS_LAST, "the bias added, then 16-byte stores along the tile's columns"),
    (Op.FWD, Layout.CONTIGUOUS, "16-byte stores along the tile's rows (an image's consecutive pixels)"),
    (Op.BWD_WEIGHT, Layout.CHANNELS_LAST, "the split's f32 partials (in the GEMM's order"),
])
def test_the_tiling_reason_names_the_epilogue(op, layout, phrase):
    problem = conv_problem(2, 64, 64, (8, 8), 3, 1, 1, op=op, dtype=DType.BF16, layout=layout, bias=True).validate()
    plan = lower(problem, SM90)
    (tiling,) = [reason for name, reason in plan.reasons if name == "tiling"]
    assert phrase in tiling, tiling
