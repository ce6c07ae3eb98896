"""Lanes register tiles of 5 and 6 vectors of channels (codegen/cpu/lanes.py, LANES_WIDEST).

With 32 vector registers the lanes forward, data gradient and weight gradient take tiles of up to
6 vectors of channels where that fills more lanes than any tile of 4: 80 channels a group
(ShuffleNet's 3-group 1x1, 240 -> 240) as one block of 5 vectors, not 3 + 2 vectors of a 3-vector
tile. Checked against ATen in float64 on this CPU's code shape, forced onto lanes, NCHW and
channels last, every pass, f32, bf16 and f64, with groups, padding, stride and 3-D; where the host
has 32 registers the cases must take the wide tile. And the planner's choice on given targets.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target, host_cpu

from support.builds import kernels_by_key
from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient, check_weight_gradient

# name, problem (the channels per group of its result, and of its input where it has a data gradient: 5
# or 10 vectors of 16 lanes)
CASES = [
    ("grouped_1x1", dict(n=2, c=240, k=240, size=(6, 7), kernel=(1, 1), pad=0, groups=3)),
    ("pad_3x3", dict(n=2, c=80, k=80, size=(7, 9), kernel=(3, 3), pad=1)),
    ("strided", dict(n=2, c=16, k=80, size=(9, 11), kernel=(3, 3), pad=1, stride=2)),
    ("c160_3d", dict(n=1, c=160, k=160, size=(3, 4, 5), kernel=(3, 1, 3), pad=1)),
    ("bf16", dict(n=2, c=80, k=80, size=(5, 6), kernel=(3, 3), pad=1, dtype=DType.BF16)),
    ("f64", dict(n=2, c=80, k=80, size=(5, 6), kernel=(1, 1), pad=0, dtype=DType.F64)),
]
LAYOUTS = [Layout.CONTIGUOUS, Layout.CHANNELS_LAST]


def _keys():
    return [(name, layout, op) for name, spec in CASES for layout in LAYOUTS
            for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT) if op is not Op.BWD_DATA or spec.get("stride", 1) == 1]


def _plan(name, layout, op):
    spec = dict(CASES)[name]
    return lower(conv_problem(**spec, op=op, layout=layout), host_cpu(), algorithm="lanes")


@pytest.fixture(scope="module")
def kernels():
    return kernels_by_key(_keys(), _plan)


@pytest.mark.parametrize("key", _keys(), ids=lambda k: f"{k[0]}-{'nchw' if k[1] is Layout.CONTIGUOUS else 'cl'}-{k[2].value}")
def test_wide_tiles_match_aten(kernels, key):
    name, layout, op = key
    plan, kernel = kernels[key]
    if plan.target.tile_registers >= 32:
        # 80 channels a group: 5 vectors of 16 f32 lanes (f64: 10 vectors of 8, in two blocks of 5)
        assert plan.tiling.nv == 5, plan.tiling
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}{layout}{op}".encode()))
    check = check_weight_gradient if op is Op.BWD_WEIGHT else check_forward_or_data_gradient
    check(kernel, plan.problem, gen)


@pytest.mark.parametrize("op", [Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT], ids=["fwd", "bwd_data", "bwd_weight"])
def test_planner_takes_wide_tiles_only_where_they_fill_more_lanes(op):
    """AVX-512 (32 registers, 16 lanes): 80 and 160 channels take 5-vector tiles (5 x 5); 64, 96,
    128 and 240 keep tiles of at most 4 vectors, which fill their lanes as well (240: five blocks of
    3); AVX2 (16 registers) never takes more than 4."""
    wide = cpu_target("avx512", 48 * 1024, 2 << 20)
    narrow = cpu_target("avx2", 32 * 1024, 512 * 1024)

    def nv(channels, target):
        c, k = (channels, 32) if op is Op.BWD_DATA else (32, channels)
        problem = conv_problem(8, c, k, (14, 14), (3, 3), pad=1, op=op, layout=Layout.CHANNELS_LAST)
        return lower(problem, target, algorithm="lanes").tiling

    for channels in (80, 160):
        t = nv(channels, wide)
        assert (t.nv, t.kb) == (5, 5), (channels, t)
    for channels in (64, 96, 128, 240):
        assert nv(channels, wide).nv <= 4, channels
    for channels in (40, 80, 96, 160, 240):
        assert nv(channels, narrow).nv <= 4, channels
