"""The GPU generic tier's implicit GEMM with run-time sizes (templates/gpu/igemm_generic.cu.j2) in the
SIMT simulator: problems whose groups have MIN_CHANNELS+ channels and filters (which it takes), against
ATen in float64 for the forward and every backward output mask, each in the four dtypes and, in turn,
the three layouts and both vendors -- 16-byte copies where the layout and alignment allow them (channels-
last activations with whole copies of channels; the NCHW weight gradient's grad_output along pixels),
gathers elsewhere (NCHW activations, ragged channel counts, strided views); tiles ragged on every side,
more than one tile along rows and columns, stride phases folded into the data gradient's reduction,
groups, 1-D and 3-D, a transposed problem with its bias. And which problems it takes: the rule its
entry checks at run time, against the direct kernel for the rest.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

import convgen
from convgen.codegen.gpu import generic as gpu_generic
from convgen.codegen.ir import DType
from convgen.codegen.target import parse_target
from convgen.dispatch import tiers
from convgen.stats import reset

from support.cases import DTYPES, Case, check_case, operands, variants_of
from support.reference import assert_close
from support.tables import forget_tables

CASES = [
    Case("gi-3x3-pad1", (2, 16, 9, 9), 24, (3, 3), padding=1),
    Case("gi-1x1-pixels-whole", (2, 32, 8, 8), 16, (1, 1)),
    Case("gi-stride2-dilation2-groups2", (2, 32, 11, 10), 48, (3, 3), stride=2, padding=2, dilation=2, groups=2),
    Case("gi-3d-per-axis-stride", (1, 8, 5, 6, 7), 8, (3, 3, 3), stride=(1, 2, 1), padding=1),
    Case("gi-1d-stride3", (3, 16, 40), 16, (5,), stride=3, padding=2),
    Case("gi-transposed-output-padding", (2, 24, 5, 5), 16, (3, 3), stride=2, padding=1, transposed=True,
         output_padding=1),
    Case("gi-ragged-channels", (2, 12, 7, 9), 20, (3, 1), padding=(1, 0)),
    Case("gi-two-tiles-deep-reduction", (2, 72, 9, 9), 80, (3, 3), padding=1),
]
DTYPE_NAMES = ("bf16", "f16", "f32", "f64")


def _runs() -> list:
    params, i = [], 0
    for case in CASES:
        variants = variants_of(case)
        for dtype in DTYPE_NAMES:
            vendor, variant = "hip" if i % 5 == 1 else "cuda", variants[i % len(variants)]   # (every dtype on both)
            params.append(pytest.param(vendor, case, dtype, variant, id=f"{vendor}-{case.id}-{dtype}-{variant}"))
            i += 1
    return params


@pytest.fixture(autouse=True)
def clean_tables():
    yield
    forget_tables(300)


@pytest.fixture(scope="module")
def generic_built():
    """The simulator's generic libraries, every dtype, both vendors' default archs: built once."""
    return {t: tiers.setup(parse_target(t)) for t in ("cuda-sm_90", "hip-gfx90a")}


@pytest.mark.parametrize("vendor, case, dtype, variant", _runs())
def test_generic_igemm_in_the_simulator(vendor, case, dtype, variant, generic_built, monkeypatch):
    monkeypatch.setenv("CONVGEN_SIM", vendor)
    monkeypatch.setenv("CONVGEN_JIT", "generic")
    assert forget_tables(300)
    reset()
    check_case(case, DTYPES[dtype], operands(case, DTYPES[dtype], variant))
    counts = convgen.stats()
    assert counts["builds"] == 0 and counts["generic_calls"] >= 8, counts


def test_which_problems_the_implicit_gemm_takes(generic_built):
    """The entry's rule (codegen/gpu/generic.py MIN_CHANNELS): the implicit GEMM where every group has
    MIN_CHANNELS+ channels and filters and there are at most 65535 groups, the direct kernel otherwise;
    the bias gradient alone has no implicit GEMM."""
    target = parse_target("cuda-sm_90")
    names = [s.name for s in (gpu_generic.source(k, d, target) for d in DType for k in gpu_generic.KOPS)]
    libraries = dict(zip(names, generic_built["cuda-sm_90"]))
    least = gpu_generic.MIN_CHANNELS
    for kop in ("fwd", "dgrad", "wgrad"):
        library = ctypes.CDLL(str(libraries[f"generic_{kop}_bf16_cuda_sm_90"]))
        takes = getattr(library, f"cg_generic_{kop}_bf16_cuda_sm_90_igemm_takes")
        takes.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
        for groups, cg, kg, expected in ((1, least, least, 1), (1, least - 1, 64, 0), (1, 64, least - 1, 0),
                                         (4, 16, 16, 1), (32, 1, 1, 0), (65535, least, least, 1),
                                         (65536, least, least, 0)):
            words = (ctypes.c_longlong * 42)(groups, cg, kg)
            assert takes(words) == expected == gpu_generic.igemm_takes(list(words)), (kop, groups, cg, kg)
    bias = ctypes.CDLL(str(libraries["generic_bias_bf16_cuda_sm_90"]))
    assert not hasattr(bias, "cg_generic_bias_bf16_cuda_sm_90_igemm_takes")


# GPU layers' kernels (the implicit GEMM with a layer's constants compiled in, CONVGEN_JIT=background):
# the third spatial size makes the layer dynamic; the layer's kernel then serves it and the fourth. (Each
# size called once: not hot, so no specialised kernel is built meanwhile.)
LAYERS = [
    ("plain_3x3-cuda-bf16-channels_last", Case("l", (2, 16, 0, 0), 24, (3, 3), padding=1), "cuda", "bf16",
     "channels_last"),
    ("strided_dilated_groups-cuda-f32-contiguous", Case("l", (2, 32, 0, 0), 16, (3, 2), stride=(2, 1), padding=(1, 2),
                                                        dilation=(1, 2), groups=2), "cuda", "f32", "contiguous"),
    ("transposed-hip-f16-contiguous", Case("l", (2, 16, 0, 0), 8, (3, 3), stride=2, padding=1, transposed=True,
                                           output_padding=1), "hip", "f16", "contiguous"),
]
LAYER_SIZES = [(7, 9), (12, 5), (9, 16), (6, 11)]


@pytest.mark.parametrize("name, layer, vendor, dtype, layout", LAYERS, ids=[n for n, *_ in LAYERS])
def test_gpu_layer_kernels_match_aten(name, layer, vendor, dtype, layout, generic_built, monkeypatch):
    import dataclasses

    from convgen.api import ops
    from convgen.dispatch import dispatch

    monkeypatch.setenv("CONVGEN_SIM", vendor)
    monkeypatch.setenv("CONVGEN_JIT", "background")
    assert forget_tables(300)
    reset()
    for h, w in LAYER_SIZES:
        case = dataclasses.replace(layer, id=f"{name}-{h}x{w}", input=(*layer.input[:2], h, w))
        ops_ = operands(case, DTYPES[dtype], layout)
        check_case(case, DTYPES[dtype], ops_, masks=[(True, True, True)])
        assert tiers.wait(600)
    problems = ops.call_problems(ops_.x, ops_.w, ops_.b, *case.args())[:3]   # forward, data, weight
    for problem in problems:
        assert dispatch.kernel_for(problem).tier == "layer", (problem.op, dispatch.kernel_for(problem).tier)
    calls = convgen.stats()["layer_calls"]
    check_case(case, DTYPES[dtype], ops_, masks=[(True, True, True)])
    assert convgen.stats()["layer_calls"] >= calls + 3
    assert convgen.stats()["background_builds"] == 3   # the layer's kernels, one per kernel op; nothing specialised



def test_a_1x1_weight_is_copied_whatever_its_unit_axes_strides(generic_built, monkeypatch):
    """The forward entry's check that the weight is linear in the reduction (igemm_generic.cu.j2
    stride_as) ignores the strides of axes with one index, which torch leaves arbitrary: a 1x1 weight
    beside a channels-last input comes as (C, 1, 1, 1) whether contiguous or channels-last (torch keeps
    those strides for both), and is read by 16-byte copies as with channels-last's (C, 1, C, C) or any
    other. Each form against ATen in float64, and each form's launch in as many requests as the others
    (a gathered weight takes a third more here: 80 against 59)."""
    monkeypatch.setenv("CONVGEN_SIM", "cuda")
    monkeypatch.setenv("CONVGEN_JIT", "generic")
    gen = torch.Generator().manual_seed(47)
    x = torch.randn((2, 32, 6, 5), generator=gen).bfloat16().contiguous(memory_format=torch.channels_last)
    w = torch.randn((24, 32, 1, 1), generator=gen).bfloat16()
    args = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    ref = torch.ops.aten.convolution(x.double(), w.double(), None, *args)
    reads = {}
    for strides in ((32, 1, 1, 1), (32, 1, 32, 32), (32, 1, 7919, 1)):
        form = w.as_strided(w.shape, strides)
        reset()
        with convgen.sim_profile() as launches:
            y = convgen.convolution(x, form, None, *args)
        assert convgen.stats()["generic_calls"] == 1
        assert_close(y, ref, torch.bfloat16, f"forward, weight strides {strides}", terms=32)
        reads[strides] = [(launch["kernel"], launch["global_requests"], launch["bytes_read"]) for launch in launches]
    assert len(set(map(tuple, reads.values()))) == 1, reads
