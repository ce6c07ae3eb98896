"""The depthwise GPU kernels read and write their shared tiles without bank conflicts (issue 47).

A block of a channels-last problem owns CT = 32 channels (fewer when there are fewer filters), and
consecutive lanes take consecutive channels. Its shared tiles (the input window, the taps, the data
gradient's grad_output window, the weight gradient's grad_output tile) keep a pixel's channels
together, CTP words apart (templates/gpu/depthwise.cu.j2): CT when every tensor is channels-last,
else odd, so that lanes taking consecutive pixels of one channel (a contiguous tensor's order) fall
in distinct banks too. Before, the tiles were channel-major, a channel's pixels together: the 32
lanes of a warp read words a whole window (36 words for 4x4 outputs of a 3x3 kernel) or tile (16)
apart, 8 and 16 to a bank: the weight gradient took 9.9 wavefronts a request (measured here with
`convgen check --sim --profile` on 144 channels of 12x12, bf16 channels-last), the forward 2.5.

The kernels run in the simulator with its profile on (a warp's shared request takes as many
wavefronts as the most distinct 4-byte words one bank serves in a phase of lanes; ideal: one a
phase). Every launch of every pass of the all-channels-last problems is ideal, stride 1 and 2 (the
data gradient's every stride phase); with the input alone channels-last (the output's order is by
pixels), every launch is within 1.5 times ideal; with the channels an even number of words apart
there (CTP = CT), every launch conflicts more: so the test sees the layout.
"""

from __future__ import annotations

import ctypes
import re

import pytest
import torch

from convgen.building import sim_build
from convgen.codegen.gpu.depthwise import depthwise_context, render_depthwise
from convgen.codegen.ir import DType, Layout
from convgen.codegen.target import parse_target
from convgen.devices import sim

from support.problems import GPU_LAYOUTS, conv_problem
from support.reference import generator_for, in_layout, randn

pytestmark = pytest.mark.skipif(sim_build.fp16_include_dir() is None,
                                reason="NVIDIA's cuda_fp16.h/cuda_bf16.h (CUDA toolkit) not found: bf16 kernels need them")

TARGET = parse_target("cuda-sm_90")
DTYPES = {"bf16": (DType.BF16, torch.bfloat16), "f32": (DType.F32, torch.float32)}
KERNELS = ("fwd", "bwd_data", "bwd_weight_partial")
# name: (channels, size, stride, layouts); 48 channels: a block of 32 and one of 16 (of 32 slots)
CASES = {"cl_s1": (48, (9, 10), 1, "cl"), "cl_s2": (48, (11, 9), 2, "cl"), "x_cl": (48, (9, 10), 1, "x_cl")}


def _problem(name: str, dtype: str):
    c, size, stride, layout = CASES[name]
    return conv_problem(2, c, c, size, 3, stride, 1, groups=c, dtype=DTYPES[dtype][0], layout=GPU_LAYOUTS[layout],
                        bias=True).validate()


def _source(even: bool = False) -> str:
    text = "".join(render_depthwise(_problem(name, dtype), TARGET, f"dw_{name}_{dtype}")
                   for name in CASES for dtype in DTYPES)
    if even:   # every tile's channels CT words apart, odd or not
        text, count = re.subn(r"constexpr int CTP = \d+;", "constexpr int CTP = CT;", text)
        assert count == len(CASES) * len(DTYPES), "CTP is no longer where this test sets it"
    return text


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("depthwise_banks")
    return {False: sim.build(_source(), d, "dw_banks", "cuda"), True: sim.build(_source(True), d, "dw_banks_even", "cuda")}


def _launches(lib, name: str, dtype: str) -> dict[str, list[dict]]:
    """Every pass of the case (the bias fused into the weight gradient), profiled, by kernel."""
    problem, torch_dtype = _problem(name, dtype), DTYPES[dtype][1]
    g = generator_for(f"dw-banks-{name}-{dtype}")
    p, n = sim.pointer, ctypes.c_longlong(problem.n)
    x = in_layout(randn(problem.input_shape, torch_dtype, g), problem.input_layout)
    w = in_layout(randn(problem.weight_shape, torch_dtype, g), problem.weight_layout)
    dy = in_layout(randn(problem.output_shape, torch_dtype, g), problem.output_layout)
    b = randn((problem.k,), torch_dtype, g)
    y, dx, dw, db = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
    prefix = f"dw_{name}_{dtype}"
    sizes = getattr(lib.lib, f"{prefix}_bwd_weight_bias_workspace_bytes")
    sizes.restype = ctypes.c_ulonglong
    space = torch.empty(sizes(n) // 4 + 1, dtype=torch.float32)
    launches = lib.call(f"{prefix}_fwd", p(x), p(w), p(b), p(y), n, None, profile=True)
    launches += lib.call(f"{prefix}_bwd_data", p(dy), p(w), p(dx), n, None, profile=True)
    launches += lib.call(f"{prefix}_bwd_weight_bias", p(dy), p(x), p(dw), p(db), p(space), n, None, profile=True)
    # (the data gradient's kernels are bwd_data<phase>)
    return {kernel: [launch for launch in launches if launch["kernel"].split("<")[0] == kernel] for kernel in KERNELS}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(CASES))
def test_the_depthwise_tiles_are_read_and_written_without_bank_conflicts(libs, name, dtype):
    """All channels-last: every launch ideal. The input alone channels-last: within 1.5 times ideal (the
    forward's lanes take 16 pixels of a 4-wide tile, whose rows lie a window row apart: two of those
    words share a bank in places, whatever the channels' stride) -- and the even stride's 1.67 to 4.7."""
    context = depthwise_context(_problem(name, dtype), TARGET, "p")
    assert context.ct == 32 and context.ct_pad == (32 if name.startswith("cl") else 33), context
    launches = _launches(libs[False], name, dtype)
    assert len(launches["bwd_data"]) == (4 if name == "cl_s2" else 1)   # a launch per stride phase
    for kernel in KERNELS:
        assert launches[kernel], kernel
        for launch in launches[kernel]:
            assert launch["shared_requests"] > 0, launch
            if name.startswith("cl"):
                assert launch["shared_wavefronts"] == launch["shared_ideal"], (name, dtype, kernel, launch)
            else:
                assert launch["shared_wavefronts"] <= 1.5 * launch["shared_ideal"], (name, dtype, kernel, launch)


def test_with_the_channels_an_even_number_of_words_apart_mixed_layouts_conflict(libs):
    """The input channels-last, the output not: lanes taking consecutive pixels of a channel read words
    32 apart without the odd stride, in every pass."""
    launches = _launches(libs[True], "x_cl", "f32")
    for kernel in KERNELS:
        assert launches[kernel] and all(launch["shared_wavefronts"] > 1.5 * launch["shared_ideal"]
                                        for launch in launches[kernel]), (kernel, launches[kernel])
