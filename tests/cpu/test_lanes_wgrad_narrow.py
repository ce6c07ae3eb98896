"""The lanes weight gradient's narrower vectors for f32 groups of 24 output channels on the AVX-512
code shape (lanes_wgrad.narrow_lanes, NARROW_MAX_FILL): three ymm vectors fill all their lanes
where two zmm vectors leave a quarter idle, and a channels-last grad_output is then read in place.

Each case runs the AVX-512 shape (natively where this CPU has AVX-512, else compiled for this host:
support/code_shapes.py) against ATen in float64, in both layouts, with and without the bias
gradient, grad_weight poisoned with NaN first; and the rule's edges are checked on the plans.
"""

from __future__ import annotations

import functools

import pytest

from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower

from support.builds import load_keyed
from support.code_shapes import x86_shape
from support.problems import conv_problem
from support.reference import check_weight_gradient, generator_for

AVX512 = x86_shape("avx512")
_problem = functools.partial(conv_problem, op=Op.BWD_WEIGHT)

# (name, problem arguments): 24 output channels a group
CASES = [
    ("1x1", dict(n=2, c=20, k=24, size=(9, 11), kernel=(1, 1), pad=0)),
    ("3x3_pad", dict(n=2, c=6, k=24, size=(7, 9), kernel=(3, 3))),
    ("stride2_groups", dict(n=2, c=10, k=48, size=(9, 10), kernel=(3, 3), stride=2, groups=2)),
    ("3d", dict(n=1, c=3, k=24, size=(3, 5, 6), kernel=(3, 3, 3))),
]
LAYOUTS = {"nchw": Layout.CONTIGUOUS, "cl": Layout.CHANNELS_LAST}


def _plans():
    for name, kw in CASES:
        for lay, layout in LAYOUTS.items():
            for bias in (True, False):
                yield (name, lay, bias), lower(_problem(**kw, layout=layout, bias=bias), AVX512, algorithm="lanes")


@pytest.fixture(scope="module")
def kernels():
    return load_keyed(_plans())


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("lay", list(LAYOUTS))
@pytest.mark.parametrize("name, kw", CASES, ids=[c[0] for c in CASES])
def test_24_channel_weight_gradient_on_ymm_matches_aten(kernels, name, kw, lay, bias):
    plan, kernel = kernels[(name, lay, bias)]
    assert plan.tiling.vector_lanes == 8 and plan.tiling.nv == 3, plan.tiling
    if lay == "cl":
        assert "Y" in plan.tiling.in_place, plan.tiling   # the ymm blocks are whole: grad_output read in place
    check_weight_gradient(kernel, plan.problem, generator_for(f"{name}-{lay}-{bias}"))


@pytest.mark.parametrize("k, dtype, lanes", [
    (40, DType.F32, 16),    # zmm fills 40 of 48 lanes: kept (measured tied)
    (56, DType.F32, 16),    # 56 of 64: zmm measured faster
    (20, DType.F32, 16),    # ymm would leave lanes idle too (20 of 24)
    (24, DType.F64, 8),     # f64's vectors hold 8 already
    (24, DType.BF16, None),  # bf16 keeps its own width (not narrowed by this rule)
    (8, DType.F32, 8),      # few channels: narrowed by the older rule (at most half a vector)
])
def test_the_rule_narrows_only_24_channel_f32_groups(k, dtype, lanes):
    plan = lower(_problem(n=2, c=6, k=k, size=(7, 9), kernel=(3, 3), dtype=dtype, layout=Layout.CHANNELS_LAST),
                 AVX512, algorithm="lanes")
    wide = lower(_problem(n=2, c=6, k=64, size=(7, 9), kernel=(3, 3), dtype=dtype, layout=Layout.CHANNELS_LAST),
                 AVX512, algorithm="lanes")
    assert plan.tiling.vector_lanes == (lanes or wide.tiling.vector_lanes), plan.tiling
