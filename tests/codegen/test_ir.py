"""The problem IR, the pass pipeline and the emitter, without compiling anything.

DESIGN.md "IR", "Passes" and "Templates": `ConvProblem.key()` is a sha256 of canonical JSON
(stable across processes, sensitive to every field), `kernel_key()` ignores the batch, `name()`
is readable and symbol-safe; `lower()` runs every pass in dependency order and each pass says
why it decided what it decided; the pipeline fails early on a missing requirement; every
emitted source begins with a header (version, problem, key, reasons), never mentions the batch
size, and depends on the target. Nothing here compiles or runs a kernel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from convgen.codegen import pipeline as pipeline_mod
from convgen.codegen.emit import emit
from convgen.codegen.errors import ConvgenError, ConvSpecError
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import Pass, lower, order_passes
from convgen.codegen.plan import Plan
from convgen.codegen.target import Target, TargetKind, host_cpu
from convgen.codegen.version import generator_version

from support.paths import TESTS
from support.problems import conv_problem

CL, C = Layout.CHANNELS_LAST, Layout.CONTIGUOUS
AVX2 = Target(TargetKind.CPU, "avx2", 32)
AVX512 = Target(TargetKind.CPU, "avx512", 64)
PASS_NAMES = ("validate", "canonicalise", "algorithm", "layout", "group_split", "tiling")


def problem(op=Op.FWD, n=2, c=4, k=8, in_size=(6, 6), kernel=(3, 3), stride=1, padding=0, dilation=1, bias=False,
            **kw) -> ConvProblem:
    """A small problem (2 x 4 channels of 6x6 to 8, 3x3, stride 1, no padding, dilation 1, no bias)
    with whatever a test changes; `kw`: conv_problem's (groups, dtype, layout, ...)."""
    return conv_problem(n, c, k, in_size, kernel, stride, padding, dilation, op=op, bias=bias, **kw)


# A curated set of valid problems, one per kind of plan the passes can make.
PROBLEMS = {
    "fwd": problem(),
    "fwd_bias_strided": problem(stride=(2, 2), padding=((1, 1), (1, 1)), bias=True),
    "bwd_data": problem(Op.BWD_DATA),
    "bwd_weight_bias_nhwc": problem(Op.BWD_WEIGHT, bias=True, layout=CL),
    "bwd_bias": problem(Op.BWD_BIAS),
    "depthwise": problem(c=4, k=8, groups=4),
    "grouped": problem(c=4, k=6, groups=2, kernel=(3, 2)),
    "pointwise": problem(kernel=(1, 1)),
    "transposed": problem(c=3, k=3, in_size=(4, 4), stride=(2, 2), padding=((2, 2), (2, 2)), transposed=True,
                          output_padding=(1, 1)),
    "transposed_bwd_weight": problem(Op.BWD_WEIGHT, c=4, k=4, groups=4, transposed=True, bias=True),
    "asymmetric_same": problem(c=4, k=1, in_size=(5, 5), kernel=(2, 3), dilation=(3, 3),
                               padding=((1, 2), (3, 3))),
    "conv1d": problem(c=8, k=16, in_size=(50,), kernel=(5,), stride=(2,), padding=((2, 2),), dilation=(2,)),
    "conv3d_f64": problem(Op.BWD_DATA, c=3, k=3, in_size=(3, 1, 9), kernel=(3, 1, 9), groups=3,
                          padding=((1, 1), (0, 0), (0, 0)), dtype=DType.F64),
    "empty_batch": problem(n=0),
    "empty_channels": problem(c=0, k=6, groups=3),
}


# ------------------------------------------------------------------------------- keys


def test_key_is_a_sha256_hex_digest():
    for p in PROBLEMS.values():
        assert re.fullmatch(r"[0-9a-f]{64}", p.key()), p.key()
        assert re.fullmatch(r"[0-9a-f]{64}", p.kernel_key()), p.kernel_key()


def test_equal_problems_have_equal_keys():
    for p in PROBLEMS.values():
        twin = ConvProblem(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)})
        assert twin == p and twin.key() == p.key() and twin.kernel_key() == p.kernel_key()


