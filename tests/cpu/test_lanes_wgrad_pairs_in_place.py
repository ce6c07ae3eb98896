"""The lanes weight gradient in bf16 pairs reading a channels-last grad_output in place (GY_PAIRS).

Where bf16 is reduced in pairs of pixels (vdpbf16ps), grad_output is channels last with rows of an
even width, its groups are whole blocks of twice the lanes' channels and there are at most
PAIRS_IN_PLACE_MAX_ROWS (input channel, tap) rows, each step of the tile loads a block at its two
pixels where they lie and interleaves them in registers (a block's even channels in one vector, its
odd ones in the next; groups of whole vectors but not whole blocks: one vector, its channels shuffled
into pairs in order), and the bias sums come from the tiles (a row of ones in each part's first
row tile), where the pack wrote a pair-major copy of grad_output and summed the bias from it.

Each case is checked against ATen in float64, with and without the bias gradient: on the portable
target (the instruction's arithmetic emulated in C) on every host, and in assembly on ymm and zmm
registers where the CPU has AVX512-BF16; results are checked to be the same bits for any thread
count, and the plans to take the path exactly where they should.
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

from convgen.codegen.emit import emit
from convgen.codegen.cpu.lanes_wgrad import PAIRS_IN_PLACE_MAX_ROWS
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import Target, TargetKind, cpu_target, host_bf16_dot, host_isas

from support.builds import load_keyed
from support.problems import conv_problem
from support.reference import in_channels_last, rel_err, tolerance

CL = Layout.CHANNELS_LAST
PORTABLE = Target(TargetKind.CPU, "generic", 16, bf16_dot=True)   # C vector code, vdpbf16ps emulated
TARGETS = {"portable": PORTABLE, "ymm": cpu_target("avx2", bf16_dot=True), "zmm": cpu_target("avx512", bf16_dot=True)}


def _runs(which: str) -> bool:
    return which == "portable" or (host_bf16_dot() and (which == "ymm" or "avx512" in host_isas()))


# (name, problem arguments): every group's output channels whole vectors on every target (zmm: 16
# channels; whole blocks of two vectors but where named)
CASES = [
    ("one_vector", dict(n=2, c=3, k=16, size=(8, 10), kernel=1, pad=0)),        # zmm: one vector, in order
    ("three_vectors", dict(n=2, c=5, k=48, size=(4, 6), kernel=3)),             # zmm: 3 items of one vector
    ("1x1_blocks", dict(n=3, c=16, k=96, size=(6, 10), kernel=1, pad=0)),       # 3 blocks, rows flattened
    ("3x3_pad", dict(n=2, c=3, k=64, size=(7, 12), kernel=3)),                  # an RGB stem's 27 rows
    ("grouped", dict(n=2, c=8, k=64, size=(5, 6), kernel=1, pad=0, groups=2)),   # one block a group
    ("stride2", dict(n=2, c=6, k=32, size=(9, 12), kernel=3, stride=2)),        # output rows of 6
    ("3d", dict(n=1, c=2, k=32, size=(3, 4, 6), kernel=3)),
]
NO_BIAS = ("1x1_blocks", "3d")
# one vector in order on the narrower targets too (whole vectors there, not whole blocks of two)
CASES += [("one_vector_ymm", dict(n=2, c=4, k=24, size=(3, 8), kernel=3)),
          ("one_vector_portable", dict(n=2, c=3, k=12, size=(5, 4), kernel=1, pad=0))]
ONLY = {"one_vector_ymm": "ymm", "one_vector_portable": "portable"}


def _applies(name: str, which: str) -> bool:
    return _runs(which) and ONLY.get(name, which) == which


def _plan(kw: dict, target: Target, bias: bool = True):
    return lower(conv_problem(**kw, op=Op.BWD_WEIGHT, dtype=DType.BF16, layout=CL, bias=bias), target,
                 algorithm="lanes")


def _keys():
    for name, kw in CASES:
        for bias in (True, False) if name in NO_BIAS else (True,):
            for which in TARGETS:
                if _applies(name, which):
                    yield (name, bias, which), _plan(kw, TARGETS[which], bias)
    for which in TARGETS:   # the reduction in 3 fixed parts (the plans of more blocks take 1)
        if _runs(which):
            plan = _plan(CASES[0][1], TARGETS[which])
            yield ("parts", which), dataclasses.replace(plan, tiling=dataclasses.replace(plan.tiling, splits=3))


@pytest.fixture(scope="module")
def kernels():
    return load_keyed(_keys())


def _run(kernel, plan, gen, threads: int = 2):
    p = plan.problem
    x = in_channels_last(torch.randn(p.input_shape, generator=gen, dtype=torch.float64).to(torch.bfloat16))
    gy = in_channels_last(torch.randn(p.output_shape, generator=gen, dtype=torch.float64).to(torch.bfloat16))
    gw = in_channels_last(torch.full(p.weight_shape, float("nan"), dtype=torch.bfloat16))
    gb = torch.full((p.k,), float("nan"), dtype=torch.bfloat16) if p.bias else None
    kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb}, p.n, threads)
    return x, gy, gw, gb


PARAMS = [(name, kw, which) for name, kw in CASES for which in TARGETS if ONLY.get(name, which) == which]


@pytest.mark.parametrize("name, kw, which", PARAMS, ids=[f"{name}-{which}" for name, _, which in PARAMS])
def test_pairs_from_grad_output_in_place_match_aten(kernels, name, kw, which):
    if not _runs(which):
        pytest.skip("this CPU has no AVX512-BF16 (or no AVX-512 for zmm): the portable target runs the same plans")
    for bias in (True, False) if name in NO_BIAS else (True,):
        plan, kernel = kernels[(name, bias, which)]
        lanes = plan.tiling.vector_lanes
        assert plan.tiling.pairs and "Y" in plan.tiling.in_place, plan.reasons
        assert plan.tiling.nv == (2 if kw["k"] // kw.get("groups", 1) % (2 * lanes) == 0 else 1), plan.tiling
        assert "constexpr bool GY_PAIRS = GY_IN_PLACE && PAIRS" in emit(plan).text
        p = plan.problem
        x, gy, gw, gb = _run(kernel, plan, torch.Generator().manual_seed(zlib.crc32(f"{name}-{bias}".encode())))
        args = (list(p.stride), [lo for lo, _ in p.padding], list(p.dilation), False, list(p.output_padding),
                p.groups)
        _, ref_w, ref_b = torch.ops.aten.convolution_backward(
            gy.double(), x.double(), torch.empty(p.weight_shape, dtype=torch.float64), [p.k], *args,
            [False, True, bias])
        terms = p.n * torch.Size(p.output_shape[2:]).numel()
        assert rel_err(gw, ref_w) <= tolerance(torch.bfloat16, terms), f"grad_weight rel err {rel_err(gw, ref_w):.2e}"
        if bias:
            assert rel_err(gb, ref_b) <= tolerance(torch.bfloat16, terms), f"grad_bias rel err {rel_err(gb, ref_b):.2e}"


@pytest.mark.parametrize("which", list(TARGETS))
def test_pairs_in_place_results_do_not_depend_on_the_thread_count(kernels, which):
    if not _runs(which):
        pytest.skip("this CPU has no AVX512-BF16 (or no AVX-512 for zmm)")
    plan, kernel = kernels[("parts", which)]
    runs = [_run(kernel, plan, torch.Generator().manual_seed(7), threads) for threads in (1, 2, 3)]
    for _, _, gw, gb in runs[1:]:
        assert torch.equal(gw, runs[0][2]) and torch.equal(gb, runs[0][3])


@pytest.mark.parametrize("kw, why", [
    (dict(n=2, c=16, k=96, size=(5, 7), kernel=1, pad=0), "35 pixels a row (1x1 flattened): a step would cross it"),
    (dict(n=2, c=5, k=64, size=(7, 9), kernel=3), "rows of 9: pairs end with a virtual pixel"),
    (dict(n=2, c=16, k=40, size=(6, 8), kernel=1, pad=0), "40 channels: not whole vectors of 16"),
    (dict(n=2, c=PAIRS_IN_PLACE_MAX_ROWS + 8, k=64, size=(6, 8), kernel=1, pad=0), "more rows: the pack pays"),
])
def test_grad_output_packed_where_pairs_in_place_do_not_apply(kw, why):
    plan = _plan(kw, TARGETS["zmm"])
    assert plan.tiling.pairs and "Y" not in plan.tiling.in_place, why
    assert "grad_output packed pixel-major" in "; ".join(r for _, r in plan.reasons), why
    assert "constexpr bool GY_IN_PLACE = false" in emit(plan).text   # (so GY_PAIRS is false)


def test_pairs_in_place_only_for_bf16_pairs_in_channels_last():
    kw = CASES[0][1]
    nchw = lower(conv_problem(**kw, op=Op.BWD_WEIGHT, dtype=DType.BF16), TARGETS["zmm"], algorithm="lanes")
    assert nchw.tiling.pairs and "Y" not in nchw.tiling.in_place
    for unpaired in (lower(conv_problem(**kw, op=Op.BWD_WEIGHT, layout=CL), TARGETS["zmm"], algorithm="lanes"),
                     _plan(kw, cpu_target("avx512"))):   # f32; bf16 without vdpbf16ps
        assert not unpaired.tiling.pairs
        assert "interleaved in registers" not in "; ".join(r for _, r in unpaired.reasons)
