"""Rules of the AVX-512 shape measured on the Xeon (2026-12-03).

The weight gradient's gemm-or-lanes rule (codegen/cpu/gemm.py, WIDE_1X1_LANES_PLANE): unit-stride 1x1
kernels that widen, run over large images or narrow to fewer than 256 channels (GEMM_WGRAD_1X1_MIN_OUT),
and problems of few (input channel, tap) rows, take lanes there (f32); narrowing 1x1 kernels to 256 or
more channels over small images keep gemm; AVX2 and bf16 keep their rules. Strided
problems into channels last (codegen/cpu/lanes.py, CL_STRIDED_MARGIN_AVX512): lanes unless blocked's
tile scores above lanes' (AVX2: within 5%). And the lanes kernels of such problems, on this CPU,
against ATen in float64.
"""

from __future__ import annotations

import pytest
import torch

from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target, host_cpu

from support.builds import kernels_by_key, load_keyed
from support.problems import conv_problem
from support.reference import check_weight_gradient, rel_err, tolerance

AVX512 = cpu_target("avx512", 48 * 1024, 2 << 20)
AVX2 = cpu_target("avx2", 32 * 1024, 512 * 1024)

# name, (c, k, size, kernel, stride, pad), the AVX-512 f32 choice
RULES = [
    ("r50_1x1_256_64", (256, 64, (56, 56), 1, 1, 0), "lanes"),      # 3136 output pixels an image
    ("r50_1x1_256_1024", (256, 1024, (14, 14), 1, 1, 0), "lanes"),  # widening
    ("r50_1x1_512_2048", (512, 2048, (7, 7), 1, 1, 0), "lanes"),
    ("r50_1x1_1024_256", (1024, 256, (14, 14), 1, 1, 0), "gemm"),   # narrowing, 196 pixels
    ("r50_1x1_2048_512", (2048, 512, (7, 7), 1, 1, 0), "gemm"),
    ("r50_1x1_512_128", (512, 128, (28, 28), 1, 1, 0), "lanes"),   # narrowing to fewer than 256 channels
    ("mb_pw_960_160", (960, 160, (7, 7), 1, 1, 0), "lanes"),
    ("r50_ds_256_512_s2", (256, 512, (56, 56), 1, 2, 0), "gemm"),   # strided 1x1: as before
    ("vgg_3_64", (3, 64, (224, 224), 3, 1, 1), "lanes"),            # 27 rows
    ("c3_k64_s2", (3, 64, (224, 224), 3, 2, 1), "lanes"),
]


@pytest.mark.parametrize("name,spec,taken", RULES, ids=[r[0] for r in RULES])
@pytest.mark.parametrize("layout", [Layout.CONTIGUOUS, Layout.CHANNELS_LAST], ids=["nchw", "cl"])
def test_avx512_weight_gradient_rule(name, spec, taken, layout):
    c, k, size, kernel, stride, pad = spec
    problem = conv_problem(8, c, k, size, kernel, stride=stride, pad=pad, op=Op.BWD_WEIGHT, layout=layout)
    assert lower(problem, AVX512).algorithm == taken
    # AVX2 (16 registers) keeps gemm; bf16 is left to its own rules
    assert lower(problem, AVX2).algorithm == "gemm"
    bf16 = conv_problem(8, c, k, size, kernel, stride=stride, pad=pad, op=Op.BWD_WEIGHT, layout=layout,
                        dtype=DType.BF16)
    why = dict(lower(bf16, AVX512).reasons)["algorithm"]
    assert "not gemm: a 1x1" not in why and "lanes' on AVX-512" not in why, why


SMALL = {"wide_1x1": dict(n=2, c=16, k=48, size=(6, 7), kernel=1, pad=0),
         "large_1x1": dict(n=1, c=64, k=64, size=(48, 48), kernel=1, pad=0),
         "few_rows": dict(n=2, c=3, k=64, size=(11, 13), kernel=3, pad=1),
         "few_rows_s2": dict(n=2, c=3, k=64, size=(11, 13), kernel=3, pad=1, stride=2),
         "narrow_1x1": dict(n=3, c=272, k=80, size=(5, 6), kernel=1, pad=0)}