def test_distinct_problems_have_distinct_keys():
    keys = [p.key() for p in PROBLEMS.values()]
    assert len(set(keys)) == len(keys)


def test_key_is_stable_across_processes():
    """The same problem gets the same key in another process with another hash seed (the key
    must never depend on Python's hash(); this process's seed is random unless set)."""
    expected = {name: [p.key(), p.kernel_key()] for name, p in PROBLEMS.items()}
    child = ("import json, sys; sys.path[:0] = sys.argv[1:]; import test_ir; "
             "print(json.dumps({n: [p.key(), p.kernel_key()] for n, p in test_ir.PROBLEMS.items()}))")
    seed = "1" if os.environ.get("PYTHONHASHSEED") == "0" else "0"
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-c", child, str(Path(__file__).parent), str(TESTS)], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert json.loads(out) == expected, f"keys differ in a child process with PYTHONHASHSEED={seed}"


# For every field of ConvProblem, a value different from BASE's (BASE is valid, and so is each change).
BASE = problem(Op.FWD, n=2, c=4, k=8, in_size=(8, 8), kernel=(3, 3), stride=(2, 2), padding=((1, 1), (1, 1)),
               dilation=(1, 1), transposed=True, output_padding=(1, 0))
CHANGES = {
    "op": Op.BWD_DATA,
    "n": 3,
    "c": 8,
    "k": 4,
    "in_size": (8, 9),
    "kernel": (3, 2),
    "stride": (2, 1),
    "padding": ((1, 1), (1, 0)),
    "dilation": (2, 1),
    "groups": 2,
    "transposed": False,
    "output_padding": (0, 1),
    "dtype": DType.F64,
    "input_layout": CL,
    "weight_layout": CL,
    "output_layout": CL,
    "bias": True,
    "tf32": True,   # f32 on tf32 matrix instructions (GPU targets; left out of the key while False)
}


def test_every_field_has_a_key_sensitivity_case():
    assert set(CHANGES) == {f.name for f in dataclasses.fields(ConvProblem)}, \
        "a field was added to or removed from ConvProblem: update CHANGES"


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_key_changes_with_each_field(field):
    changes = {field: CHANGES[field]}
    if field == "transposed":
        changes["output_padding"] = (0, 0)   # output_padding is only valid for transposed convolutions
    changed = dataclasses.replace(BASE, **changes).validate()
    assert changed.key() != BASE.key()
    if field != "n":
        assert changed.kernel_key() != BASE.kernel_key(), f"kernel_key ignores {field}"


def test_kernel_key_ignores_the_batch():
    for p in PROBLEMS.values():
        keys = {p.with_batch(n).kernel_key() for n in (0, 1, 7, 256)}
        assert len(keys) == 1
        assert p.with_batch(1).key() != p.with_batch(7).key()


# ------------------------------------------------------------------------------- derived sizes


@pytest.mark.parametrize("p, out_size, flops", [
    # (5 - 3) + 1 = 3 per axis; 2 * n * k * c * 3*3 * 3*3 FLOPs
    (problem(n=1, c=3, k=8, in_size=(5, 5)), (3, 3), 2 * 8 * 3 * 9 * 9),
    # (8 + 2 - 3) // 2 + 1 = 4; groups divide the reduction
    (problem(n=2, c=4, k=8, in_size=(8, 8), stride=(2, 2), padding=((1, 1), (1, 1)), groups=2), (4, 4),
     2 * 2 * 8 * 2 * 16 * 9),
    # dilated 1-D: 50 + 4 - 2*4 - 1 = 45, // 2 + 1 = 23
    (problem(n=4, c=8, k=16, in_size=(50,), kernel=(5,), stride=(2,), padding=((2, 2),), dilation=(2,)), (23,),
     2 * 4 * 16 * 8 * 23 * 5),
    # asymmetric padding ('same' for an even kernel): the output keeps the input's size
    (problem(n=1, c=4, k=1, in_size=(5, 5), kernel=(2, 3), dilation=(3, 3), padding=((1, 2), (3, 3))), (5, 5),
     2 * 1 * 4 * 25 * 6),
    # transposed: (4 - 1) * 2 - 2 - 2 + (3 - 1) + 1 + 1 = 6; the reduction runs over the input pixels
    (problem(n=1, c=3, k=3, in_size=(4, 4), stride=(2, 2), padding=((2, 2), (2, 2)), transposed=True,
             output_padding=(1, 1)), (6, 6), 2 * 3 * 3 * 16 * 9),
])
def test_out_size_and_flops(p, out_size, flops):
    assert p.validate().out_size == out_size
    assert p.flops == flops


