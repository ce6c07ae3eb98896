"""`convgen bench`: the suites, the FLOP counts, the peak probe, the report and its table.

Timings are never asserted (DESIGN.md "Testing": speed is measured, not tested); only that the
report is complete, its numbers positive and its correctness check passed. The benchmark runs
in this process on the tiny `smoke` suite, with kernels in the session's cache directory.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from convgen.bench import bench, peak, suites
from convgen import cli
from convgen.codegen.ir import DType, Layout
from convgen.codegen.target import host_cpu
from convgen.dispatch.problem import base_problem

from support.commands import run


# --- the suites ------------------------------------------------------------------------------

ALL_SHAPES = [s for shapes in suites.SUITES.values() for s in shapes]


def test_suites_hold_the_curated_shapes():
    assert [s.name for s in suites.STANDARD] == [
        "r50_3x3_64", "r50_1x1_64_256", "r50_3x3_128_s2", "r50_3x3_256", "r50_3x3_512", "r50_1x1_2048_512",
        "deeplab_dil2", "unet3d", "dcgan_tconv"]
    assert [s.name for s in suites.WEAK] == [
        "r50_stem", "mbv2_dw", "mbv2_dw_s2", "rnx_grouped", "wavenet_1d", "odd_asym"]
    assert 2 <= len(suites.SMOKE) <= 3
    names = [s.name for s in ALL_SHAPES]
    assert len(names) == len(set(names))
    assert [name for name, _ in suites.select("all")] == ["standard", "weak"]


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=[s.name for s in ALL_SHAPES])
def test_every_shape_is_a_valid_convolution(shape):
    assert shape.comment
    x, w = torch.empty(shape.input), torch.empty(shape.weight)
    problem = base_problem(x, w, torch.empty(shape.out_channels), *shape.conv_args())
    assert problem.output_shape == tuple(torch.ops.aten.convolution(
        torch.empty(shape.input, device="meta"), torch.empty(shape.weight, device="meta"), None,
        *shape.conv_args()).shape)


def test_dcgan_is_transposed_16_to_32():
    (dcgan,) = [s for s in suites.STANDARD if s.name == "dcgan_tconv"]
    x, w = torch.empty(dcgan.input), torch.empty(dcgan.weight)
    assert base_problem(x, w, None, *dcgan.conv_args()).output_shape == (8, 64, 32, 32)


def test_a_problem_from_the_command_line_becomes_a_shape():
    args = cli.parser().parse_args(["bench", "--input", "2,4,9,9", "--weight", "6,2,3,3", "--stride", "2",
                                    "--padding", "1", "--groups", "2", "--bias"])
    shape = suites.BenchShape.from_problem(cli.problem_from_args(args))
    assert shape.input == (2, 4, 9, 9) and shape.weight == (6, 2, 3, 3) and shape.bias
    assert shape.conv_args() == ([2, 2], [1, 1], [1, 1], False, [0, 0], 2)


# --- FLOPs -----------------------------------------------------------------------------------

def _shape_problem(shape):
    """The forward problem of a bench-suite shape, without bias."""
    return base_problem(torch.empty(shape.input), torch.empty(shape.weight), None, *shape.conv_args())


def test_flops_forward_backward_and_bias():
    r50 = _shape_problem(suites.STANDARD[0])   # N8, 64 -> 64, 56x56, 3x3
    fwd = 2 * 8 * 64 * 64 * 56 * 56 * 9
    bias = 8 * 64 * 56 * 56
    assert bench.flops(r50) == {"forward": fwd, "backward": 2 * fwd + bias}
    dw = _shape_problem([s for s in suites.WEAK if s.name == "mbv2_dw"][0])   # C/g = 1
    assert bench.flops(dw)["forward"] == 2 * 8 * 144 * 1 * 56 * 56 * 9


def test_flops_of_a_transposed_conv_are_those_of_its_direct_twin():
    (dcgan,) = [s for s in suites.STANDARD if s.name == "dcgan_tconv"]
    t = _shape_problem(dcgan)
    # the direct convolution 64 -> 128 from 32x32 to 16x16 whose data gradient it is
    assert bench.flops(t)["forward"] == 2 * 8 * 128 * 64 * 16 * 16 * 16
    assert bench.flops(t)["backward"] == 2 * bench.flops(t)["forward"] + 8 * 64 * 32 * 32


def test_summary_geomean_and_minimum():
    rows = [{"name": n, "within_tolerance": True,
             "results": {"forward": {"ratio_torch_over_convgen": f}, "backward": {"ratio_torch_over_convgen": b}}}
            for n, f, b in (("a", 2.0, 1.0), ("b", 0.5, 4.0))] + [{"name": "c", "error": "BuildError: x"}]
    s = bench.summarize(rows)
    assert math.isclose(s["geomean_forward"], 1.0) and math.isclose(s["geomean_backward"], 2.0)
    assert s["min_forward"] == {"ratio": 0.5, "name": "b"} and s["min_backward"] == {"ratio": 1.0, "name": "a"}
    assert s["timed"] == 2 and s["errors"] == 1


def test_channels_last_operands_except_in_one_d():
    gen = torch.Generator().manual_seed(0)
    options = bench.Options(dtype=DType.BF16, layout=Layout.CHANNELS_LAST)
    two_d, one_d = (bench.make_case("smoke", s, options, gen) for s in suites.SMOKE[:2])
    for t in ("input", "weight", "grad_output"):
        assert two_d.tensors[t].is_contiguous(memory_format=torch.channels_last)
        assert two_d.tensors[t].dtype == torch.bfloat16
    assert one_d.layout is Layout.CONTIGUOUS and one_d.tensors["input"].is_contiguous()


# --- the peak probe --------------------------------------------------------------------------

def test_peak_probe_is_built_by_convgen_measured_and_cached():
    source = peak.probe_source(host_cpu())
    assert f"vector_size({host_cpu().vector_bytes})" in source.text and "omp parallel" in source.text
    assert source.text.count("* a + b;") == peak.chains_for(host_cpu())
    first = peak.measure(1)
    assert first.gflops > 0 and first.threads == 1
    assert peak.measure(1) is first   # cached in-process
    assert first.theoretical_gflops is None or first.theoretical_gflops > 0


# --- the command -----------------------------------------------------------------------------

def test_bench_smoke_suite_json(capsys):
    threads = torch.get_num_threads()
    code, out, err = run(capsys, "bench", "--suite", "smoke", "--repeat", "2", "--json")
    assert code == 0, err
    assert torch.get_num_threads() == threads
    report = json.loads(out)
    for key in ("machine", "date", "torch", "convgen", "peak", "threads", "dtype", "layout", "flops", "warnings"):
        assert key in report
    assert report["torch"] == torch.__version__ and report["dtype"] == "f32" and report["repeat"] == 2
    host = report["machine"]["host_class"]   # the host class, by which BENCHMARKS.md groups its tables
    assert host["isa_levels"][-1] == "generic" and host["label"].startswith(host["isa_levels"][0])
    assert host["avx512_bf16"] == ("avx512_bf16" in open("/proc/cpuinfo").read())
    amx = "amx_bf16" in open("/proc/cpuinfo").read() and "amx_tile" in open("/proc/cpuinfo").read()
    assert host["amx_bf16"] == amx and host["label"].endswith("+amx") == (amx and host["isa_levels"][0] == "avx512")
    assert host["vendor"] in open("/proc/cpuinfo").read() and host["default_isa"] in host["isa_levels"]
    assert report["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert report["peak"]["gflops"] > 0 and report["peak"]["threads"] == report["threads"]
    (suite,) = report["suites"]
    assert suite["name"] == "smoke"
    assert [r["name"] for r in suite["rows"]] == [s.name for s in suites.SMOKE]
    for row in suite["rows"]:
        assert "error" not in row, row.get("error")
        assert row["within_tolerance"], (row["rel_error"], row["tolerance"])
        assert set(row["rel_error"]) == {"output", "grad_input", "grad_weight", "grad_bias"}
        assert row["flops"]["backward"] > 2 * row["flops"]["forward"] > 0
        for pass_name in ("forward", "backward"):
            r = row["results"][pass_name]
            for field in ("torch_ms", "convgen_ms", "torch_gflops", "convgen_gflops", "ratio_torch_over_convgen",
                          "convgen_pct_peak"):
                assert r[field] > 0, (row["name"], pass_name, field)
            assert len(r["torch_samples_ms"]) == len(r["convgen_samples_ms"]) == 2
    summary = suite["summary"]
    assert summary["timed"] == 3 and summary["geomean_forward"] > 0 and summary["geomean_backward"] > 0
    assert summary["min_backward"]["name"] in {s.name for s in suites.SMOKE}


def test_bench_smoke_suite_table(capsys):
    code, out, err = run(capsys, "bench", "--suite", "smoke", "--repeat", "1", "--min-time", "0", "--threads", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("convgen ") and "1 thread(s)" in lines[0]
    assert any(line.startswith("peak (f32 FMA probe") and "GFLOP/s" in line for line in lines)
    header = next(line for line in lines if line.startswith("shape"))
    for column in ("fwd torch", "fwd cg", "fwd x", "bwd torch", "bwd cg", "bwd x", "bwd GF/s", "% peak", "rel err"):
        assert column in header
    for shape in suites.SMOKE:
        row = next(line for line in lines if line.startswith(shape.name))
        assert len(row.split()) == 10 and "!" not in row and "error" not in row
    assert any(line.startswith("geomean torch/convgen (3 shape(s)): forward") for line in lines)


def test_batch_replaces_every_suite_shapes_batch_and_nothing_else():
    for (name, shapes), (same, given) in zip(suites.select("all", 64), suites.select("all")):
        assert name == same and len(shapes) == len(given)
        for shape, original in zip(shapes, given):
            assert shape.input == (64, *original.input[1:])
            assert dataclasses.replace(shape, input=original.input) == original
    assert suites.select("smoke") == [("smoke", suites.SMOKE)]


@pytest.mark.parametrize("argv, words", [
    (["--suite", "smoke", "--input", "1,4,6,6"], "drop --input"),
    ([], "give --suite"),
    (["--suite", "smoke", "--repeat", "0"], "--repeat 0"),
    (["--input", "1,4,6,6", "--weight", "4,4,4,4", "--padding", "same"], "asymmetric"),
    (["--suite", "smoke", "--batch", "0"], "--batch 0: need a batch of at least 1"),
    (["--input", "1,4,6,6", "--weight", "4,4,3,3", "--batch", "2"], "one problem takes its batch from --input"),
], ids=["suite-and-shape", "neither", "repeat-0", "asymmetric-padding", "batch-0", "batch-of-one-problem"])
def test_bench_refuses_bad_requests_in_one_line(capsys, argv, words):
    code, out, err = run(capsys, "bench", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and words in err, err


def test_a_shape_that_does_not_build_becomes_an_error_row(monkeypatch):
    from convgen import BuildError
    from convgen.dispatch import dispatch

    real = dispatch.prepare

    def prepare(problems, *args, **kwargs):
        if any(p.rank == 1 for p in problems):
            raise BuildError("1 kernel(s) failed to build (a test's stand-in)")
        return real(problems, *args, **kwargs)

    monkeypatch.setattr(dispatch, "prepare", prepare)
    report = bench.run([("smoke", suites.SMOKE)], bench.Options(repeat=1, min_time=0.0))
    rows = {r["name"]: r for r in report["suites"][0]["rows"]}
    assert "BuildError" in rows["smoke_1d_dil"]["error"] and "results" not in rows["smoke_1d_dil"]
    assert all("results" in rows[s.name] for s in suites.SMOKE if s.rank != 1)
    assert report["suites"][0]["summary"]["errors"] == 1 and not bench.ok(report)
    assert any("smoke_1d_dil: not timed" in w for w in report["warnings"])
    line = bench.table_row(rows["smoke_1d_dil"], 16)
    assert line.startswith("smoke_1d_dil") and "error: BuildError" in line
