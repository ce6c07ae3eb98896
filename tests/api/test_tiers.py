"""The kernel tiers (runtime/dispatch/tiers.py, DESIGN.md "Kernel tiers"): the shape-generic kernels
against ATen in float64 on every CASES.md run (forced with CONVGEN_JIT=generic), and the background
policy: a new shape served at once with no compiler on its path, the specialised kernel built in
the background when the problem is called again and swapped in, a forward that builds nothing for
its backward, a layer gone dynamic after DYNAMIC_AFTER spatial sizes, and a failed background
build that leaves the generic kernel serving. (The rest of the suite runs under CONVGEN_JIT=eager:
tests/conftest.py.)
"""

from __future__ import annotations

import pytest
import torch

import convgen
from convgen import knobs
from convgen.api import ops
from convgen.building import build
from convgen.codegen.errors import BuildError, ConvgenError
from convgen.codegen.target import host_isas
from convgen.dispatch import dispatch, tiers
from convgen.stats import reset

from support.cases import BY_ID, DTYPES, Case, check_case, operands, runs
from support.reference import assert_close, randn, reduction_terms
from support.tables import forget_tables


def _fresh(monkeypatch, policy: str) -> None:
    """Policy `policy`, no remembered calls or entries, no layer seen, fresh counters."""
    monkeypatch.setenv("CONVGEN_JIT", policy)
    assert forget_tables(120), "a background build of an earlier test did not finish"
    reset()


@pytest.fixture(autouse=True)
def clean_tables():
    """After each test: no generic entry or remembered call left for the tests that follow in this
    process (they run under eager and expect specialised kernels), no build still under way."""
    yield
    forget_tables(120)


@pytest.fixture(scope="module")
def generic_built():
    """The generic tier's libraries for every dtype, built once for the module."""
    return tiers.setup()


@pytest.mark.parametrize("case, dtype, variant", runs())
def test_generic_tier_case(case, dtype, variant, generic_built, monkeypatch):
    _fresh(monkeypatch, "generic")
    check_case(case, dtype, operands(case, dtype, variant))
    counts = convgen.stats()
    assert counts["builds"] == 0, "the generic tier must not build anything once its libraries exist"
    empty = 0 in case.input or 0 in case.weight
    assert (counts["generic_calls"] == 0) if empty else (counts["generic_calls"] >= 8), counts


# The generic kernels' own paths that CASES.md's small images do not reach: rows wider than four
# vectors (depthwise rows summed four vectors side by side), channel counts that are not a multiple
# of a vector (the channels-last depthwise kernels' partial vectors), a weight gradient whose
# columns (input channel, tap) come in several blocks (grad_output packed once for them all).
WIDE = [Case("wide-depthwise-stride1", (2, 20, 5, 80), 20, (3, 3), padding=1, groups=20),
        Case("wide-depthwise-stride2", (1, 20, 6, 81), 20, (3, 5), stride=2, padding=(1, 2), groups=20),
        Case("wide-grouped-many-columns", (2, 96, 6, 70), 48, (3, 3), padding=1, groups=2)]


@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16", "f16"])
@pytest.mark.parametrize("variant", ["contiguous", "channels_last"])
@pytest.mark.parametrize("case", WIDE, ids=[c.id for c in WIDE])
def test_generic_tier_wide_rows(case, variant, dtype, generic_built, monkeypatch):
    _fresh(monkeypatch, "generic")
    check_case(case, DTYPES[dtype], operands(case, DTYPES[dtype], variant))
    assert convgen.stats()["builds"] == 0 and convgen.stats()["generic_calls"] >= 8


# Few channels in channels last (at most half a vector: generic_depthwise_cl.j2, few_channels_cl): the
# operands transposed to channel planes, the planes' kernels run there and the result transposed back;
# strided rows keep the channels-last kernels for the forward and weight gradient (the data gradient
# takes the planes at any stride). RGB and two-channel filters, padding, dilation, stride 2, 3-D and a
# transposed (upsampling) filter, in every dtype.
FEW = [Case("few-rgb-row-filter", (2, 3, 5, 40), 3, (1, 9), padding=(0, 4), groups=3),
       Case("few-two-channels-dilated", (2, 2, 9, 23), 2, (3, 3), padding=2, dilation=2, groups=2),
       Case("few-rgb-stride2", (2, 3, 11, 21), 3, (3, 3), stride=2, padding=1, groups=3),
       Case("few-rgb-3d", (1, 3, 4, 6, 19), 3, (3, 1, 3), padding=(1, 0, 1), groups=3),
       Case("few-rgb-upsampler", (2, 3, 6, 17), 3, (3, 3), stride=2, padding=1, output_padding=1, groups=3,
            transposed=True)]