def test_json_round_trip_and_unknown_keys():
    for p in PROBLEMS.values():
        assert ConvProblem.from_dict(json.loads(p.to_json())) == p
    with pytest.raises(ConvSpecError, match="unknown keys.*'strides'"):
        ConvProblem.from_dict({**json.loads(BASE.to_json()), "strides": [1, 1]})


# ------------------------------------------------------------------------------- names


@pytest.mark.parametrize("p, name", [
    # DESIGN.md's own example: weight gradient, stride 2, padding 1, channels-last everywhere
    (problem(Op.BWD_WEIGHT, n=32, c=64, k=128, in_size=(56, 56), stride=(2, 2), padding=((1, 1), (1, 1)),
             layout=CL),
     "conv2d_bwdw_c64_k128_56x56_r3x3_s2_p1_f32_nhwc"),
    # defaults (stride 1, no padding, dilation 1, groups 1, contiguous) leave no trace
    (problem(n=1, c=3, k=8, in_size=(5, 5)), "conv2d_fwd_c3_k8_5x5_r3x3_f32"),
    # the batch is not part of the name (it is a run-time argument)
    (problem(n=7, c=3, k=8, in_size=(5, 5)), "conv2d_fwd_c3_k8_5x5_r3x3_f32"),
    # a fused bias: fwd -> fwdb, bwdw -> bwdwb
    (problem(c=3, k=8, in_size=(5, 5), bias=True), "conv2d_fwdb_c3_k8_5x5_r3x3_f32"),
    (problem(Op.BWD_WEIGHT, c=3, k=8, in_size=(5, 5), bias=True), "conv2d_bwdwb_c3_k8_5x5_r3x3_f32"),
    (problem(Op.BWD_BIAS, c=3, k=8, in_size=(5, 5)), "conv2d_bwdb_c3_k8_5x5_r3x3_f32"),
    (problem(Op.BWD_DATA, c=3, k=8, in_size=(5, 5), dtype=DType.F64), "conv2d_bwdd_c3_k8_5x5_r3x3_f64"),
    # per-axis values are joined with x; groups, dilation
    (problem(c=4, k=2, in_size=(8, 8), stride=(3, 2), padding=((2, 2), (1, 1)), dilation=(4, 4), groups=2),
     "conv2d_fwd_c4_k2_8x8_r3x3_s3x2_p2x1_d4_g2_f32"),
    # asymmetric padding lists every (low, high)
    (problem(c=4, k=1, in_size=(5, 5), kernel=(2, 3), dilation=(3, 3), padding=((1, 2), (3, 3))),
     "conv2d_fwd_c4_k1_5x5_r2x3_p1x2x3x3_d3_f32"),
    # transposed with output_padding
    (problem(c=3, k=3, in_size=(4, 4), stride=(2, 2), padding=((2, 2), (2, 2)), transposed=True,
             output_padding=(1, 1)), "convT2d_fwd_c3_k3_4x4_r3x3_s2_p2_op1_f32"),
    # 1-D and 3-D; 3-D channels-last is ndhwc
    (problem(c=8, k=16, in_size=(50,), kernel=(5,), stride=(2,), padding=((2, 2),), dilation=(2,)),
     "conv1d_fwd_c8_k16_50_r5_s2_p2_d2_f32"),
    (problem(c=8, k=16, in_size=(6, 10, 10), kernel=(3, 3, 3), dtype=DType.BF16,
             layout=CL), "conv3d_fwd_c8_k16_6x10x10_r3x3x3_bf16_ndhwc"),
    # mixed layouts name each tensor's: input, weight, output (c = contiguous)
    (problem(c=3, k=8, in_size=(5, 5), layout=(CL, C, CL)),
     "conv2d_fwd_c3_k8_5x5_r3x3_f32_nhwccnhwc"),
])
def test_name(p, name):
    assert p.validate().name() == name


