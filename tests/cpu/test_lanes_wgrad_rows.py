"""Row blocks of the lanes weight gradient (`wgrad_row_block` in codegen/cpu/lanes_wgrad.py).

A work item takes RB (input channel, tap) rows; items run in a static schedule, so blocks must be
as equal as whole channels and tiles allow (a short last block left one thread with twice the
other's work), of whole channels where a channel's taps fit, and no more than needed. On AVX-512
the blocks grow to WGRAD_ROWS_EVEX rows where the parts of the reduction that fewer items need
keep their partial sums within PARTS_L2_SHARE of the L2.
"""

from __future__ import annotations

import functools
import itertools
import math

import pytest

from convgen.codegen.ir import Layout, Op
from convgen.codegen.cpu import lanes_wgrad, work
from convgen.codegen.cpu.lanes_wgrad import wgrad_row_block
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target

from support.problems import conv_problem


def _blocks(rows: int, rb: int) -> list[int]:
    return [min(rb, rows - r0) for r0 in range(0, rows, rb)]


@pytest.mark.parametrize("most", [144, 576])
def test_blocks_equal_whole_and_few(most):
    for channels, taps, pb in itertools.product([1, 3, 5, 16, 17, 64, 128, 512], [1, 3, 9, 16, 27, 49, 147, 200],
                                                [1, 3, 6, 14]):
        rows = channels * taps
        rb = wgrad_row_block(rows, taps, pb, most)
        where = f"{channels} channels x {taps} taps, PB {pb}, at most {most}: RB {rb}"
        assert rb % pb == 0, f"{where}: not whole tiles"
        blocks = _blocks(rows, rb)
        unit = taps if taps <= most else pb
        # no more blocks than rows of at most `most` (in whole units) need, each within a tile of
        # an equal share
        least = math.ceil(math.ceil(rows / unit) / max(1, most // unit))
        assert len(blocks) <= least, f"{where}: {len(blocks)} blocks, {least} would do"
        assert rb <= math.ceil(max(most // unit, 1) * unit / pb) * pb, f"{where}: blocks too large"
        # and the last at least 3/4 of the others, or within a tile per block of an equal share
        assert 4 * blocks[-1] >= 3 * rb or blocks[-1] >= rows / len(blocks) - len(blocks) * pb, \
            f"{where}: blocks {blocks} unequal"


def test_r50_stem_rows_not_102_and_45():
    blocks = _blocks(147, wgrad_row_block(147, 49, 6, 144))
    assert blocks == [78, 69], "three channels of 49 taps in two blocks: equal shares of the rows"
    assert _blocks(384, wgrad_row_block(384, 3, 6, 144)) == [132, 132, 120], "wavenet_1d: three equal blocks"
    assert _blocks(2048, wgrad_row_block(2048, 16, 6, 144)) == [138] * 14 + [116], \
        "128 channels of 16 taps: not 14 blocks of 9 channels and one of 2"
    assert wgrad_row_block(147, 49, 6, 576) >= 147, "one block on AVX-512"


_problem = functools.partial(conv_problem, 8, op=Op.BWD_WEIGHT)   # weight gradients (and the bias's) of 8 images


def test_larger_blocks_only_where_the_parts_stay_in_the_l2():
    target = cpu_target("avx512", 48 * 1024, 2 << 20)
    plan = lambda p: lower(p, target, algorithm="lanes").tiling
    stem = plan(_problem(3, 64, (224, 224), (7, 7), stride=2, pad=3))
    assert stem.rb >= 147, "r50_stem: all 147 rows in one block"
    big = plan(_problem(256, 256, (14, 14), (3, 3), layout=Layout.CHANNELS_LAST))
    rows = 256 * 9
    parts = work.reduction_splits(math.ceil(256 / (big.nv * big.vector_lanes)) * math.ceil(
        rows / wgrad_row_block(rows, 9, big.kb, lanes_wgrad.WGRAD_ROWS_EVEX)), 256 * rows * 4)
    assert parts * 256 * rows * 4 > lanes_wgrad.PARTS_L2_SHARE * target.l2_bytes, "the case's premise"
    assert big.rb == wgrad_row_block(rows, 9, big.kb, lanes_wgrad.WGRAD_ROWS), \
        "r50_3x3_256: its partial sums would outgrow the L2, so it keeps the smaller blocks"
    avx2 = lower(_problem(3, 64, (224, 224), (7, 7), stride=2, pad=3), cpu_target("avx2", 48 * 1024, 2 << 20),
                 algorithm="lanes").tiling
    assert avx2.rb == wgrad_row_block(147, 49, avx2.kb, lanes_wgrad.WGRAD_ROWS), "AVX2 keeps WGRAD_ROWS"


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("layout", [Layout.CONTIGUOUS, Layout.CHANNELS_LAST], ids=["nchw", "channels_last"])
def test_larger_blocks_keep_their_parts_in_the_l2(isa, layout):
    """Wherever a plan took blocks larger than WGRAD_ROWS allows, its parts' partial sums fit the
    share of the L2, counted with the items the plan really has (per-item planes take every block of
    output channels in one item: fewer items, more parts)."""
    target = cpu_target(isa, 48 * 1024, 2 << 20, bf16_dot=True)   # AVX2 with AVX512-VL: 32 registers too
    assert target.evex_tiles
    for c, k, size, kernel, stride in [(128, 128, (56, 56), (3, 3), 2), (128, 128, (28, 28), (3, 3), 1),
                                       (64, 64, (8, 28, 28), (3, 3, 3), 1), (3, 64, (224, 224), (7, 7), 2),
                                       (64, 64, (56, 56), (3, 3), 1), (256, 256, (14, 14), (3, 3), 1)]:
        problem = _problem(c, k, size, kernel, stride=stride, layout=layout)
        tiling = lower(problem, target, algorithm="lanes").tiling
        taps, rows = math.prod(kernel), c * math.prod(kernel)
        if tiling.rb == wgrad_row_block(rows, taps, tiling.kb, lanes_wgrad.WGRAD_ROWS):
            continue
        partial = k * rows * 4
        assert tiling.splits * partial <= lanes_wgrad.PARTS_L2_SHARE * target.l2_bytes, \
            f"{c}->{k} {size} {kernel}: {tiling.rb} rows in {tiling.splits} parts of {partial} bytes"


def test_parts_of_the_reduction_keep_a_chunk_of_one_image():
    """`_splits`: the reduction is cut into more parts only while the items are too few for the
    threads and, past four items, every part keeps a whole chunk of one image's pixels."""
    assert work.reduction_splits(1, 1 << 10) == work.MAX_SPLITS
    assert work.reduction_splits(1, 1 << 10, chunks=100) == work.MAX_SPLITS
    assert work.reduction_splits(1, 1 << 10, chunks=3) == 4, "four items at least, whatever the image"
    assert work.reduction_splits(1, 1 << 10, chunks=0) == 4
    assert work.reduction_splits(2, 1 << 10, chunks=4) == 4
    assert work.reduction_splits(16, 1 << 10, chunks=1) == 1
    for items, chunks in itertools.product([1, 2, 3, 5, 8, 16], [0, 1, 2, 3, 4, 7, 8, 9, 64]):
        splits = work.reduction_splits(items, 1 << 10, chunks)
        assert splits == 1 or items * splits // 2 < 4 or splits <= chunks, (items, chunks, splits)
        assert items * splits >= min(4, items * work.MAX_SPLITS), (items, chunks, splits)
    # a small image takes few parts (odd_asym: 741 pixels an image, chunks of 192)
    problem = conv_problem(3, 17, 31, (37, 41), (5, 3), stride=(2, 1), pad=(2, 1), dil=(1, 2), op=Op.BWD_WEIGHT)
    plan = lower(problem, cpu_target("avx512"), algorithm="lanes")
    assert plan.tiling.splits == 4, plan.tiling


def test_row_tile_computes_few_rows_in_vain():
    # lanes_tile's tile of one vector takes 14 rows; a 1x1 weight gradient from an RGB image has 3
    row_tile = lanes_wgrad._row_tile
    assert row_tile(1, 14, 3, asm=True) == 3
    assert row_tile(1, 14, 16, asm=True) == 8            # two tiles of 8, not of 14 (12 rows in vain)
    for nv, pb, rows in itertools.product([1, 2, 3, 4], [3, 6, 9, 14], [1, 2, 3, 5, 16, 27, 64, 147, 576]):
        b = row_tile(nv, pb, rows, asm=True)
        assert 1 <= b <= pb
        assert math.ceil(rows / b) * b <= math.ceil(rows / pb) * pb, (nv, pb, rows, b)   # never more rows in vain
        if rows % pb == 0:
            assert b == pb, "no row in vain: lanes_tile's tile stays"
    plan = lower(conv_problem(n=4, c=3, k=16, size=(16, 16), kernel=1, pad=0, op=Op.BWD_WEIGHT,
                              layout=Layout.CHANNELS_LAST), cpu_target("avx512"), algorithm="lanes")
    assert plan.tiling.kb == 3 and plan.tiling.rb == 3, plan.tiling
