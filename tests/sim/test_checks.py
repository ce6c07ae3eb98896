"""The simulator's checks (templates/gpu/sim/checks.h) against real generated kernels with bugs in them.

Each mutation is an edit of the CUDA or HIP source that `convgen show` prints for a small bf16
problem (the implicit-GEMM kernels of every pass), of a kind a GPU exposes: a race on a pipeline
stage, an out-of-bounds read, a misaligned 16-byte copy, a read of shared memory or workspace
nothing wrote, a copy waited for one group short, ... Every edited kernel runs under the forward,
reversed and shuffled thread orders and must be caught every time: by the check that names its
kind (a SimulatorError), or, for the kinds that only compute wrong numbers (a shuffle tree a level
short, swapped fragment registers), by the comparison with ATen in float64. Each edit is asserted
to apply, so a template change cannot make a mutation silently vanish. The unedited kernels pass
(no false alarm) in sim/test_runtime.py's matrix, where every library runs with the checks on.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from convgen.building import sim_build
from convgen.codegen.emit import emit
from convgen.codegen.errors import SimulatorError
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import parse_target
from convgen.devices import sim

from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient, check_weight_gradient, generator_for

pytestmark = pytest.mark.skipif(sim_build.fp16_include_dir() is None,
                                reason="NVIDIA's cuda_fp16.h/cuda_bf16.h (CUDA toolkit) not found: bf16 kernels need them")

# (cuda-sm_90a: the implicit GEMM on warpgroup MMA, the simulator's wgmma emulation reading the stages)
TARGETS = {"cuda": "cuda-sm_90", "hip": "hip-gfx90a", "cuda-sm_90a": "cuda-sm_90a"}
ORDERS = ("forward", "reverse", "shuffle")


def problem(op: Op, family: str = "igemm", layout: Layout = Layout.CONTIGUOUS) -> ConvProblem:
    """igemm: a bf16 3x3 layer, 48 -> 56 channels at 6x6, batch 2: 72 GEMM rows and a 56-filter
    weight gradient, so every tile has ragged edges, and reductions (432 and 504 deep: 7 and 8 steps
    of 64) longer than the forward's and data gradient's pipelines (6 stages on sm_90), so that every
    stage is refilled.
    depthwise: 16 channels 3x3 at 9x9; stem: 3 -> 16 channels 7x7 stride 2 at 16x16."""
    c, k, size, kernel, stride, pad, groups = {
        "igemm": (48, 56, (6, 6), (3, 3), 1, 1, 1), "depthwise": (16, 16, (9, 9), (3, 3), 1, 1, 16),
        "stem": (3, 16, (16, 16), (7, 7), 2, 3, 1)}[family]
    return conv_problem(2, c, k, size, kernel, stride, pad, groups=groups, op=op, dtype=DType.BF16, layout=layout,
                        bias=op is not Op.BWD_DATA)


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    op: Op
    vendors: tuple[str, ...]
    edits: tuple[tuple[str, str], ...]   # (regex, replacement): each must match at least once
    caught: str                          # regex of the SimulatorError, or "wrong result"
    family: str = "igemm"                # the kernel family the problem takes (problem())


BARRIER = r"\n *__syncthreads\(\);   // \.\.\. and everyone's[^\n]*"
COMMIT = r"convgen_copy_commit\(\);   // a group per step[^\n]*"
MUTATIONS = [
    # the main loop's barrier moved below the next stage's load and commit: fast warps overwrite a
    # stage slow warps still read (HIP lands its registers after the math, where nothing changes)
    Mutation("barrier below the next load", Op.FWD, ("cuda",),
             ((BARRIER, ""), (COMMIT, r"\g<0>\n        __syncthreads();")), "write after read|in flight"),
    Mutation("main-loop barrier deleted", Op.FWD, ("cuda", "hip"), ((BARRIER, ""),), "race|in flight"),
    Mutation("next stage loaded into the current one", Op.BWD_DATA, ("cuda", "hip"),
             ((r"load\(write_stage, ", "load(read_stage, "),), "race|in flight"),
    Mutation("wait one group short", Op.FWD, ("cuda",),
             ((r"convgen_copy_wait<STAGES - 2>\(\)", "convgen_copy_wait<STAGES - 1>()"),), "in flight"),
    Mutation("no empty commit at the end", Op.FWD, ("cuda",),
             ((COMMIT, "if (more) convgen_copy_commit();"),), "in flight"),
    # 56 filters in a 64-row tile: rows 56..63 of the last image's grad_output run past its end (the
    # buffer the report names as nearest is wherever the heap put the tensors: grad_output, or once
    # in a full run grad_bias, 350 bytes past its end). HIP stages this layer's activations channels-
    # last and copies them along filters and channels (no gathers): there its copies' predicate is
    # ignored instead (the invalid copies read wherever their iterator points, past the reduction's end)
    Mutation("weight gradient's row predicate removed", Op.BWD_WEIGHT, ("cuda",),
             ((r"m0 \+ row < op\.M\) && ", "true) && "),), "outside every buffer the entry was given|past the end of grad_output"),
    Mutation("transposed copies' predicate ignored", Op.BWD_WEIGHT, ("hip",),
             ((r"stage\.value\[i\] = valid \? \*\(CONVGEN_GLOBAL_U128\*\)global : convgen_u128\{\};(\n    stage\.shared\[i\] = \(convgen_lds_bytes\))",
               r"stage.value[i] = *(CONVGEN_GLOBAL_U128*)global;\1"),),
             "outside every buffer the entry was given|past the end|wrong result|uninitialised"),
    Mutation("zero fill of ragged rows removed", Op.FWD, ("cuda", "hip"),
             ((r"a_tile\[tile_at\(row, k\)\] = inside \? (op\.a\(.*?, k0 \+ k\)) : Bits\(0\);",
               r"if (inside) a_tile[tile_at(row, k)] = \1;"),), "uninitialised"),
    Mutation("a split's partials left unwritten", Op.BWD_WEIGHT, ("cuda", "hip"),
             ((r"(block_gemm<WGRAD_M, WGRAD_N, WGRAD_STAGES>\(op,)", r"if (blockIdx.x + blockIdx.y != 0) \1"),),
             "the workspace.*no kernel of this call wrote"),
    Mutation("shuffle tree a level short", Op.BWD_WEIGHT, ("cuda", "hip"),
             ((r"for \(int offset = CONVGEN_WARP / 2; offset > 0; offset /= 2\) sum \+= convgen_shfl_xor",
               "for (int offset = CONVGEN_WARP / 4; offset > 0; offset /= 2) sum += convgen_shfl_xor"),),
             "wrong result"),
    Mutation("shuffle of a lane outside the mask", Op.BWD_WEIGHT, ("cuda",),
             ((r"__shfl_xor_sync\(CONVGEN_FULL_MASK, v, lanes\)", "__shfl_xor_sync(0xffffu, v, lanes)"),), "mask"),
    # the 16-bit fragments come from ldmatrix.x4 (cuda.h): the B pair's middle registers swapped (the
    # first fragment's k 8-15 with the second's k 0-7); the A rows read where an unswizzled tile has them
    Mutation("fragment registers swapped", Op.FWD, ("cuda",),
             ((r"first\.r\[1\] = r\[1\];\n    second\.r\[0\] = r\[2\];",
               "first.r[1] = r[2];\n    second.r[0] = r[1];"),), "wrong result"),
    Mutation("ldmatrix rows read unswizzled", Op.BWD_DATA, ("cuda",),
             ((r"a_lane\[s\] = \(int\)sizeof\(Bits\) \* tile_at\(warp_m \+ lane % 16, s \* MMA_K \+ lane / 16 \* 8\);",
               "a_lane[s] = (int)sizeof(Bits) * ((warp_m + lane % 16) * LDS + s * MMA_K + lane / 16 * 8);"),),
             "wrong result"),
    # sm_90a's warp-specialised warpgroup MMA (its copies are sm_90's: the mutations above cover them):
    # the consumer multiplying a stage without waiting for it to be full; the producer refilling one
    # without waiting for it to be empty (the reductions are longer than the 6 stages: every stage is
    # refilled); the consumer's MMA wait one group short, which frees a stage the MMAs of the step
    # before still read (the producer's next copies land in it first); each 16-deep slice read from
    # the step's first (the descriptors' advance lost)
    Mutation("consumer's full wait deleted", Op.FWD, ("cuda-sm_90a",),
             ((r"convgen_mbarrier_wait\(full \+ 8 \* stage, phase & 1\);", ""),), "in flight|race|uninitialised"),
    Mutation("producer's empty wait deleted", Op.BWD_DATA, ("cuda-sm_90a",),
             ((r"if \(step >= STAGES\) convgen_mbarrier_wait\(empty \+ 8 \* stage, \(phase - 1\) & 1\);", ""),),
             "in flight|race"),
    Mutation("wgmma wait one group short", Op.BWD_DATA, ("cuda-sm_90a",),
             ((r"convgen_wgmma_wait<1>\(\);   // the previous step's MMAs are done[^\n]*", "convgen_wgmma_wait<2>();"),),
             "in flight|race"),
    Mutation("wgmma slices not advanced", Op.FWD, ("cuda-sm_90a",),
             ((r"a_step \+ s \* A_SLICE", "a_step"),), "wrong result"),
    # the other families' barriers, and the bias gradient's block reduction (conv_common.cu.j2)
    Mutation("depthwise window barrier deleted", Op.FWD, ("cuda", "hip"),
             ((r"\n *__syncthreads\(\);   // the window \(and the taps\) are complete", ""),), "race", "depthwise"),
    Mutation("stem tiles barrier deleted", Op.BWD_WEIGHT, ("cuda", "hip"),
             ((r"\n *__syncthreads\(\);   // both tiles complete", ""),), "race", "stem"),
    Mutation("block reduction barrier deleted", Op.BWD_BIAS, ("cuda", "hip"),
             ((r"(warp_sums\[threadIdx\.x / CONVGEN_WARP\] = sum;)\n *__syncthreads\(\);", r"\1"),), "race"),
]


def _mutated(mutation: Mutation, vendor: str, tmp_path) -> sim.SimKernel:
    p = problem(mutation.op, mutation.family)
    plan = lower(p, parse_target(TARGETS[vendor]))
    assert plan.algorithm == mutation.family, \
        f"{mutation.name}: the problem no longer takes {mutation.family} ({plan.algorithm})"
    source = emit(plan)
    text = source.text
    for pattern, replacement in mutation.edits:
        text, count = re.subn(pattern, replacement, text)
        assert count, f"{mutation.name}: the edit {pattern!r} no longer applies to the generated {vendor} source"
    name = re.sub(r"\W+", "_", mutation.name)
    library = sim.build(text, tmp_path, name, vendor.partition("-")[0])
    return sim.SimKernel(dataclasses.replace(source, text=text), library.path), p


@pytest.mark.parametrize("mutation,vendor", [(m, v) for m in MUTATIONS for v in m.vendors],
                         ids=lambda x: x.name.replace(" ", "_") if isinstance(x, Mutation) else x)
def test_every_mutation_is_caught_in_every_order(mutation, vendor, tmp_path, monkeypatch):
    kernel, p = _mutated(mutation, vendor, tmp_path)
    check = {Op.BWD_WEIGHT: check_weight_gradient, Op.BWD_BIAS: check_bias_gradient}.get(p.op, check_forward_or_data_gradient)
    for order in ORDERS:
        monkeypatch.setenv("CONVGEN_SIM_ORDER", order)
        gen = generator_for(f"{mutation.name}-{vendor}-{order}")
        if mutation.caught == "wrong result":
            with pytest.raises(AssertionError, match="rel err|unwritten"):
                check(kernel, p, gen)
        else:
            with pytest.raises(SimulatorError, match=mutation.caught):
                check(kernel, p, gen)


def check_bias_gradient(kernel, p: ConvProblem, gen: torch.Generator) -> None:
    gy = torch.randn(p.output_shape, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    db = torch.full((p.k,), float("nan"), dtype=torch.bfloat16)
    kernel({"grad_output": gy, "grad_bias": db}, p.n, 2)
    ref = gy.double().sum(dim=(0, 2, 3))
    assert (db.double() - ref).abs().max() <= 0.02 * ref.abs().max(), "grad_bias rel err"


@pytest.mark.parametrize("vendor", ["cuda", "hip"])
def test_a_misaligned_16_byte_copy_faults(vendor, tmp_path, monkeypatch):
    """The run-time alignment check removed and the operands at a 2-byte storage offset: the 16-byte
    copies (cp.async on CUDA, global_load_dwordx4 on HIP) fault as on a GPU."""
    mutation = Mutation("alignment check removed", Op.FWD, (vendor,),
                        ((r"aligned16\(x\) && aligned16\(w\)", "true"),), "not aligned to its 16 bytes")
    kernel, p = _mutated(mutation, vendor, tmp_path)
    gen = generator_for(f"misaligned-{vendor}")

    def shifted(shape):   # a view one element into its storage: 2 bytes off every 16-byte boundary
        t = torch.randn(torch.Size(shape).numel() + 1, generator=gen, dtype=torch.float64).to(torch.bfloat16)
        return t[1:].view(shape)

    x, w = shifted(p.input_shape), shifted(p.weight_shape)
    b = torch.zeros(p.k, dtype=torch.bfloat16)
    y = torch.empty(p.output_shape, dtype=torch.bfloat16)
    for order in ORDERS:
        monkeypatch.setenv("CONVGEN_SIM_ORDER", order)
        with pytest.raises(SimulatorError, match=mutation.caught):
            kernel({"input": x, "weight": w, "bias": b, "output": y}, p.n, 2)
    # the unedited kernel takes the element path for such operands: right, and no fault
    right = sim.SimKernel(emit(lower(p, parse_target(TARGETS[vendor]))),
                          sim.build(emit(lower(p, parse_target(TARGETS[vendor]))).text, tmp_path, "right",
                                    vendor.partition("-")[0]).path)
    right({"input": x, "weight": w, "bias": b, "output": y}, p.n, 2)
    ref = torch.ops.aten.convolution(x.double(), w.double(), b.double(), [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert (y.double() - ref).abs().max() <= 0.05 * ref.abs().max()


@pytest.mark.parametrize("vendor", list(TARGETS))
def test_the_unedited_kernels_pass_every_check(vendor, tmp_path, monkeypatch):
    """No false alarm: the same kernels, unedited, with the checks on, in every order, right."""
    for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT):
        p = problem(op)
        source = emit(lower(p, parse_target(TARGETS[vendor])))
        library = sim.build(source.text, tmp_path, f"{op.value}_{vendor}", vendor.partition("-")[0])
        assert library.checked
        kernel = sim.SimKernel(source, library.path)
        check = check_weight_gradient if op is Op.BWD_WEIGHT else check_forward_or_data_gradient
        for order in ORDERS:
            monkeypatch.setenv("CONVGEN_SIM_ORDER", order)
            check(kernel, p, generator_for(f"right-{op.value}-{vendor}-{order}"))


def test_the_profile_reports_each_launch_from_the_command_line_and_python(capsys, monkeypatch):
    """`convgen check --sim --profile` prints every launch's counters under its pass, and
    `convgen.sim_profile()` collects the same counters around any simulated call; --profile
    without the simulator is refused, naming the flag."""
    import convgen
    from convgen.cli import main

    flags = ["--input", "1,16,5,5", "--weight", "24,16,3,3", "--padding", "1", "--dtype", "bf16"]
    assert main(["check", *flags, "--target", "cuda-sm_90", "--sim", "--profile"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\n    fwd: \d+ blocks, \d+ barriers, \d+ tensor instructions; shared \d+ requests, "
                     r"[\d.]+ bank conflicts per request", out)
    assert "bwd_weight_partial:" in out and "bwd_data:" in out
    assert main(["check", *flags, "--target", "cpu", "--profile"]) != 0
    assert "--profile" in capsys.readouterr().err

    x, w = torch.randn(1, 16, 5, 5).bfloat16(), torch.randn(24, 16, 3, 3).bfloat16()
    monkeypatch.setenv("CONVGEN_SIM", "cuda")
    with convgen.sim_profile() as launches:
        convgen.conv2d(x, w, padding=1)
    (launch,) = [p for p in launches if p["kernel"] == "fwd"]
    assert launch["tensor_instructions"] > 0 and launch["bytes_written"] == 24 * 25 * 2
    assert launch["shared_wavefronts"] >= launch["shared_ideal"] > 0 and launch["global_sectors"] > 0
