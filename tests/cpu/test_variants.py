"""Every candidate algorithm of every kernel op is correct, not just the one the heuristic picks.

The runtime may pick any candidate (tuning records the fastest), so each is checked here against
ATen in float64 on problems that exercise its corners: padding larger than the kernel reach,
strides above and below the kernel size, dilation, groups and depthwise, 1-D and 3-D, transposed
problems (which swap the kernel ops), odd widths that leave vector tails, and both layouts.
Outputs are poisoned with NaN before a kernel runs so an unwritten element shows.
The same checks run for the portable target and for the other x86 code shape (AVX-512's: on CPUs
without AVX-512 compiled for the host's ISA; AVX2's where AVX-512 is the host's own), and bf16 reduced in pairs on vdpbf16ps (natively where
the CPU has AVX512-BF16, with the instruction emulated in C everywhere).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from convgen.dispatch import dispatch
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import Target, TargetKind, cpu_target, host_cpu, host_isas
from convgen.dispatch.problem import TORCH_DTYPES, memory_format

from support.code_shapes import ShapeForThisHost, x86_shape
from support.problems import conv_problem
from support.reference import rel_err, tolerance

# One worker runs this module, whole (pyproject.toml: --dist loadgroup). Its fixture builds about
# 2,900 kernels (8 minutes on 2 cores alone). Split across workers, both set the fixture up (again
# at each return to the module), and the second waited on the first's build locks, then held for
# the whole set, past CONVGEN_LOCK_TIMEOUT: CI's run of 2026-12-02 errored and ran out of time.
pytestmark = pytest.mark.xdist_group("cpu_variants")

# (name, n, c, k, size, kernel, stride, padding pairs, dilation, groups, transposed, output_padding)
PROBLEMS = [
    ("pad_as_kernel", 1, 3, 3, (4, 4), (3, 3), (2, 2), ((2, 2), (2, 2)), (1, 1), 1, False, (0, 0)),
    ("mixed_dil_groups", 2, 4, 2, (8, 8), (3, 3), (3, 2), ((2, 2), (1, 1)), (4, 4), 2, False, (0, 0)),
    ("even_kernel_asym", 1, 4, 1, (5, 5), (2, 3), (1, 1), ((0, 1), (2, 2)), (3, 3), 1, False, (0, 0)),
    ("stride_gt_kernel", 2, 2, 2, (4, 20), (3, 5), (1, 10), ((0, 0), (0, 0)), (1, 1), 2, False, (0, 0)),
    ("depthwise_mult2", 2, 4, 8, (6, 6), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 4, False, (0, 0)),
    ("depthwise_s2_dil", 2, 6, 6, (9, 11), (3, 3), (2, 2), ((2, 2), (1, 1)), (2, 1), 6, False, (0, 0)),
    ("depthwise_1d", 2, 5, 5, (19,), (4,), (1,), ((1, 1),), (3,), 5, False, (0,)),
    # the depthwise weight gradient's flat planes (rows narrower than 32; several passes of taps,
    # dilation, uneven padding) and, at unit stride, its rows (wider rows)
    ("depthwise_planes_5x5", 2, 4, 4, (6, 9), (5, 5), (1, 1), ((2, 2), (1, 3)), (1, 2), 4, False, (0, 0)),
    ("depthwise_rows_unit", 1, 3, 6, (3, 40), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 3, False, (0, 0)),
    # the depthwise planes forward and data gradient with taps stepped in assembly (a 2-D kernel of
    # more than 9 taps on a plane of at least 64 vectors), with uneven padding
    ("depthwise_planes_asm", 2, 3, 3, (20, 30), (5, 5), (1, 1), ((2, 2), (1, 3)), (1, 1), 3, False, (0, 0)),
    # rows wide enough for the depthwise weight gradient to split stride-2 input rows by shuffles
    ("depthwise_s2_wide", 2, 3, 3, (5, 45), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 3, False, (0, 0)),
    # depthwise in channels last (grouplanes: the groups in the lanes): whole tiles of channel
    # vectors, single vectors and a tail of fewer lanes; strides 3 and 2 with dilation; padding
    # past the kernel's reach (columns no tap reaches: the bias alone); 3-D; transposed
    ("depthwise_cl_tail", 2, 20, 20, (7, 13), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 20, False, (0, 0)),
    ("depthwise_wide_rows", 1, 40, 40, (3, 30), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 40, False, (0, 0)),
    ("depthwise_s3_dil_pad", 2, 17, 17, (11, 16), (5, 3), (3, 2), ((4, 4), (3, 3)), (1, 2), 17, False, (0, 0)),
    ("depthwise_pad_past_reach", 1, 8, 8, (4, 5), (3, 3), (1, 1), ((3, 3), (3, 3)), (1, 1), 8, False, (0, 0)),
    ("depthwise_3d", 2, 9, 9, (4, 5, 7), (3, 3, 3), (2, 1, 2), ((1, 1), (1, 1), (2, 2)), (1, 1, 1), 9, False,
     (0, 0, 0)),
    ("depthwise_transposed", 2, 12, 12, (5, 9), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 12, True, (1, 1)),
    # small groups (as many channels per group on both sides, whole groups per vector): the
    # grouplanes forward spreads each group's input channels across its lanes; groups of 4, of 2
    # with stride, dilation, uneven padding and a channel tail of 6 lanes, of 8 in 3-D, and a
    # transposed problem (whose data gradient is a forward)
    ("groups_of_4", 2, 16, 16, (7, 13), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 4, False, (0, 0)),
    ("groups_of_2_s2_tail", 2, 22, 22, (9, 11), (3, 3), (2, 2), ((2, 2), (1, 1)), (1, 2), 11, False, (0, 0)),
    ("groups_of_8_3d", 1, 16, 16, (3, 5, 6), (3, 3, 3), (1, 1, 1), ((1, 1), (1, 1), (1, 1)), (1, 1, 1), 2, False,
     (0, 0, 0)),
    ("groups_of_4_transposed", 2, 8, 8, (5, 6), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 2, True, (1, 1)),
    ("wide_odd", 2, 5, 7, (3, 37), (3, 3), (1, 2), ((1, 1), (1, 1)), (1, 1), 1, False, (0, 0)),
    ("pointwise", 2, 6, 10, (5, 7), (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1, False, (0, 0)),
    # the pointwise GEMM's corners: strides and padding (pixels that read zeros), groups, a
    # transposed 1x1 (its forward is a data-gradient kernel, with bias), several chunks of the
    # reduction and several channel blocks per item, 1-D
    ("pointwise_s2_pad", 2, 6, 10, (7, 9), (1, 1), (2, 2), ((1, 1), (0, 0)), (1, 1), 2, False, (0, 0)),
    ("pointwise_transposed_pad", 2, 8, 6, (5, 6), (1, 1), (1, 1), ((1, 1), (0, 0)), (1, 1), 2, True, (0, 0)),
    ("pointwise_many", 1, 300, 300, (3, 5), (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1, False, (0, 0)),
    ("pointwise_1d", 2, 5, 9, (13,), (1,), (1,), ((0, 0),), (1,), 1, False, (0,)),
    # the pointwise weight gradient's chunks of pixels: several per image and across images, as
    # whole planes and (strided, padded) as output rows
    ("pointwise_chunks", 3, 5, 7, (45, 61), (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1, False, (0, 0)),
    ("pointwise_s2_chunks", 4, 4, 13, (81, 95), (1, 1), (2, 3), ((1, 1), (2, 2)), (1, 1), 1, False, (0, 0)),
    # non-overlapping patches (kernel = stride): the pointwise forward reduces over (channel, tap),
    # rows and columns left over past the last patch; groups; 1-D; a transposed problem (whose
    # data gradient is a forward over patches)
    ("patches_groups", 2, 6, 4, (9, 10), (2, 3), (2, 3), ((0, 0), (0, 0)), (1, 1), 2, False, (0, 0)),
    ("patches_1d", 2, 8, 6, (35,), (4,), (4,), ((0, 0),), (1,), 1, False, (0,)),
    ("patches_transposed", 2, 6, 4, (4, 5), (2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1), 1, True, (0, 0)),
    ("tiny_images", 3, 6, 9, (4, 5), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, False, (0, 0)),
    ("conv1d_dilated", 3, 8, 16, (50,), (5,), (2,), ((2, 2),), (2,), 1, False, (0,)),
    ("conv3d", 2, 4, 6, (4, 5, 6), (3, 3, 3), (1, 2, 1), ((1, 1), (1, 1), (0, 0)), (1, 1, 2), 2, False, (0, 0, 0)),
    ("transposed_s2", 2, 8, 4, (5, 6), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 1, True, (1, 1)),
    # every stride phase takes the same taps (4x4, stride 2): the lanes data gradient's fixed tap count
    ("k4_s2", 2, 6, 10, (9, 8), (4, 4), (2, 2), ((1, 1), (1, 1)), (1, 1), 1, False, (0, 0)),
    ("transposed_k4_s2", 2, 10, 6, (5, 6), (4, 4), (2, 2), ((1, 1), (1, 1)), (1, 1), 2, True, (0, 0)),
    ("transposed_groups_op", 2, 4, 6, (5, 7), (3, 3), (3, 3), ((1, 1), (1, 1)), (2, 2), 2, True, (2, 1)),
    # weight gradients with several row and channel blocks (lanes) or column blocks (gemm), and
    # reductions cut into parts, on small images and larger ones
    ("many_channels_across", 2, 16, 256, (5, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, False, (0, 0)),
    ("many_rows_parts", 2, 12, 10, (9, 9), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, False, (0, 0)),
    ("many_channels_parts", 2, 16, 160, (9, 9), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, False, (0, 0)),
]


def problem_for(spec, op: Op, dtype: DType, layout: Layout) -> ConvProblem:
    name, n, c, k, size, kernel, stride, padding, dilation, groups, transposed, output_padding = spec
    lay = layout if len(size) > 1 else Layout.CONTIGUOUS
    return conv_problem(n, c, k, size, kernel, stride, padding, dilation, groups, op=op, transposed=transposed,
                        output_padding=output_padding, dtype=dtype, layout=lay)   # with the op's own bias


def configuration(p: ConvProblem, algorithm: str) -> tuple:
    """What a variant's kernel code depends on besides its sizes and padding."""
    return (p.op, p.dtype, p.input_layout, algorithm, p.rank, p.transposed, p.groups > 1, p.groups == p.c)