def test_names_are_symbol_safe():
    for p in PROBLEMS.values():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p.name()), p.name()


# ------------------------------------------------------------------------------- pipeline


@pytest.mark.parametrize("which", sorted(PROBLEMS))
def test_lower_records_a_reason_from_every_pass(which):
    plan = lower(PROBLEMS[which], host_cpu())
    assert isinstance(plan, Plan) and plan.problem == PROBLEMS[which]
    assert sorted(plan.applied) == sorted(PASS_NAMES)
    said = {pass_name for pass_name, _ in plan.reasons}
    assert said == set(PASS_NAMES), f"passes without a reason: {set(PASS_NAMES) - said}"
    for pass_name, reason in plan.reasons:
        assert isinstance(reason, str) and reason.strip() and "\n" not in reason, (pass_name, reason)


def test_lower_runs_passes_in_dependency_order():
    plan = lower(PROBLEMS["fwd"], host_cpu())
    passes = {p.name: p for p in pipeline_mod.load_passes()}
    provided: set[str] = set()
    for name in plan.applied:
        missing = set(passes[name].requires) - provided
        assert not missing, f"pass {name} ran before {missing} was provided"
        provided |= set(passes[name].provides)
    assert plan.applied[0] == "validate"
    # the reasons come in the order the passes ran
    order = [name for name, _ in plan.reasons]
    assert sorted(order, key=plan.applied.index) == order


def test_lower_validates_first():
    bad = dataclasses.replace(PROBLEMS["fwd"], stride=(0, 1))
    with pytest.raises(ConvSpecError, match=r"stride.*0"):
        lower(bad, host_cpu())


def _recording_pass(name, requires, provides, ran):
    def run(plan):
        ran.append(name)
        return plan
    return Pass(name, run, requires=requires, provides=provides)


def test_order_passes_follows_declared_dependencies():
    ran: list[str] = []
    passes = [
        _recording_pass("emit_prep", ("tiles", "layout"), ("ready",), ran),
        _recording_pass("tile", ("algo",), ("tiles",), ran),
        _recording_pass("check", (), ("valid",), ran),
        _recording_pass("lay", ("algo",), ("layout",), ran),
        _recording_pass("choose", ("valid",), ("algo",), ran),
    ]
    for order in (passes, passes[::-1]):
        names = [p.name for p in order_passes(list(order))]
        assert names[0] == "check" and names[1] == "choose" and names[-1] == "emit_prep"
        assert set(names[2:4]) == {"lay", "tile"}
    assert ran == [], "ordering must not run any pass"


def test_order_passes_fails_early_on_a_missing_requirement():
    ran: list[str] = []
    passes = [_recording_pass("check", (), ("valid",), ran),
              _recording_pass("choose", ("valid", "canonical"), ("algo",), ran)]
    with pytest.raises(ConvgenError, match=r"choose.*'canonical'"):
        order_passes(passes)
    assert ran == []


def test_order_passes_rejects_cycles_and_double_providers():
    ran: list[str] = []
    cycle = [_recording_pass("a", ("y",), ("x",), ran), _recording_pass("b", ("x",), ("y",), ran)]
    with pytest.raises(ConvgenError, match="cycle"):
        order_passes(cycle)
    twice = [_recording_pass("a", (), ("x",), ran), _recording_pass("b", (), ("x",), ran)]
    with pytest.raises(ConvgenError, match=r"'x'.*\ba\b.*\bb\b"):
        order_passes(twice)
    assert ran == []


