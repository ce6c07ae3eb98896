"""The lanes forward's and data gradient's chunks of the reduction (lanes._chunk): 1x1 kernels
reading channels last on the AVX-512 shape take chunks of up to two L1s (CHUNK_L1S_1X1_CL), so
ShuffleNet's 80 channels a group reduce in one chunk (not 76 + 4); other kernels keep one L1.

The kernels run the AVX-512 shape (natively where this CPU has AVX-512, else compiled for this
host) against ATen in float64, every dtype, grouped, with several chunks and one, the output
poisoned with NaN first.
"""

from __future__ import annotations

import pytest

from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower

from support.builds import load_keyed
from support.code_shapes import x86_shape
from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient, generator_for

AVX512 = x86_shape("avx512", l1_bytes=48 * 1024, l2_bytes=2 * 1024 * 1024)


def _lanes(op, c, k, groups=1, kernel=(1, 1), dtype=DType.F32, layout=Layout.CHANNELS_LAST, size=(7, 9)):
    pad = 0 if kernel == (1, 1) else 1
    p = conv_problem(2, c, k, size, kernel, 1, pad, 1, groups, op=op, dtype=dtype, layout=layout)
    return lower(p, AVX512, algorithm="lanes")


def test_shufflenets_groups_reduce_in_one_chunk_only_for_1x1_channels_last():
    assert _lanes(Op.FWD, 240, 240, groups=3).tiling.rb == 80
    assert _lanes(Op.FWD, 240, 240, groups=3, layout=Layout.CONTIGUOUS).tiling.rb < 80
    one_l1 = _lanes(Op.FWD, 512, 64, layout=Layout.CONTIGUOUS).tiling.rb
    assert _lanes(Op.FWD, 512, 64).tiling.rb >= 2 * one_l1 - 1
    assert _lanes(Op.FWD, 80, 80, kernel=(3, 3)).tiling.rb == _lanes(Op.FWD, 80, 80, kernel=(3, 3),
                                                                     layout=Layout.CONTIGUOUS).tiling.rb
    plan = _lanes(Op.FWD, 240, 240, groups=3)
    assert "two L1s" in "; ".join(r for _, r in plan.reasons)


# (name, op, c, k, groups): one chunk (80 a group) and several uneven ones (1000 channels reduced)
CASES = [
    ("g3_80_fwd", Op.FWD, 240, 240, 3),
    ("g3_80_dgrad", Op.BWD_DATA, 240, 240, 3),
    ("1000_fwd", Op.FWD, 1000, 48, 1),
    ("1000_dgrad", Op.BWD_DATA, 48, 1000, 1),
]
DTYPES = [DType.F32, DType.F64, DType.BF16]


def _plans():
    for name, op, c, k, groups in CASES:
        for dtype in DTYPES:
            yield (name, dtype), _lanes(op, c, k, groups, dtype=dtype)


@pytest.fixture(scope="module")
def kernels():
    return load_keyed(_plans())


@pytest.mark.parametrize("dtype", DTYPES, ids=[d.value for d in DTYPES])
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_1x1_channels_last_chunks_match_aten(kernels, name, dtype):
    plan, kernel = kernels[(name, dtype)]
    check_forward_or_data_gradient(kernel, plan.problem, generator_for(f"{name}-{dtype.value}"))