def variants():
    """(problem, algorithm) for every problem x op x candidate algorithm in f32 in both layouts;
    in the other dtypes and layouts (f64 NCHW, bf16 channels last, f64 channels last for the
    grouped problems) on a third of the problems each, in turn, and wherever a configuration
    (op, dtype, layout, algorithm, rank, transposition, grouping) would otherwise go unchecked.
    The whole cross product (1,921 kernels at -O3) took about 55 minutes of CPU to build on a 2-core
    AMD EPYC (family 23): more than CI's budget there beside the rest of the suite."""
    out, seen = [], set()
    target = host_cpu()
    for index, spec in enumerate(PROBLEMS):
        for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT):
            combos = [(DType.F32, Layout.CONTIGUOUS), (DType.F32, Layout.CHANNELS_LAST),
                      (DType.F64, Layout.CONTIGUOUS), (DType.BF16, Layout.CHANNELS_LAST)]
            if spec[0].startswith(("depthwise", "groups_of")):   # grouplanes with the lanes of another width
                combos.append((DType.F64, Layout.CHANNELS_LAST))
            for turn, (dtype, layout) in enumerate(combos):
                p = problem_for(spec, op, dtype, layout)
                if layout is Layout.CHANNELS_LAST and p.rank == 1:
                    continue
                for algorithm in lower(p, target).candidates:
                    config = configuration(p, algorithm)
                    if dtype is DType.F32 or index % 3 == turn % 3 or config not in seen:
                        seen.add(config)
                        out.append(pytest.param(p, algorithm, id=f"{spec[0]}-{op.value}-{dtype.value}-"
                                                                 f"{layout.value}-{algorithm}"))
    return out