@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16", "f16"])
@pytest.mark.parametrize("case", FEW, ids=[c.id for c in FEW])
def test_generic_tier_few_channels_channels_last(case, dtype, generic_built, monkeypatch):
    _fresh(monkeypatch, "generic")
    check_case(case, DTYPES[dtype], operands(case, DTYPES[dtype], "channels_last"))
    assert convgen.stats()["builds"] == 0 and convgen.stats()["generic_calls"] >= 8


# The register tile's rows follow the vector registers (12 with AVX-512's 32, 6 with 16): every ISA
# level this CPU runs, on cases with groups, depthwise, transposed and a 576-term reduction.
ISA_CASES = ["02-mixed-stride-padding-dilation4-groups2", "06-depthwise", "16-transposed-output-padding",
             "21b-resnet-block-3x3-batch2"]


@pytest.mark.parametrize("isa", host_isas())
@pytest.mark.parametrize("case_id", ISA_CASES)
def test_generic_tier_on_every_isa_level(isa, case_id, monkeypatch):
    monkeypatch.setenv("CONVGEN_ISA", isa)
    _fresh(monkeypatch, "generic")
    case = BY_ID[case_id]
    for variant in ("contiguous", "channels_last"):   # (clean_tables drops this ISA's entries after)
        for dtype in ("f32", "bf16"):
            check_case(case, DTYPES[dtype], operands(case, DTYPES[dtype], variant))
    assert convgen.stats()["generic_calls"] >= 32


def _conv(x, w, b=None, padding=1):
    return ops.convolution(x, w, b, [1, 1], [padding, padding], [1, 1], False, [0, 0], 1)


def _entry(x, w, b=None, padding=1):
    return dispatch.kernel_for(ops.call_problems(x, w, b, 1, padding, 1, False, 0, 1)[0])


