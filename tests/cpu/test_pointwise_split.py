"""The pointwise GEMM's work items split by the reads (templates/cpu/pointwise.cpp.j2's entry).

Each work item of the 1x1 forward and data gradient reads its block of the packed weights and its run
of pixels over the whole reduction. Where the weight is large and the pixels few (a late ResNet layer's
1x1: 2048 x 1024 weights, 49 pixels an image), shrinking the pixel runs to one strip so that there are
enough items had every item read the whole weight; the entry now also splits the channels into blocks
and takes the split reading least (codegen/cpu/pointwise.py `item_split` says the same in Python).
These problems take several channel blocks, the last one short; each runs forward and data gradient,
in both layouts and in f32 and bf16, against ATen in float64 (at 2 threads, the items handed out as
threads come free).
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

from convgen.codegen.cpu.pointwise import item_split
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target, host_cpu

from support.builds import load_keyed
from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient

# (name, conv_problem's arguments): a 1x1 of many channels over few pixels; strided (its forward packs
# every other pixel; its data gradient writes a quarter of the input's pixels, zeroing the rest); groups
CASES = [
    ("wide", dict(n=2, c=64, k=512, size=(14, 14), kernel=(1, 1), pad=0)),
    ("wide_s2", dict(n=2, c=96, k=520, size=(26, 27), kernel=(1, 1), stride=2, pad=0)),
    ("wide_groups", dict(n=1, c=64, k=1200, size=(14, 14), kernel=(1, 1), pad=0, groups=2)),
]
OPS = (Op.FWD, Op.BWD_DATA)
LAYOUTS = (Layout.CONTIGUOUS, Layout.CHANNELS_LAST)
DTYPES = (DType.F32, DType.BF16)
# the host's code, tiled as for a 2 MB L2 (the split depends on the L2's size): these cases split on every
# host class
TARGET = dataclasses.replace(host_cpu(), l2_bytes=2 << 20)


def _problem(kw, op, layout, dtype):
    """The case's forward, or the data gradient of the GEMM of as many rows (channels and filters swapped)."""
    if op is Op.BWD_DATA:
        kw = dict(kw, c=kw["k"], k=kw["c"])
    return conv_problem(**kw, op=op, layout=layout, dtype=dtype)


def _split(plan):
    """item_split of a plan: its GEMM's rows (output channels a group) and columns (pixels of the batch)."""
    g, p = plan.geometry, plan.problem
    fwd = p.op is Op.FWD
    rows = g.cout_g if fwd else g.cin_g
    strided = any(s != 1 for s in p.stride)
    shape = p.output_shape if fwd or strided else p.input_shape   # a strided data gradient's: grad_output's
    pixels = shape[0] * torch.Size(shape[2:]).numel()
    return rows, item_split(plan.tiling, rows, p.groups, pixels)


def _plans():
    for name, kw in CASES:
        for op in OPS:
            for layout in LAYOUTS:
                for dtype in DTYPES:
                    plan = lower(_problem(kw, op, layout, dtype), TARGET, algorithm="pointwise")
                    yield (name, op, layout, dtype), plan


@pytest.fixture(scope="module")
def kernels():
    return load_keyed(_plans())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: l.value)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_channel_blocks_match_aten(kernels, name, op, layout, dtype):
    plan, kernel = kernels[(name, op, layout, dtype)]
    rows, (mc, nc) = _split(plan)
    assert mc < rows and rows % mc, f"{name}: a split into channel blocks, the last one short ({mc} of {rows})"
    check_forward_or_data_gradient(kernel, plan.problem,
                                   torch.Generator().manual_seed(zlib.crc32(f"{name}{op}{layout}{dtype}".encode())))


def test_a_late_layers_weight_is_split_where_that_saves_a_third_of_the_reads():
    """ResNet-50's last shortcut (1x1 stride 2, 1024 -> 2048, 7x7 output, batch 8). With a 2 MB L2
    (the avx512+bf16+amx Xeon's) the fewest blocks are one of every channel, by 32-pixel strips: each of
    13 items read the whole 8 MB weight; items of 518 channels by 128 pixels read 38% as many values
    (kernel alone 8.5 -> 6.3 ms on that Xeon, BENCHMARKS.md). On the AVX2 code shape's tiles the best
    split saves only 12% of the fewest blocks' reads, so they stay (timed within noise of each other); so
    does a layer whose weight is a fraction of the L2 with many pixels."""
    late = conv_problem(8, 1024, 2048, (14, 14), (1, 1), stride=2, pad=0)
    plan = lower(late, dataclasses.replace(cpu_target("avx512"), l2_bytes=2 << 20), algorithm="pointwise")
    assert _split(plan) == (2048, (518, 128)), plan.tiling
    plan = lower(late, cpu_target("avx2"), algorithm="pointwise")
    assert _split(plan) == (2048, (plan.tiling.ksb, 80)), plan.tiling
    early = lower(conv_problem(8, 64, 256, (56, 56), (1, 1), pad=0), cpu_target("avx512"), algorithm="pointwise")
    rows, (mc, nc) = _split(early)
    assert mc >= rows and nc == early.tiling.cols, (mc, nc)