VARIANTS = variants()

# The portable target (SSE vectors, no assembly register tiles; see templates/cpu/fma_tile.j2),
# which runs on any x86-64 host: its register tiles step in C vector code instead.
PORTABLE = Target(TargetKind.CPU, "generic", 16)
PORTABLE_PROBLEMS = ("wide_odd", "conv3d", "k4_s2", "pointwise_many", "many_channels_across", "depthwise_cl_tail",
                     "groups_of_2_s2_tail")


def target_variants(target: Target, suffix: str, names=None,
                    combos=((DType.F32, Layout.CONTIGUOUS), (DType.F64, Layout.CHANNELS_LAST)), second_every: int = 1):
    """(problem, algorithm) on `target` for the problems named (default all), every kernel op and
    candidate, in each of `combos` (dtype, layout): by default f32 NCHW and f64 channels last; the
    combos after the first on every `second_every`-th problem, and wherever a configuration (as in
    `variants`) would otherwise go unchecked."""
    out, seen = [], set()
    for index, spec in enumerate(PROBLEMS):
        if names is not None and spec[0] not in names:
            continue
        for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT):
            for turn, (dtype, layout) in enumerate(combos):
                p = problem_for(spec, op, dtype, layout)
                for algorithm in lower(p, target).candidates:
                    if turn and index % second_every and configuration(p, algorithm) in seen:
                        continue
                    seen.add(configuration(p, algorithm))
                    out.append(pytest.param(p, algorithm, id=f"{spec[0]}-{op.value}-{dtype.value}-"
                                                             f"{layout.value}-{algorithm}-{suffix}"))
    return out