KEYS = [(name, layout) for name in SMALL for layout in (Layout.CONTIGUOUS, Layout.CHANNELS_LAST)]


@pytest.fixture(scope="module")
def kernels():
    return kernels_by_key(KEYS, lambda name, layout: lower(conv_problem(**SMALL[name], op=Op.BWD_WEIGHT, layout=layout),
                                                           host_cpu(), algorithm="lanes"))


@pytest.mark.parametrize("key", KEYS, ids=lambda k: f"{k[0]}-{'nchw' if k[1] is Layout.CONTIGUOUS else 'cl'}")
def test_lanes_weight_gradient_of_the_rules_problems_matches_aten(kernels, key):
    plan, kernel = kernels[key]
    check_weight_gradient(kernel, plan.problem, torch.Generator().manual_seed(11))


# name, (c, k, size, kernel, stride, pad, output_padding), kernel op asked, the AVX-512 choice
STRIDED_CL = [
    ("tconv_3x3_s2_op_fwd", (64, 32, (32, 32), 3, 2, 1, 1), Op.FWD, "lanes"),
    ("tconv_3x3_s2_op_dgrad", (64, 32, (32, 32), 3, 2, 1, 1), Op.BWD_DATA, "lanes"),
    ("tconv_to_rgb_dgrad", (64, 3, (64, 64), 4, 2, 1, 0), Op.BWD_DATA, "lanes"),
    ("tconv_to_rgb_fwd", (64, 3, (64, 64), 4, 2, 1, 0), Op.FWD, "blocked"),   # 3 channels written
]


@pytest.mark.parametrize("name,spec,op,wide", STRIDED_CL, ids=[r[0] for r in STRIDED_CL])
def test_strided_transposed_into_channels_last_take_lanes_on_avx512(name, spec, op, wide):
    """Tile scores within 1% (blocked 1.02, lanes 1.03): lanes on AVX-512, where 5% had kept blocked."""
    c, k, size, kernel, stride, pad, out_pad = spec
    problem = conv_problem(8, c, k, size, kernel, stride=stride, pad=pad, op=op, transposed=True,
                           output_padding=out_pad, layout=Layout.CHANNELS_LAST)
    plan = lower(problem, AVX512)
    assert plan.algorithm == wide, dict(plan.reasons)["algorithm"]


@pytest.mark.parametrize("op", [Op.FWD, Op.BWD_DATA], ids=["fwd", "bwd_data"])
def test_lanes_on_strided_transposed_channels_last_matches_aten(op):
    """The transposed 3x3 stride-2 problem, small, on lanes as the rule now takes it, against ATen."""
    problem = conv_problem(2, 24, 16, (7, 9), 3, stride=2, pad=1, op=op, transposed=True, output_padding=1,
                           layout=Layout.CHANNELS_LAST, bias=False)
    plan = lower(problem, host_cpu(), algorithm="lanes")
    (_, kernel), = load_keyed([(0, plan)]).values()
    gen = torch.Generator().manual_seed(5)
    fmt = torch.channels_last
    x = torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).float().contiguous(memory_format=fmt)
    w = torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64).float().contiguous(memory_format=fmt)
    args = ([2, 2], [1, 1], [1, 1], True, [1, 1], 1)
    if op is Op.FWD:
        out = torch.full(problem.output_shape, float("nan")).contiguous(memory_format=fmt)
        kernel({"input": x, "weight": w, "bias": None, "output": out}, problem.n, 2)
        ref = torch.ops.aten.convolution(x.double(), w.double(), None, *args)
    else:
        gy = torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).float().contiguous(memory_format=fmt)
        out = torch.full(problem.input_shape, float("nan")).contiguous(memory_format=fmt)
        kernel({"grad_output": gy, "weight": w, "grad_input": out}, problem.n, 2)
        ref = torch.ops.aten.convolution_backward(gy.double(), x.double(), w.double(), None, *args,
                                                  (True, False, False))[0]
    assert rel_err(out, ref) <= tolerance(torch.float32, 16 * 9), rel_err(out, ref)


