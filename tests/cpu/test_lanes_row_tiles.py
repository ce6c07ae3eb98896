"""Lanes register tiles within rows (Tiling.row_split, templates/cpu/lanes_body.j2).

Where the planner splits each output row (stride-1 data gradient: each input-gradient row) into
tiles, a work item takes whole rows, and each kw tap steps only the tile's pixels that read inside
the input: the kernel is generated with the padding's pixels left out. Checked against ATen in
float64, forced onto lanes with given splits (even ones as the planner makes, and odd ones: tiles
of one pixel, one tile a row), on every x86 code shape this CPU runs, NCHW and channels last, forward
and data gradient: padding, padding
beyond the kernel's reach (pixels that read nothing but padding), dilation, uneven padding, stride
(forward), 3-D, 1-D, kernels of more than 32 taps (tap loops not unrolled), items of several rows
that run across images, bf16 and f64; each (bf16 aside) both reading the input (data gradient:
grad_output) in place, as the planner has it (no padding is read), and from its zero-padded copy.
And the planner's choice on ResNet-50 layers.
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

from convgen.codegen.emit import emit
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.cpu.lanes_rows import row_tile_taps
from convgen.codegen.cpu.work import asm_tile_registers
from convgen.codegen.target import cpu_target, host_cpu

from support.builds import kernels_by_key
from support.code_shapes import host_and_second
from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient

# name, problem, split of a row of width w (None: even tiles of at most the plan's kb), rows per work item
CASES = [
    ("pad1", dict(n=2, c=5, k=20, size=(6, 14), kernel=(3, 3), pad=1), None, 2),
    ("pad_beyond_reach", dict(n=2, c=5, k=20, size=(5, 6), kernel=(3, 3), pad=3), lambda w: (3, w - 5, 2), 1),
    ("dilated", dict(n=2, c=7, k=17, size=(9, 10), kernel=(3, 3), pad=2, dil=2), None, 3),
    ("uneven", dict(n=2, c=5, k=16, size=(7, 9), kernel=(3, 2), pad=((2, 0), (0, 3)), dil=(1, 2)), lambda w: (1, 5, w - 8, 2), 2),
    ("strided", dict(n=2, c=6, k=18, size=(9, 11), kernel=(3, 3), pad=1, stride=2), lambda w: (2, 2, w - 4), 2),
    ("3d", dict(n=2, c=6, k=18, size=(4, 5, 6), kernel=(3, 3, 3), pad=1), lambda w: (4, w - 4), 3),
    ("depth_pad_only", dict(n=2, c=6, k=18, size=(3, 4, 7), kernel=(3, 1, 1), pad=((1, 1), (0, 0), (0, 0))), None, 2),
    ("1d", dict(n=3, c=4, k=20, size=(37,), kernel=(5,), pad=2), lambda w: (6,) * (w // 6) + (w % 6,), 1),
    ("tiles_of_one", dict(n=2, c=5, k=16, size=(4, 7), kernel=(3, 3), pad=1), lambda w: (1, w - 2, 1), 1),
    ("one_tile_a_row", dict(n=3, c=5, k=16, size=(3, 5), kernel=(3, 3), pad=1), lambda w: (w,), 2),
    ("taps_49", dict(n=1, c=3, k=16, size=(8, 9), kernel=(7, 7), pad=3), None, 1),
    ("bf16", dict(n=2, c=6, k=20, size=(6, 8), kernel=(3, 3), pad=1, dtype=DType.BF16), None, 2),
    ("f64", dict(n=2, c=5, k=12, size=(6, 8), kernel=(3, 3), pad=1, dtype=DType.F64), None, 2),
]
LAYOUTS = [Layout.CONTIGUOUS, Layout.CHANNELS_LAST]


# the cases also run on the second x86 code shape where this CPU runs one (AVX2 on an AVX-512 host:
# 16-register tiles, which the planner does not split by rows, still generate right; kernels take
# seconds to build)
SECOND = ("pad1", "uneven", "tiles_of_one", "3d")


def _keys():
    # each case with the operand read (input; data gradient: grad_output) in place, as the planner has it
    # where tiles lie within rows (they read no padding), and from its zero-padded copy (bf16: the copy
    # widens it to f32, so always)
    return [(name, layout, op, which, in_place) for name, spec, _, _ in CASES
            for layout in LAYOUTS[:1 if len(spec["size"]) == 1 else 2]
            for op in (Op.FWD, Op.BWD_DATA) if op is Op.FWD or spec.get("stride", 1) == 1 for which, _ in host_and_second()
            if which == "host" or name in SECOND
            for in_place in ((False, True) if spec.get("dtype", DType.F32) is not DType.BF16 else (False,))]


def _row_plan(name, layout, op, which, in_place):
    _, spec, split, rows = next(case for case in CASES if case[0] == name)
    target = dict(host_and_second())[which]
    plan = lower(conv_problem(**spec, op=op, layout=layout), target, algorithm="lanes")
    g, t = plan.geometry, plan.tiling
    width = g.y_size[2] if op is Op.FWD else g.x_size[2]
    if split is None:
        tiles = -(-width // t.kb)
        split = tuple(width // tiles + (1 if i < width % tiles else 0) for i in range(tiles))
    else:   # the given tiles, any too large for the target's registers cut into the largest that fit
        widest = max(p for p in range(1, 15) if asm_tile_registers(t.nv, p) <= target.tile_registers)
        split = tuple(piece for size in split(width) for piece in [widest] * (size // widest) + [size % widest] if piece)
    assert sum(split) == width and min(split) > 0 and asm_tile_registers(t.nv, max(split)) <= target.tile_registers
    read = "X" if op is Op.FWD else "Y"
    tiling = dataclasses.replace(t, row_split=split, kb=max(split), cols=rows * width, copy_per_item=0,
                                 in_place=(read,) if in_place else ())
    return dataclasses.replace(plan, tiling=tiling)


@pytest.fixture(scope="module")
def kernels():
    return kernels_by_key(_keys(), _row_plan)


@pytest.mark.parametrize("key", _keys(), ids=lambda k: f"{k[0]}-{'nchw' if k[1] is Layout.CONTIGUOUS else 'cl'}-{k[2].value}-{k[3]}"
                                                      f"-{'in_place' if k[4] else 'copy'}")
def test_tiles_within_rows_match_aten(kernels, key):
    name, layout, op, _, in_place = key
    plan, kernel = kernels[key]
    text = emit(plan).text
    assert plan.algorithm == "lanes" and "switch (t % TPR)" in text
    assert ("IN_PLACE = true" in text) == in_place
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}{layout}{op}".encode()))
    check_forward_or_data_gradient(kernel, plan.problem, gen)


def test_pixels_that_read_padding_are_left_out():
    """Per tile and kw tap, the pixels that read inside: a 3 x 3 forward with padding 1 over a row of
    14 in tiles of 5, 5, 4 leaves out the row's first pixel at kw 0 and its last at kw 2; its data
    gradient (grad_output read at w + 1 - kw) the other way round."""
    plan = lower(conv_problem(1, 16, 16, (14, 14), (3, 3), layout=Layout.CHANNELS_LAST), host_cpu(), algorithm="lanes")
    assert row_tile_taps(plan.geometry, True, (5, 5, 4)) == (
        ((1, 2, 3, 4), (0, 1, 2, 3, 4), (0, 1, 2, 3, 4)), ((0, 1, 2, 3, 4),) * 3, ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2)))
    assert row_tile_taps(plan.geometry, False, (5, 5, 4)) == (
        ((0, 1, 2, 3, 4), (0, 1, 2, 3, 4), (1, 2, 3, 4)), ((0, 1, 2, 3, 4),) * 3, ((0, 1, 2), (0, 1, 2, 3), (0, 1, 2, 3)))


@pytest.mark.parametrize("op", [Op.FWD, Op.BWD_DATA], ids=["fwd", "bwd_data"])
def test_planner_splits_rows_where_padding_costs(op):
    """ResNet-50's 3 x 3 layer at 14 x 14 (9% of its products read padding) takes tiles within rows;
    at 112 x 112 (1%) only to leave out the copy of the whole operand; 1 x 1 layers have no padding
    to skip; nor does the 16-register AVX2 shape split rows."""
    target = cpu_target("avx512", 48 * 1024, 2 << 20)

    def plan(size, kernel, pad):
        return lower(conv_problem(8, 256, 256, size, kernel, pad=pad, op=op, layout=Layout.CHANNELS_LAST), target,
                     algorithm="lanes").tiling

    t = plan((14, 14), (3, 3), 1)
    assert t.row_split == (5, 5, 4) and t.kb == 5 and t.cols % 14 == 0
    assert t.in_place == ("X" if op is Op.FWD else "Y",)   # no padding read: no copy
    # 1% of the products read padding at 112 x 112: tiles within rows there only because tiles across
    # rows would read a zero-padded copy of the whole 103 MB operand (ROW_TILES_COPY_GAIN)
    t = plan((112, 112), (3, 3), 1)
    assert t.row_split and t.in_place == ("X" if op is Op.FWD else "Y",)
    assert plan((14, 14), (1, 1), 0).row_split == ()
    target = cpu_target("avx2", 32 * 1024, 512 * 1024)   # 16 registers: tiles of 3 pixels, kept across rows
    assert plan((14, 14), (3, 3), 1).row_split == ()


@pytest.mark.parametrize("op", [Op.FWD, Op.BWD_DATA], ids=["fwd", "bwd_data"])
def test_planner_splits_rows_where_they_save_a_whole_copy(op):
    """R(2+1)D's temporal 3x1x1 (padding across planes only): tiles within rows estimate the same as
    across rows (1.00, above ROW_TILES_GAIN), but across rows read a zero-padded copy of the whole
    25 MB channels-last operand made per call, which tiles within rows leave out (ROW_TILES_COPY_GAIN);
    in NCHW, in bf16 (copied to f32 anyway) and where the copy is made per work item (ResNet's 3x3 at
    112 x 112) tiles stay across rows."""
    target = cpu_target("avx512", 48 * 1024, 2 << 20)

    def plan(n, c, size, kernel, pad, layout=Layout.CHANNELS_LAST, dtype=DType.F32):
        return lower(conv_problem(n, c, c, size, kernel, pad=pad, op=op, layout=layout, dtype=dtype), target,
                     algorithm="lanes").tiling

    depth = dict(n=4, c=64, size=(8, 56, 56), kernel=(3, 1, 1), pad=((1, 1), (0, 0), (0, 0)))
    t = plan(**depth)
    assert t.row_split and sum(t.row_split) == 56 and t.in_place == ("X" if op is Op.FWD else "Y",)
    assert plan(**depth, layout=Layout.CONTIGUOUS).row_split == ()
    assert plan(**depth, dtype=DType.BF16).row_split == ()
    t = plan(8, 64, (112, 112), (3, 3), 1)
    assert t.row_split == () and t.copy_per_item