def test_lower_fails_before_any_pass_when_the_pipeline_lacks_a_provider(monkeypatch):
    """Drop `canonicalise` from the registered passes: lower() must name the missing 'canonical'
    before the first pass runs."""
    real = pipeline_mod.load_passes()
    ran: list[str] = []
    wrapped = [dataclasses.replace(p, run=lambda plan, p=p: (ran.append(p.name), p.run(plan))[1])
               for p in real if p.name != "canonicalise"]
    monkeypatch.setattr(pipeline_mod, "load_passes", lambda: wrapped)
    pipeline_mod.pipeline.cache_clear()
    try:
        with pytest.raises(ConvgenError, match=r"requires 'canonical'"):
            lower(PROBLEMS["fwd"], host_cpu())
        assert ran == []
    finally:
        monkeypatch.undo()
        pipeline_mod.pipeline.cache_clear()
    assert lower(PROBLEMS["fwd"], host_cpu()).applied   # the real pipeline is back


# ------------------------------------------------------------------------------- emitted source


def _emit(p: ConvProblem, target: Target = AVX2):
    return emit(lower(p, target))


@pytest.mark.parametrize("which", sorted(set(PROBLEMS) - {"empty_batch", "empty_channels"}))
def test_source_begins_with_the_header(which):
    p = PROBLEMS[which]
    plan = lower(p, AVX2)
    src = emit(plan)
    lines = src.text.splitlines()
    assert lines[0].startswith(f"// Generated by convgen {generator_version()} ")
    header = []
    for line in lines:
        if not line.startswith("//"):
            break
        header.append(line)
    head = "\n".join(header)
    assert p.name() in head
    assert p.kernel_key() in head
    assert "cpu-avx2" in head
    for pass_name, reason in plan.reasons:
        assert f"[{pass_name}] {reason}" in head, f"reason of {pass_name} missing from the header"
    assert src.name == plan.name() and src.entry in src.text and 'extern "C"' in src.text


@pytest.mark.parametrize("which", sorted(set(PROBLEMS) - {"empty_batch", "empty_channels"}))
def test_source_does_not_depend_on_the_batch(which):
    p = PROBLEMS[which]
    one, seven = _emit(p.with_batch(1)), _emit(p.with_batch(7))
    assert one.text == seven.text
    assert (one.name, one.entry, one.signature) == (seven.name, seven.entry, seven.signature)
    assert ("i64", "n") in one.signature, "the batch must be a run-time argument of the entry"


@pytest.mark.parametrize("which", ["empty_batch", "empty_channels"])
def test_empty_problems_emit_nothing(which):
    plan = lower(PROBLEMS[which], AVX2)
    assert plan.algorithm == "empty"
    assert emit(plan) is None


@pytest.mark.parametrize("which", ["fwd", "bwd_data", "bwd_weight_bias_nhwc", "depthwise"])
def test_source_depends_on_the_target_isa(which):
    p = PROBLEMS[which]
    avx2, avx512 = _emit(p, AVX2), _emit(p, AVX512)
    assert avx2.text != avx512.text
    assert avx2.target == AVX2 and avx512.target == AVX512
    assert "cpu-avx2" in avx2.text and "cpu-avx512" not in avx2.text
    assert "cpu-avx512" in avx512.text
    assert lower(p, AVX2).key() != lower(p, AVX512).key()


# --- the host's ISA level ----------------------------------------------------------------------

KB = 1024


@pytest.fixture
def cpu_runs(monkeypatch):
    """Pretend this CPU runs the given ISA levels (widest first), with 48 KB L1 and 2 MB L2."""
    from convgen.codegen import target as target_mod

    def pretend(*runs):
        monkeypatch.setattr(target_mod, "_host_facts", lambda: ((*runs, "generic"), 48 * KB, 2048 * KB))
    monkeypatch.delenv("CONVGEN_ISA", raising=False)
    return pretend


@pytest.mark.parametrize("runs, identity, isa", [
    (("avx512", "avx2"), ("AuthenticAMD", 0x19), "avx512"),   # Zen 4 (half-width 512-bit FMAs) too
    (("avx512", "avx2"), ("GenuineIntel", 6), "avx512"),
    (("avx512", "avx2"), ("AuthenticAMD", 0x1a), "avx512"),   # Zen 5
    (("avx2",), ("GenuineIntel", 6), "avx2"), (("avx2",), ("AuthenticAMD", 0x19), "avx2"),
    ((), ("GenuineIntel", 6), "generic")])