# Forward patches (kernel = stride) into channels last below AVX-512 (codegen/cpu/pointwise.py,
# PATCH_CL_LANES_MAX_TAPS): lanes up to 8x8 taps, pointwise for ViT's 16x16; channel planes keep the
# rules measured on Zen 3 (pointwise for these)
PATCHES = [("4x4_3_96", (3, 96, (224, 224), 4), "lanes"), ("8x8_3_256", (3, 256, (256, 256), 8), "lanes"),
           ("16x16_3_768", (3, 768, (224, 224), 16), "pointwise"), ("2x2_3_128", (3, 128, (128, 128), 2), "lanes")]


@pytest.mark.parametrize("name,spec,taken", PATCHES, ids=[p[0] for p in PATCHES])
def test_patches_into_channels_last_below_avx512(name, spec, taken):
    c, k, size, kernel = spec
    problem = conv_problem(8, c, k, size, kernel, kernel, 0, layout=Layout.CHANNELS_LAST)
    assert lower(problem, AVX2).algorithm == taken
    assert lower(problem, AVX512).algorithm == "lanes"
    if kernel in (4, 8):
        assert lower(conv_problem(8, c, k, size, kernel, kernel, 0), AVX2).algorithm == "pointwise"


def test_lanes_on_patches_into_channels_last_matches_aten():
    from support.code_shapes import x86_shape
    from support.reference import check_forward_or_data_gradient
    problem = conv_problem(2, 3, 24, (13, 18), 4, 4, 0, layout=Layout.CHANNELS_LAST, bias=True)
    plan = lower(problem, x86_shape("avx2"))
    assert plan.algorithm == "lanes", plan.reasons
    (kernel,) = load_keyed([("k", plan)]).values()
    check_forward_or_data_gradient(kernel[1], problem, torch.Generator().manual_seed(4))


# Channels-last 1x1 kernels below AVX-512 (codegen/cpu/pointwise.py, CL_LANES_MAX_REDUCED_AVX2): lanes
# where at most 144 channels are reduced (the forward's input channels, the data gradient's output
# channels), pointwise from 256, and strided data gradients keep their rule. (layer's c, k, size, stride)
CL_1X1 = [("k1_c3_dgrad", (3, 16, (128, 128), 1), Op.BWD_DATA, "lanes"),
          ("mb_pw_16_96_dgrad", (16, 96, (112, 112), 1), Op.BWD_DATA, "lanes"),
          ("r50_1x1_256_64_dgrad", (256, 64, (56, 56), 1), Op.BWD_DATA, "lanes"),
          ("c3d_1x1_fwd", (128, 64, (28, 28), 1), Op.FWD, "lanes"),
          ("mb_pw_144_24_fwd", (144, 24, (56, 56), 1), Op.FWD, "lanes"),
          ("r50_1x1_64_256_dgrad", (64, 256, (56, 56), 1), Op.BWD_DATA, "pointwise"),
          ("r50_1x1_256_64_fwd", (256, 64, (56, 56), 1), Op.FWD, "pointwise"),
          ("r50_ds_256_512_s2_dgrad", (256, 512, (56, 56), 2), Op.BWD_DATA, "pointwise")]


@pytest.mark.parametrize("name,spec,op,taken", CL_1X1, ids=[r[0] for r in CL_1X1])
def test_channels_last_1x1_below_avx512(name, spec, op, taken):
    c, k, size, stride = spec
    problem = conv_problem(8, c, k, size, 1, stride, 0, op=op, layout=Layout.CHANNELS_LAST)
    assert lower(problem, AVX2).algorithm == taken, lower(problem, AVX2).reasons