PORTABLE_VARIANTS = target_variants(PORTABLE, "portable", PORTABLE_PROBLEMS)


# The AVX-512 code shape: natively where the CPU runs it (the default on AVX-512 CPUs but AMD Zen 4),
# its tiles stepped in assembly on zmm registers; else compiled for this host's ISA in C vector code
# (tests/support/code_shapes.py: GCC splits each 64-byte vector into what the host has).
# Where that is the host's own target (VARIANTS), the AVX2 shape takes its place, natively: every
# host checks both x86 code shapes.
# Compiled for this host (no AVX-512 here), the AVX-512 shape is checked in f32 NCHW (its 16-lane
# vectors and 32-register tiles); its f64 channels-last kernels (8 lanes, as this host's own f32
# channels-last ones) are checked where AVX-512 runs natively: 430 kernels fewer to build here.
# Natively, the AVX2 shape on an AVX-512 host: f32 NCHW on every problem, f64 channels last (4
# lanes) on every third (the AVX2 hosts check them all as their own): about 300 kernels fewer to
# build in CI, whose module took 17 minutes of a worker.
SECOND_SHAPE = x86_shape("avx512")
if host_cpu().isa == "avx512":
    SECOND_SHAPE = cpu_target("avx2")
SECOND_SHAPE_VARIANTS = (target_variants(SECOND_SHAPE, SECOND_SHAPE.isa, combos=((DType.F32, Layout.CONTIGUOUS),))
                         if isinstance(SECOND_SHAPE, ShapeForThisHost)
                         else target_variants(SECOND_SHAPE, SECOND_SHAPE.isa, second_every=3))


# bf16 reduced in pairs (vdpbf16ps's arithmetic; see Target.bf16_dot): the lanes forward and data
# gradient pair reduced channels, the gemm weight gradient pairs consecutive pixels, so odd
# channel counts per group, groups, strides and phases, 1-D and 3-D, padding and odd pixel counts
# are the corners. The portable target runs the C emulation of the instruction on any host; the
# AVX2 shape steps vdpbf16ps in assembly, which runs only where the CPU has AVX512-BF16.
PAIR_PROBLEMS = ("mixed_dil_groups", "stride_gt_kernel", "wide_odd", "pointwise_s2_pad", "pointwise_many",
                 "conv1d_dilated", "conv3d", "transposed_s2", "k4_s2", "transposed_groups_op",
                 "many_channels_parts", "tiny_images")
PAIRS_PORTABLE = Target(TargetKind.CPU, "generic", 16, bf16_dot=True)
PAIRS_NATIVE = cpu_target("avx2", bf16_dot=True)
# and on zmm registers, where the CPU runs AVX-512 (Zen 5's default; CONVGEN_BF16_DOT=1 elsewhere)
PAIRS_ZMM = cpu_target("avx512", bf16_dot=True)