def test_the_default_isa_is_the_widest_that_runs(cpu_runs, monkeypatch, runs, identity, isa):
    from convgen.codegen import target as target_mod
    monkeypatch.setattr(target_mod, "cpu_identity", lambda: identity)
    cpu_runs(*runs)
    t = target_mod.host_cpu()
    widths = {"avx512": (64, 32), "avx2": (32, 16), "generic": (16, 16)}
    assert (t.isa, t.vector_bytes, t.vector_registers) == (isa, *widths[isa])
    assert (t.l1_bytes, t.l2_bytes) == (48 * KB, 2048 * KB)
    assert t.fma_asm == (isa != "generic")


@pytest.mark.parametrize("identity, has_bf16, knob, dot", [
    (("AuthenticAMD", 0x19), True, "", True), (("GenuineIntel", 6), True, "", False),
    (("GenuineIntel", 6), True, "1", True), (("AuthenticAMD", 0x19), True, "0", False),
    (("AuthenticAMD", 0x19), False, "1", False)])
def test_bf16_pairs_where_vdpbf16ps_pays_or_where_asked(cpu_runs, monkeypatch, identity, has_bf16, knob, dot):
    """vdpbf16ps by default on AMD (as fast as an FMA there), not on Intel (half the products per
    cycle of f32 FMAs); CONVGEN_BF16_DOT decides where set, and never where the CPU lacks it."""
    from convgen.codegen import target as target_mod
    monkeypatch.setattr(target_mod, "cpu_identity", lambda: identity)
    monkeypatch.setattr(target_mod, "host_bf16_dot", lambda: has_bf16)
    monkeypatch.setenv("CONVGEN_BF16_DOT", knob)
    cpu_runs("avx512", "avx2")
    assert target_mod.host_cpu().bf16_dot is dot


def test_convgen_isa_picks_a_level_the_cpu_runs(cpu_runs, monkeypatch):
    from convgen.codegen import target as target_mod
    from convgen.codegen.target import host_cpu, isa_note
    monkeypatch.setattr(target_mod, "cpu_identity", lambda: ("AuthenticAMD", 0x19))
    monkeypatch.setattr(target_mod, "host_bf16_dot", lambda: True)   # Zen 4: AVX2 code with EVEX tiles
    cpu_runs("avx512", "avx2")
    assert "this CPU's default" in isa_note(host_cpu())
    monkeypatch.setenv("CONVGEN_ISA", "avx2")
    t = host_cpu()
    assert (t.isa, t.vector_bytes, t.vector_registers, t.fma_asm, t.evex_tiles) == ("avx2", 32, 16, True, True)
    assert "default (avx512)" in isa_note(t)
    monkeypatch.setenv("CONVGEN_ISA", "avx512")
    t = host_cpu()
    assert (t.isa, t.vector_bytes, t.vector_registers, t.fma_asm, t.evex_tiles) == ("avx512", 64, 32, True, True)
    assert "this CPU's default" in isa_note(t)
    monkeypatch.setenv("CONVGEN_ISA", "Generic ")
    assert host_cpu().isa == "generic"


@pytest.mark.parametrize("value, words", [("avx512", ["CONVGEN_ISA='avx512'", "does not run", "avx2, generic"]),
                                          ("sse4", ["CONVGEN_ISA='sse4'", "avx512, avx2, generic"])])
def test_convgen_isa_errors_name_the_variable_value_and_choices(cpu_runs, monkeypatch, value, words):
    from convgen.codegen.errors import ConvgenError
    from convgen.codegen.target import host_cpu
    cpu_runs("avx2")
    monkeypatch.setenv("CONVGEN_ISA", value)
    with pytest.raises(ConvgenError) as e:
        host_cpu()
    assert all(w in str(e.value) for w in words), str(e.value)