# Forward patches on AVX-512 in NCHW whose output rows are shorter than a vector (codegen/cpu/pointwise.py,
# _over_patches): lanes stays where the heuristic chose it (bf16 in pairs on vdpbf16ps: ViT-B/16 on Zen 4,
# 5.98 ms against pointwise's 9.91), but for bf16 on AMX hosts, whose pointwise measured ahead (Xeon, 5.19
# against 5.88); a channel plane of 3 -> 768 at 224 in 16x16 patches: 14 columns.
ZEN4 = cpu_target("avx512", 32 * 1024, 1 << 20, bf16_dot=True)
AMX = cpu_target("avx512", 48 * 1024, 2 << 20, bf16_dot=True, amx_bf16=True)


@pytest.mark.parametrize("kernel,size", [(16, (224, 224)), (32, (224, 224)), (14, (196, 168))])
def test_short_rows_of_nchw_patches_keep_lanes_on_avx512(kernel, size):
    problem = conv_problem(8, 3, 768, size, kernel, kernel, 0, dtype=DType.BF16, bias=True)
    assert problem.output_shape[-1] < 16
    plan = lower(problem, ZEN4)
    assert plan.algorithm == "lanes" and plan.tiling.pairs and not plan.conversions, plan.reasons
    if kernel == 16:
        assert lower(problem, AMX).algorithm == "pointwise"


def test_lanes_on_short_rows_of_nchw_bf16_patches_matches_aten():
    """The kernel the rule takes, bf16 in pairs (emulated in C where this CPU has no vdpbf16ps), against
    ATen in float64: 4x4 patches of 5 channels (an odd pair) at 10 columns."""
    from support.reference import check_forward_or_data_gradient
    problem = conv_problem(2, 5, 40, (12, 40), 4, 4, 0, dtype=DType.BF16, bias=True)
    target = ZEN4 if host_cpu().bf16_dot else cpu_target("generic", bf16_dot=True)
    plan = lower(problem, target, algorithm="lanes")
    assert plan.tiling.pairs, plan.reasons
    (kernel,) = load_keyed([("k", plan)]).values()
    check_forward_or_data_gradient(kernel[1], problem, torch.Generator().manual_seed(6))


# Strided 1x1 forwards in NCHW on AVX-512 (codegen/cpu/pointwise.py, _isa_bounds): output planes of at
# most PLANE_POINTWISE_WASTES pixels, or fewer than POINTWISE_WIDE_MIN_REDUCED channels reduced, leave
# pointwise as at unit stride (r50_ds_1024_2048_s2: 12.5 -> 8.8-9.1 ms on Zen 4, f32); AVX2 keeps pointwise.
@pytest.mark.parametrize("spec", [(1024, 2048, (14, 14)), (64, 128, (56, 56))], ids=["r50_ds_1024_2048_s2", "r18_ds"])
def test_strided_nchw_1x1_forwards_leave_pointwise_on_avx512(spec):
    c, k, size = spec
    problem = conv_problem(8, c, k, size, 1, 2, 0, bias=True)
    assert lower(problem, AVX512).algorithm == "lanes", lower(problem, AVX512).reasons
    assert lower(problem, AVX2).algorithm == "pointwise"
    assert lower(conv_problem(8, c, k, size, 1, 1, 0, bias=True), AVX2).algorithm == "pointwise"


def test_lanes_on_a_strided_nchw_1x1_forward_matches_aten():
    from support.code_shapes import x86_shape
    from support.reference import check_forward_or_data_gradient
    problem = conv_problem(2, 40, 48, (13, 9), 1, 2, 0, bias=True)
    plan = lower(problem, x86_shape("avx512"), algorithm="lanes")
    (kernel,) = load_keyed([("k", plan)]).values()
    check_forward_or_data_gradient(kernel[1], problem, torch.Generator().manual_seed(7))