def pair_variants(target: Target, suffix: str):
    """(problem, algorithm) in bf16, both layouts, for PAIR_PROBLEMS and the candidates whose tiles
    reduce in pairs on `target`."""
    out = []
    for spec in PROBLEMS:
        if spec[0] not in PAIR_PROBLEMS:
            continue
        for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT):
            for layout in (Layout.CONTIGUOUS, Layout.CHANNELS_LAST):
                p = problem_for(spec, op, DType.BF16, layout)
                for algorithm in lower(p, target).candidates:
                    if lower(p, target, algorithm=algorithm).tiling.pairs:
                        out.append(pytest.param(p, algorithm, id=f"{spec[0]}-{op.value}-bf16-{layout.value}-"
                                                                 f"{algorithm}-{suffix}"))
    return out


PAIRS_PORTABLE_VARIANTS = pair_variants(PAIRS_PORTABLE, "pairs-portable")
PAIRS_NATIVE_VARIANTS = pair_variants(PAIRS_NATIVE, "pairs-vdpbf16ps")
PAIRS_ZMM_VARIANTS = pair_variants(PAIRS_ZMM, "pairs-vdpbf16ps-zmm")


def _runs_vdpbf16ps() -> bool:
    from convgen.codegen.target import host_bf16_dot
    return host_bf16_dot()


BUILD_BATCH = 256


@pytest.fixture(scope="module")
def kernels():
    """Every variant's kernel, for the host, the portable target and the AVX-512 code shape, built
    BUILD_BATCH kernels a ninja run."""
    target = host_cpu()
    plans = ([lower(p.values[0], target, algorithm=p.values[1]) for p in VARIANTS] +
             [lower(p.values[0], PORTABLE, algorithm=p.values[1]) for p in PORTABLE_VARIANTS] +
             [lower(p.values[0], SECOND_SHAPE, algorithm=p.values[1]) for p in SECOND_SHAPE_VARIANTS] +
             [lower(p.values[0], PAIRS_PORTABLE, algorithm=p.values[1]) for p in PAIRS_PORTABLE_VARIANTS] +
             ([lower(p.values[0], PAIRS_NATIVE, algorithm=p.values[1]) for p in PAIRS_NATIVE_VARIANTS]
              if _runs_vdpbf16ps() else []) +
             ([lower(p.values[0], PAIRS_ZMM, algorithm=p.values[1]) for p in PAIRS_ZMM_VARIANTS]
              if _runs_vdpbf16ps() and "avx512" in host_isas() else []))
    # in batches: a batch's build holds its kernels' locks (a minute at most), not the whole set's
    loaded = [kernel for start in range(0, len(plans), BUILD_BATCH)
              for kernel in dispatch.load_plans(plans[start:start + BUILD_BATCH])]
    return {(plan.problem, plan.algorithm, plan.target): (plan, kernel) for plan, kernel in zip(plans, loaded)}


def _tensor(shape, dtype, layout: Layout, gen) -> torch.Tensor:
    t = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    return t.contiguous(memory_format=memory_format(layout, len(shape)))


def _poisoned(shape, dtype, layout: Layout) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype).contiguous(memory_format=memory_format(layout, len(shape)))


@pytest.mark.parametrize("problem, algorithm", VARIANTS)
def test_variant_matches_aten(kernels, problem: ConvProblem, algorithm: str):
    _check(kernels, problem, algorithm, host_cpu())


@pytest.mark.parametrize("problem, algorithm", PORTABLE_VARIANTS)
def test_portable_variant_matches_aten(kernels, problem: ConvProblem, algorithm: str):
    _check(kernels, problem, algorithm, PORTABLE)


@pytest.mark.parametrize("problem, algorithm", SECOND_SHAPE_VARIANTS)
def test_second_code_shape_variant_matches_aten(kernels, problem: ConvProblem, algorithm: str):
    _check(kernels, problem, algorithm, SECOND_SHAPE)