def test_background_serves_at_once_then_swaps(generic_built, private_cache, monkeypatch):
    tiers.setup()                       # this test's own cache: its generic libraries first
    _fresh(monkeypatch, "background")
    gen = torch.Generator().manual_seed(1)
    x, w, b = randn((2, 5, 13, 11), torch.float32, gen), randn((7, 5, 3, 3), torch.float32, gen), \
        randn((7,), torch.float32, gen)
    ref = torch.ops.aten.convolution(x.double(), w.double(), b.double(), [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    terms = reduction_terms(x.shape, w.shape, ref.shape)["forward"]

    first = _conv(x, w, b)
    assert convgen.stats()["builds"] == 0 and tiers.pending() == 0, "a first call must not build"
    assert _entry(x, w, b).tier == "generic"
    second = _conv(x, w, b)             # the second call makes the problem hot: its build is queued
    assert tiers.wait(120)
    counts = convgen.stats()
    assert counts["generic_calls"] == 2 and counts["background_builds"] == 1 and counts["swaps"] == 1, counts
    assert counts["builds"] == 1
    assert _entry(x, w, b).tier == "specialised"
    third = _conv(x, w, b)
    assert convgen.stats()["generic_calls"] == 2, "after the swap the specialised kernel serves"
    for got in (first, second, third):
        assert_close(got, ref, torch.float32, "forward", terms)


def test_forward_builds_nothing_for_its_backward(generic_built, monkeypatch):
    _fresh(monkeypatch, "background")
    gen = torch.Generator().manual_seed(2)
    x = randn((1, 6, 9, 7), torch.float64, gen).requires_grad_()
    w = randn((4, 3, 3, 3), torch.float64, gen).requires_grad_()
    y = convgen.conv2d(x, w, None, 1, 1, 1, 2)
    assert convgen.stats()["builds"] == 0 and tiers.pending() == 0
    gy = randn(tuple(y.shape), torch.float64, gen)
    y.backward(gy)
    assert convgen.stats()["builds"] == 0
    x64, w64 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.nn.functional.conv2d(x64, w64, None, 1, 1, 1, 2).backward(gy)
    assert_close(x.grad, x64.grad, torch.float64, "grad_input")
    assert_close(w.grad, w64.grad, torch.float64, "grad_weight")


def test_layer_goes_dynamic(generic_built, monkeypatch):
    """The first DYNAMIC_AFTER sizes of a layer get specialised kernels; the next size makes the layer
    dynamic: it runs the generic kernel at once and queues the layer's kernel (channels and taps
    compiled in), which then serves that size and every later one with no further build."""
    _fresh(monkeypatch, "background")
    gen = torch.Generator().manual_seed(3)
    w = randn((6, 4, 3, 3), torch.float32, gen)
    sizes = [(9, 9), (10, 12), (11, 7), (5, 13), (12, 6)]
    for i, (h, wd) in enumerate(sizes):
        x = randn((1, 4, h, wd), torch.float32, gen)
        ref = torch.ops.aten.convolution(x.double(), w.double(), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        for _ in range(tiers.HOT_CALLS):
            assert_close(_conv(x, w), ref, torch.float32, "forward", 36)
        if i == tiers.DYNAMIC_AFTER:
            assert convgen.stats()["generic_calls"] >= 1
        assert tiers.wait(120)
        if i >= tiers.DYNAMIC_AFTER:
            assert _entry(x, w).tier == "layer", (i, _entry(x, w).tier)
            calls = convgen.stats()["layer_calls"]
            assert_close(_conv(x, w), ref, torch.float32, "forward", 36)
            assert convgen.stats()["layer_calls"] == calls + 1
    # DYNAMIC_AFTER specialised kernels, then one layer kernel for the rest
    assert convgen.stats()["background_builds"] == tiers.DYNAMIC_AFTER + 1
    assert convgen.stats()["swaps"] == tiers.DYNAMIC_AFTER + 1


# Layers' kernels (the generic kernel with a layer's constants compiled in) against ATen in float64 at
# several spatial sizes each: every kernel op, both layouts, the depthwise and grouped paths, strides,
# dilation, a transposed layer, and the dtypes.
LAYERS = [
    ("plain_3x3", dict(c=5, k=7, kernel=(3, 3), stride=1, padding=1, groups=1)),
    ("strided_dilated", dict(c=6, k=4, kernel=(3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)),
    ("depthwise", dict(c=8, k=8, kernel=(3, 3), stride=1, padding=1, groups=8)),
    ("pointwise", dict(c=9, k=12, kernel=(1, 1), stride=1, padding=0, groups=3)),
]
LAYER_SIZES = [(7, 9), (12, 5), (9, 16), (6, 11)]   # the third makes the layer dynamic


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name, layer", LAYERS, ids=[n for n, _ in LAYERS])
def test_layer_kernels_match_aten(name, layer, dtype, layout, generic_built, monkeypatch):
    _fresh(monkeypatch, "background")
    for h, wd in LAYER_SIZES:
        case = Case(f"{name}-{h}x{wd}", (2, layer["c"], h, wd), layer["k"], layer["kernel"], stride=layer["stride"],
                    padding=layer["padding"], dilation=layer.get("dilation", 1), groups=layer["groups"])
        ops_ = operands(case, dtype, layout)
        check_case(case, dtype, ops_, masks=[(True, True, True)])
        assert tiers.wait(120)
    for problem in ops.call_problems(ops_.x, ops_.w, ops_.b, *case.args())[:3]:   # forward, data, weight
        assert dispatch.kernel_for(problem).tier == "layer", (problem.op, dispatch.kernel_for(problem).tier)
    assert convgen.stats()["layer_calls"] > 0


def test_layer_kernel_refuses_another_layers_sizes(generic_built, monkeypatch):
    """A layer's kernel checks that the problem's constants are its own (else a wrong result)."""
    from convgen.codegen.cpu import generic
    from convgen.devices.cpu import GenericKernel

    _fresh(monkeypatch, "generic")
    gen = torch.Generator().manual_seed(10)
    x, w = randn((1, 4, 8, 8), torch.float32, gen), randn((6, 4, 3, 3), torch.float32, gen)
    plan = _entry(x, w).plan
    source = generic.source(plan.kop, plan.problem.dtype, plan.target, layer=plan)
    layer = dispatch._load(source, build.build(source))
    other = _entry(x, randn((6, 4, 5, 5), torch.float32, gen), padding=2).plan
    kernel = GenericKernel(layer, generic.kinds(other), generic.sizes(other))
    y = torch.empty(1, 6, 8, 8)
    with pytest.raises(ConvgenError, match="sizes are another layer's"):
        kernel({"input": x, "weight": w, "bias": None, "output": y}, 1, 1)


def test_eager_policy_builds_on_the_call(monkeypatch):
    _fresh(monkeypatch, "eager")
    gen = torch.Generator().manual_seed(4)
    x, w = randn((1, 3, 6, 6), torch.float32, gen), randn((5, 3, 1, 1), torch.float32, gen)
    _conv(x, w, padding=0)
    assert convgen.stats()["generic_calls"] == 0
    assert _entry(x, w, padding=0).tier == "specialised"


def test_failed_background_build_keeps_the_generic_kernel(generic_built, monkeypatch):
    _fresh(monkeypatch, "background")
    real = build.build_many

    def failing(sources, **kwargs):
        if kwargs.get("parallel"):      # the background builder's call
            raise BuildError("compiler crashed (injected)")
        return real(sources, **kwargs)

    monkeypatch.setattr(build, "build_many", failing)
    gen = torch.Generator().manual_seed(5)
    x, w = randn((1, 3, 7, 5), torch.float64, gen), randn((2, 3, 2, 2), torch.float64, gen)
    ref = torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    with pytest.warns(RuntimeWarning, match="background build failed.*injected"):
        for _ in range(tiers.HOT_CALLS):
            _conv(x, w)
        assert tiers.wait(120)
    assert convgen.stats()["background_failures"] == 1
    assert _entry(x, w).tier == "generic"
    assert_close(_conv(x, w), ref, torch.float64, "forward")


def test_background_build_failing_inside_convgen_is_reported_and_the_builder_goes_on(generic_built, monkeypatch):
    # a defect of convgen's own (here: the emission raising a plain Python error) is counted and
    # named in a warning; the builder thread survives it and builds the next problem
    _fresh(monkeypatch, "background")
    real = tiers.emit
    broken = []

    def emit_once_broken(plan, *args, **kwargs):
        if not broken:
            broken.append(plan)
            raise KeyError("template variable (injected)")
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(tiers, "emit", emit_once_broken)
    gen = torch.Generator().manual_seed(9)
    x, w = randn((1, 3, 7, 6), torch.float64, gen), randn((2, 3, 2, 2), torch.float64, gen)
    ref = torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    with pytest.warns(RuntimeWarning, match="background build failed.*internal error of convgen.*KeyError.*injected"):
        for _ in range(tiers.HOT_CALLS):
            _conv(x, w)
        assert tiers.wait(120)
    assert convgen.stats()["background_failures"] == 1 and _entry(x, w).tier == "generic"
    assert_close(_conv(x, w), ref, torch.float64, "forward")
    x2 = randn((1, 3, 5, 9), torch.float64, gen)
    for _ in range(tiers.HOT_CALLS):
        _conv(x2, w)
    assert tiers.wait(120)
    assert _entry(x2, w).tier == "specialised", "the builder thread went on after the failure"


def test_eager_prepare_upgrades_generic_entries_or_keeps_them(generic_built, monkeypatch):
    _fresh(monkeypatch, "background")
    gen = torch.Generator().manual_seed(6)
    x, w = randn((1, 3, 8, 6), torch.float64, gen), randn((5, 3, 3, 3), torch.float64, gen)
    ref = torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    _conv(x, w)
    problems = ops.call_problems(x, w, None, 1, 1, 1, False, 0, 1)[:1]
    real = build.build_many

    def failing(sources, **kwargs):
        raise BuildError("compiler crashed (injected)")

    monkeypatch.setattr(build, "build_many", failing)
    with pytest.raises(BuildError, match="injected"):
        dispatch.prepare(problems, policy="eager")
    assert _entry(x, w).tier == "generic"   # still served, by the generic kernel
    assert_close(_conv(x, w), ref, torch.float64, "forward")
    monkeypatch.setattr(build, "build_many", real)
    dispatch.prepare(problems, policy="eager")   # as `convgen bench` prepares
    assert _entry(x, w).tier == "specialised"
    calls = convgen.stats()["generic_calls"]
    assert_close(_conv(x, w), ref, torch.float64, "forward")
    assert convgen.stats()["generic_calls"] == calls


@pytest.mark.parametrize("policy, says", [("background", "shape-generic (generic_fwd_f32_"),
                                          ("generic", "shape-generic (generic_fwd_f32_"),
                                          ("eager", "specialised (")])
def test_explain_names_the_tier(policy, says, monkeypatch, capsys):
    from convgen import cli

    monkeypatch.setenv("CONVGEN_JIT", policy)
    assert cli.main(["explain", "--input", "1,3,9,9", "--weight", "4,3,3,3"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("tier:")]
    assert len(line) == 1 and says in line[0] and f"CONVGEN_JIT={policy}" in line[0]


def test_bad_policy_is_named(monkeypatch):
    monkeypatch.setenv("CONVGEN_JIT", "sometimes")
    with pytest.raises(ConvgenError, match=r"CONVGEN_JIT='sometimes'.*background, eager, generic"):
        knobs.jit()


def test_a_fresh_cache_keeps_the_generic_tier(generic_built, private_cache, monkeypatch):
    """The generic libraries live in knobs.generic_dir(), apart from the kernel cache: a process on a
    new (or cleared) cache serves a new shape with no build at all, and the cache stays empty."""
    _fresh(monkeypatch, "background")
    gen = torch.Generator().manual_seed(8)
    x, w = randn((1, 4, 9, 7), torch.float32, gen), randn((6, 4, 3, 3), torch.float32, gen)
    ref = torch.ops.aten.convolution(x.double(), w.double(), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert_close(_conv(x, w), ref, torch.float32, "forward", reduction_terms(x.shape, w.shape, ref.shape)["forward"])
    counts = convgen.stats()
    assert counts["builds"] == 0 and counts["generic_calls"] == 1, counts
    kernels = private_cache / "kernels"
    assert not kernels.exists() or not any(kernels.iterdir()), "the generic tier was built into the kernel cache"


def test_generic_libraries_are_built_once_in_their_directory(private_cache, tmp_path, monkeypatch):
    """A new generic directory: the first call builds its dtype's libraries there (once), not in the cache."""
    monkeypatch.setenv("CONVGEN_GENERIC_DIR", str(tmp_path / "generic"))
    _fresh(monkeypatch, "generic")
    tiers._libraries.clear()
    try:
        gen = torch.Generator().manual_seed(9)
        x, w = randn((1, 2, 6, 5), torch.float64, gen), randn((3, 2, 3, 3), torch.float64, gen)
        ref = torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        assert_close(_conv(x, w), ref, torch.float64, "forward")
        assert convgen.stats()["builds"] == len(tiers.generic.KOPS)
        assert_close(_conv(x, w), ref, torch.float64, "forward")
        assert convgen.stats()["builds"] == len(tiers.generic.KOPS), "built once"
        assert any((tmp_path / "generic" / "kernels").iterdir())
        kernels = private_cache / "kernels"
        assert not kernels.exists() or not any(kernels.iterdir())
    finally:
        tiers._libraries.clear()   # the next tests load the machine's own


def test_bad_generic_dir_is_named(tmp_path, monkeypatch):
    from convgen.codegen.errors import CacheError

    monkeypatch.setenv("CONVGEN_GENERIC_DIR", "relative/generic")
    with pytest.raises(CacheError, match=r"CONVGEN_GENERIC_DIR='relative/generic' is a relative path"):
        knobs.generic_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("CONVGEN_GENERIC_DIR", str(blocker))
    with pytest.raises(CacheError, match=r"generic kernels' directory .* is not usable: .*CONVGEN_GENERIC_DIR="):
        tiers.setup()


def test_background_compiles_run_at_the_lowest_priority(tmp_path, monkeypatch):
    """The background builder's ninja (and the compilers it starts) run under `nice -n 19`, taking
    what the caller's threads leave idle; builds on the call keep the normal priority."""
    import shutil
    import subprocess

    if shutil.which("nice") is None:
        pytest.skip("no `nice` on PATH: builds keep their priority")
    seen = []
    real = subprocess.run

    def spy(argv, **kwargs):
        seen.append(list(argv))
        return real(argv, **kwargs)

    monkeypatch.setattr(build.subprocess, "run", spy)
    with build.low_priority():
        build._run_ninja(build.find_ninja(), tmp_path, 1)   # (no build file: ninja says so; only argv matters)
    build._run_ninja(build.find_ninja(), tmp_path, 1)
    assert seen[0][:3] == [shutil.which("nice"), "-n", "19"] and seen[0][3] == build.find_ninja()
    assert seen[1][0] == build.find_ninja()
    # and the background builder builds in that mode
    flags = []

    def spy_build_many(sources, **kwargs):
        flags.append(build._low_priority.get())
        raise BuildError("stopped here (injected)")

    monkeypatch.setattr(build, "build_many", spy_build_many)
    with pytest.warns(RuntimeWarning, match="injected"):
        tiers._enqueue(tiers._Job(lambda: None, lambda source, path: None))
        assert tiers.wait(60)
    assert flags == [True]
