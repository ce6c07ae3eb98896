"""Lanes tiles skip the taps that read only zero padding (SKIP_TAPS, templates/cpu/lanes_body.j2).

A tile of the lanes forward (or stride-1 data gradient) whose pixels all lie where a kd or kh tap
falls into the padding leaves that tap out; the others still read the padded copy. Checked against
ATen in float64, forced onto lanes, NCHW and channels last: padding wider than the kernel's reach
(border pixels read nothing but padding: forward outputs are the bias), 3-D, dilation with padding,
uneven padding, rows wider than a tile, 1x1 kernels with padding, small images whose tiles span
several rows, and bf16 and f64.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from convgen.codegen.emit import emit
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import host_cpu

from support.builds import kernels_by_key
from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient

CASES = [
    ("pad_beyond_reach", dict(n=2, c=5, k=20, size=(5, 6), kernel=(3, 3), pad=3)),
    ("3d", dict(n=2, c=6, k=18, size=(4, 5, 6), kernel=(3, 3, 3), pad=1)),
    ("dilated", dict(n=2, c=7, k=17, size=(9, 10), kernel=(3, 3), pad=2, dil=2)),
    ("uneven", dict(n=2, c=5, k=16, size=(7, 9), kernel=(3, 2), pad=((2, 0), (0, 3)), dil=(1, 2))),
    ("wide_rows", dict(n=1, c=4, k=32, size=(4, 70), kernel=(3, 3), pad=1)),
    ("1x1_padded", dict(n=2, c=8, k=16, size=(6, 7), kernel=(1, 1), pad=1)),
    ("3d_tall_kernel", dict(n=1, c=3, k=16, size=(3, 4, 4), kernel=(5, 3, 1), pad=(2, 1, 0))),
    ("bf16", dict(n=2, c=6, k=20, size=(6, 8), kernel=(3, 3), pad=1, dtype=DType.BF16)),
    ("f64", dict(n=2, c=5, k=12, size=(6, 8), kernel=(3, 3), pad=1, dtype=DType.F64)),
]
LAYOUTS = [Layout.CONTIGUOUS, Layout.CHANNELS_LAST]


def _keys():
    return [(name, layout, op) for name, _ in CASES for layout in LAYOUTS for op in (Op.FWD, Op.BWD_DATA)]


@pytest.fixture(scope="module")
def kernels():
    def plan_for(name, layout, op):
        return lower(conv_problem(**dict(CASES)[name], op=op, layout=layout), host_cpu(), algorithm="lanes")
    return kernels_by_key(_keys(), plan_for)


@pytest.mark.parametrize("op", [Op.FWD, Op.BWD_DATA], ids=["fwd", "bwd_data"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["nchw", "channels_last"])
@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_tiles_that_skip_padding_taps_match_aten(kernels, name, layout, op):
    plan, kernel = kernels[(name, layout, op)]
    assert plan.algorithm == "lanes" and "constexpr bool SKIP_TAPS" in emit(plan).text
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}{layout}{op}".encode()))
    check_forward_or_data_gradient(kernel, plan.problem, gen)