@pytest.mark.parametrize("problem, algorithm", PAIRS_PORTABLE_VARIANTS)
def test_bf16_pairs_portable_variant_matches_aten(kernels, problem: ConvProblem, algorithm: str):
    _check(kernels, problem, algorithm, PAIRS_PORTABLE)


@pytest.mark.parametrize("problem, algorithm", PAIRS_NATIVE_VARIANTS)
def test_bf16_pairs_vdpbf16ps_variant_matches_aten(kernels, problem: ConvProblem, algorithm: str):
    if not _runs_vdpbf16ps():
        pytest.skip("this CPU has no AVX512-BF16 (with AVX512-VL): the vdpbf16ps assembly cannot run here; the "
                    "same kernels with the instruction emulated run in test_bf16_pairs_portable_variant_matches_aten")
    _check(kernels, problem, algorithm, PAIRS_NATIVE)


@pytest.mark.parametrize("problem, algorithm", PAIRS_ZMM_VARIANTS)
def test_bf16_pairs_vdpbf16ps_zmm_variant_matches_aten(kernels, problem: ConvProblem, algorithm: str):
    if not (_runs_vdpbf16ps() and "avx512" in host_isas()):
        pytest.skip("this CPU has no AVX512-BF16 or no AVX-512: the vdpbf16ps assembly on zmm registers cannot run "
                    "here; the same kernels with the instruction emulated run in "
                    "test_bf16_pairs_portable_variant_matches_aten")
    _check(kernels, problem, algorithm, PAIRS_ZMM)


def test_pairs_variants_cover_every_kernel_op():
    """The pair lists are not empty by accident: every kernel op has pair variants in both layouts."""
    for variants in (PAIRS_PORTABLE_VARIANTS, PAIRS_NATIVE_VARIANTS, PAIRS_ZMM_VARIANTS):
        kinds = {(p.values[0].op, p.values[0].input_layout) for p in variants}
        assert kinds == {(op, lay) for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT)
                         for lay in (Layout.CONTIGUOUS, Layout.CHANNELS_LAST)}


def _check(kernels, problem: ConvProblem, algorithm: str, target: Target):
    plan, kernel = kernels[(problem, algorithm, target)]
    assert plan.algorithm == algorithm and plan.target == target
    dtype = TORCH_DTYPES[problem.dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{problem.name()}-{algorithm}".encode()))
    x = _tensor(problem.input_shape, dtype, problem.input_layout, gen)
    w = _tensor(problem.weight_shape, dtype, problem.weight_layout, gen)
    b = _tensor((problem.k,), dtype, Layout.CONTIGUOUS, gen)
    gy = _tensor(problem.output_shape, dtype, problem.output_layout, gen)
    args = ([s for s in problem.stride], [lo for lo, _ in problem.padding], list(problem.dilation),
            problem.transposed, list(problem.output_padding), problem.groups)
    x64, w64, b64, gy64 = (t.to(torch.float64) for t in (x, w, b, gy))
    if problem.op is Op.FWD:
        out = _poisoned(problem.output_shape, dtype, problem.output_layout)
        kernel({"input": x, "weight": w, "bias": b, "output": out}, problem.n, 2)
        ref = _aten_forward(problem, x64, w64, b64)
        results = {"output": (out, ref)}
    elif problem.op is Op.BWD_DATA:
        out = _poisoned(problem.input_shape, dtype, problem.input_layout)
        kernel({"grad_output": gy, "weight": w, "grad_input": out}, problem.n, 2)
        ref = _aten_backward(problem, gy64, x64, w64, [True, False, False])[0]
        results = {"grad_input": (out, ref)}
    else:
        gw = _poisoned(problem.weight_shape, dtype, problem.weight_layout)
        gb = _poisoned((problem.k,), dtype, Layout.CONTIGUOUS)
        kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb}, problem.n, 2)
        ref = _aten_backward(problem, gy64, x64, w64, [False, True, True])
        results = {"grad_weight": (gw, ref[1]), "grad_bias": (gb, ref[2])}
    for name, (got, want) in results.items():
        assert not torch.isnan(got).any(), f"{name}: elements left unwritten (NaN poison survived)"
        terms = problem.n * 4096 if name.startswith("grad_w") or name == "grad_bias" else 1
        assert rel_err(got, want) <= tolerance(dtype, terms), f"{name}: rel err {rel_err(got, want):.2e}"


def _symmetric(problem: ConvProblem):
    """ATen's arguments for `problem` (its padding as the low side; asymmetric problems in this
    list are normal convolutions, computed on an explicitly padded input instead)."""
    assert not problem.transposed or all(lo == hi for lo, hi in problem.padding)
    return ([list(problem.stride), [lo for lo, _ in problem.padding], list(problem.dilation), problem.transposed,
             list(problem.output_padding), problem.groups])


def _aten_forward(problem, x, w, b):
    stride, pads, dilation, transposed, output_padding, groups = _symmetric(problem)
    if all(lo == hi for lo, hi in problem.padding):
        return torch.ops.aten.convolution(x, w, b, stride, pads, dilation, transposed, output_padding, groups)
    # asymmetric padding: pad the input explicitly, then convolve without padding
    flat = [v for lo, hi in reversed(problem.padding) for v in (lo, hi)]
    return torch.ops.aten.convolution(torch.nn.functional.pad(x, flat), w, b, stride, [0] * problem.rank,
                                      dilation, transposed, output_padding, groups)


def _aten_backward(problem, gy, x, w, mask):
    stride, pads, dilation, transposed, output_padding, groups = _symmetric(problem)
    if all(lo == hi for lo, hi in problem.padding):
        return torch.ops.aten.convolution_backward(gy, x, w, [problem.k], stride, pads, dilation, transposed,
                                                   output_padding, groups, mask)
    x = x.detach().requires_grad_(mask[0])
    w = w.detach().requires_grad_(mask[1])
    b = torch.zeros(problem.k, dtype=x.dtype, requires_grad=mask[2])
    y = _aten_forward(problem, x, w, b)
    grads = torch.autograd.grad(y, [t for t, m in zip((x, w, b), mask) if m], gy)
    it = iter(grads)
    return tuple(next(it) if m else None for m in mask)


def test_gemm_tiling_search_ends_when_the_rows_fit_one_block():
    """Once a hang (of an earlier gemm tiling, whose work-item search could only halve an already
    single row block): 5 output channels x 18 im2col rows. Run in a child process so a hang fails
    instead of stalling."""
    import subprocess
    import sys
    code = ("from convgen.codegen.ir import ConvProblem, Op\nfrom convgen.codegen.pipeline import lower\n"
            "from convgen.codegen.target import host_cpu\n"
            "p = ConvProblem(Op.BWD_WEIGHT, 2, 6, 5, (32,), (3,), (1,), ((0, 0),), (1,))\n"
            "print(lower(p, host_cpu(), algorithm=\"gemm\").tiling.ksb)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert int(out.stdout.strip()) >= 1


WGRAD_VARIANTS = [p for p in VARIANTS if p.values[0].op is Op.BWD_WEIGHT]


@pytest.mark.parametrize("problem, algorithm", WGRAD_VARIANTS)
def test_weight_gradient_is_the_same_bit_for_bit_for_any_thread_count(kernels, problem: ConvProblem, algorithm: str):
    """Weight and bias gradients reduce in a fixed order: 1, 2 and 3 threads (and a second run)
    give the same bits."""
    plan, kernel = kernels[(problem, algorithm, host_cpu())]
    dtype = TORCH_DTYPES[problem.dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(f"threads-{problem.name()}-{algorithm}".encode()))
    x = _tensor(problem.input_shape, dtype, problem.input_layout, gen)
    gy = _tensor(problem.output_shape, dtype, problem.output_layout, gen)
    results = []
    for threads in (1, 2, 3, 2):
        gw = _poisoned(problem.weight_shape, dtype, problem.weight_layout)
        gb = _poisoned((problem.k,), dtype, Layout.CONTIGUOUS)
        kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb}, problem.n, threads)
        results.append((threads, gw, gb))
    _, gw1, gb1 = results[0]
    for threads, gw, gb in results[1:]:
        assert torch.equal(gw, gw1) and torch.equal(gb, gb1), \
            f"{threads} threads give other bits than 1 thread"


@pytest.mark.parametrize("h, w, kh, kw", [(2, 2, 1, 2), (2, 3, 2, 2), (3, 2, 1, 2), (2, 3, 1, 3)])
def test_small_f64_depthwise_data_gradients_on_both_x86_shapes(h, w, kh, kw):
    """GCC 12's straight-line vectorizer miscompiled these for AVX-512 (a permutation of the stored
    outputs that an in-lane vpermilpd cannot make; see Target.march_flags): the depthwise data
    gradient of planes of 4-6 f64 values, on the host's shape and the other x86 shape."""
    from convgen.api import ops
    gen = torch.Generator().manual_seed(h * 100 + w * 10 + kh + kw)
    x = torch.randn((1, 2, h, w), generator=gen, dtype=torch.float64)
    wt = torch.randn((2, 1, kh, kw), generator=gen, dtype=torch.float64)
    args = ([1, 1], [0, 0], [1, 1], False, [0, 0], 2)
    gy = torch.randn(torch.ops.aten.convolution(x, wt, None, *args).shape, generator=gen, dtype=torch.float64)
    ref = torch.ops.aten.convolution_backward(gy, x, wt, None, *args, [True, False, False])[0]
    (problem,) = [p for p in ops.call_problems(x, wt, None, *args) if p.op is Op.BWD_DATA]
    plans = [lower(problem, t, algorithm="depthwise") for t in (host_cpu(), SECOND_SHAPE)]
    for plan, kernel in zip(plans, dispatch.load_plans(plans)):
        out = _poisoned(tuple(x.shape), torch.float64, Layout.CONTIGUOUS)
        kernel({"grad_output": gy, "weight": wt, "grad_input": out}, 1, 2)
        assert rel_err(out, ref) <= tolerance(torch.float64, kh * kw), f"{plan.target.name()}: {out} against {ref}"


@pytest.mark.parametrize("op", [Op.FWD, Op.BWD_DATA], ids=lambda o: o.value)
def test_blocked_pairs_where_channels_pair(op):
    """The blocked forward and data gradient reduce bf16 in pairs of the reduced channels (input
    channels, output channels) where the target has vdpbf16ps and a group has two or more, and
    nowhere else; their pair variants are checked above."""
    def pairs(c, groups, dtype, target):
        spec = ("p", 2, c, c, (9, 11), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), groups, False, (0, 0))
        return lower(problem_for(spec, op, dtype, Layout.CONTIGUOUS), target, algorithm="blocked").tiling.pairs
    assert pairs(16, 4, DType.BF16, PAIRS_ZMM) and pairs(5, 1, DType.BF16, PAIRS_NATIVE)
    assert pairs(6, 2, DType.BF16, PAIRS_PORTABLE)             # three channels a group: the last pair half empty
    assert not pairs(8, 8, DType.BF16, PAIRS_ZMM)              # one channel a group: every pair half empty
    assert not pairs(16, 4, DType.F32, PAIRS_ZMM)
    assert not pairs(16, 4, DType.BF16, cpu_target("avx512"))  # no vdpbf16ps
    for variants in (PAIRS_PORTABLE_VARIANTS, PAIRS_NATIVE_VARIANTS, PAIRS_ZMM_VARIANTS):
        assert any(p.values[1] == "blocked" and p.values[0].op is op for p in variants)


def test_bf16_pairs_choose_the_better_tile():
    """With both in pairs, bf16 takes blocked where its tile scores above lanes' (17 input channels:
    lanes' second vector holds one), lanes where its tile scores at least as high."""
    def algorithm(c, k, op):
        spec = ("p", 3, c, k, (37, 41), (5, 3), (2, 1), ((2, 2), (1, 1)), (1, 2), 1, False, (0, 0))
        return lower(problem_for(spec, op, DType.BF16, Layout.CONTIGUOUS), PAIRS_ZMM).algorithm
    assert algorithm(17, 31, Op.BWD_DATA) == "blocked"
    assert algorithm(17, 31, Op.FWD) == "lanes"
    assert algorithm(64, 64, Op.BWD_DATA) == "lanes"
