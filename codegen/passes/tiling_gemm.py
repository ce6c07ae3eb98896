"""CPU tiling of the GEMM-shaped kernels (pointwise and the gemm weight gradient): a GEMM's
register tile of MR channels x two vectors of pixels (or of columns), panels packed for the L1 and
blocks for the L2. Part of the `tiling` pass's CPU branch (tiling_cpu.py); a function of problem
and target only.
"""

from __future__ import annotations

import math

from ..ir import DType
from ..plan import KOp, Plan, Tiling
from .tiling_cpu import (ASM_FMA_PER_LOAD, DOTS_MAX_CHUNK, MAX_SPLITS, MIN_ITEMS, PARTIAL_BYTES, POINTWISE_MAX_COLS,
                         POINTWISE_VECTORS, _splits, _windows_inside)


def _pointwise_tile(t, lanes: int, acc_bytes: int) -> tuple[int, int, int]:
    """(MR, NVP, KC) of the pointwise GEMMs: MR rows x NVP vectors of columns in registers (with
    the B panel's vectors and one broadcast), and chunks of KC reduced values whose B panel
    (KC x NVP vectors) takes half the L1 while the A panels stream from the L2."""
    nvp = POINTWISE_VECTORS
    mr = max(1, min(16, (t.vector_registers - nvp - 1) // nvp))
    return mr, nvp, max(1, (t.l1_bytes // 2) // (nvp * lanes * acc_bytes))


def _row_blocks(rows: int, mr: int, kc: int, t, acc_bytes: int) -> int:
    """Rows (a multiple of MR) per work item: an item's A block (rows x KC) takes at most half the
    L2, in blocks of equal size."""
    panels = math.ceil(rows / mr)
    blocks = math.ceil(panels / max(1, (t.l2_bytes // 2) // (kc * acc_bytes * mr)))
    return math.ceil(panels / blocks) * mr


def _pointwise_cols(nr: int, kc: int, t, acc_bytes: int) -> int:
    """Columns (a multiple of NR) per work item: the item's B block (KC x columns) within a quarter
    of the L2, and at most POINTWISE_MAX_COLS."""
    return max(nr, min(POINTWISE_MAX_COLS, (t.l2_bytes // 4) // (kc * acc_bytes)) // nr * nr)


def _pointwise(plan: Plan, lanes: int) -> Plan:
    """1x1 forward or data gradient as a packed GEMM: out channels x pixels, reduced over channels."""
    g, t, p = plan.geometry, plan.target, plan.problem
    acc_bytes = p.dtype.accumulator.itemsize
    fwd = plan.kop is KOp.FWD
    out_ch, reduced = (g.cout_g, g.cin_g * math.prod(g.kernel)) if fwd else (g.cin_g, g.cout_g)
    mr, nvp, kc = _pointwise_tile(t, lanes, acc_bytes)
    if fwd and g.stride != (1, 1, 1):
        # a strided forward packs each strip from every SW-th input value: half the chunk (1x1 stride
        # 2 on Zen 3, ms, 128 against 256 channels per chunk: 256->512 at 56x56 13.7 against 22.9,
        # 256->1024 at 28x28 7.4 against 11.9, 512->1024 at 28x28 13.6 against 12.6)
        kc = max(1, kc // 2)
    kc = min(reduced, kc)
    mc = _row_blocks(out_ch, mr, kc, t, acc_bytes)
    nc = _pointwise_cols(nvp * lanes, kc, t, acc_bytes)
    tiling = Tiling(vector_lanes=lanes, kb=mr, nv=nvp, ksb=mc, cols=nc, rb=kc, min_items=MIN_ITEMS,
                    threads_hint=f"parallel over (group, run of pixels, block of {'output' if fwd else 'input'} "
                                 f"channels), handed out as threads come free; runs shrink from {nc} pixels when "
                                 f"the batch gives fewer than {MIN_ITEMS} items")
    return plan.decide("tiling", f"register tile {mr} channels x {nvp} vectors of {lanes} pixels ({mr * nvp} of "
                                 f"{t.vector_registers} registers accumulate); weights packed once per call in "
                                 f"panels of {mr} channels; per item {mc} channels x up to {nc} pixels, whose "
                                 f"values are packed in chunks of {kc} reduced channels (half the L1); "
                                 f"{tiling.threads_hint}", tiling=tiling)


def _gemm_wgrad(plan: Plan, lanes: int) -> Plan:
    """Weight gradient as a packed GEMM: out channels x columns (input channels; for kernels larger
    than 1x1, im2col rows: input channel x tap), reduced over pixels."""
    g, t, p = plan.geometry, plan.target, plan.problem
    acc_bytes = p.dtype.accumulator.itemsize
    taps = g.kernel[0] * g.kernel[1] * g.kernel[2]
    columns = g.cin_g * taps
    mr, nvp, kc = _pointwise_tile(t, lanes, acc_bytes)
    mc = _row_blocks(g.cout_g, mr, kc, t, acc_bytes)
    nr = nvp * lanes
    # column blocks of equal size, each within _pointwise_cols
    strips = math.ceil(columns / nr)
    blocks = math.ceil(strips / (_pointwise_cols(nr, kc, t, acc_bytes) // nr))
    nc = math.ceil(strips / blocks) * nr
    items = g.groups * math.ceil(g.cout_g / mc) * math.ceil(columns / nc)
    partial_bytes = g.groups * g.cout_g * columns * acc_bytes
    splits = _splits(items, partial_bytes)
    im2col = taps > 1
    in_place = ("X",) if im2col and _windows_inside(g) and p.dtype.accumulator is p.dtype else ()
    pairs = p.dtype is DType.BF16 and t.bf16_dot
    tiling = Tiling(vector_lanes=lanes, kb=mr, nv=nvp, ksb=mc, cols=nc, rb=kc, splits=splits, in_place=in_place,
                    pairs=pairs,
                    threads_hint="parallel over (group, out-channel block, column block, part of the "
                                 "reduction); each item owns its sums and reduces in a fixed order, so results do "
                                 "not depend on the thread count")
    what = "im2col rows (input channel, tap)" if im2col else "input channels"
    source = (f"; input {'read in place' if in_place else 'copied once, zero-padded'}" if im2col else "")
    return plan.decide("tiling", f"register tile {mr} output channels x {nvp} vectors of {lanes} {what}; "
                                 f"grad_output packed once per call in panels of {mr} channels; per item {mc} x "
                                 f"{nc} columns, {items} items x {splits} parts of the reduction, input values "
                                 f"packed in chunks of {kc} {'pairs of pixels' if pairs else 'pixels'} (half the L1)"
                                 f"{source}; "
                                 + ("bf16 reduced in pairs of consecutive pixels on vdpbf16ps (both operands packed "
                                    "two values to a 32-bit word); " if pairs else "") + tiling.threads_hint,
                       tiling=tiling)


def dots_tile(rows: int, cols: int, registers: int) -> tuple[int, int, float]:
    """(KR, CR, score) of a tile of dot products: KR grad_output rows x CR input rows accumulate
    in KR * CR registers, the smaller set is held and the other streamed through one more (see
    fma_tile's dots). The score is the fraction of FMAs on real rows (rows are padded to the tile)
    times the FMA-to-load ratio up to ASM_FMA_PER_LOAD; ties go to the larger tile."""
    best = (1, 1, -1.0)
    for kr in range(1, registers):
        for cr in range(1, registers):
            if kr * cr + min(kr, cr) + 1 > registers:
                continue
            useful = rows / (math.ceil(rows / kr) * kr) * cols / (math.ceil(cols / cr) * cr)
            score = useful * min(1.0, kr * cr / (kr + cr) / ASM_FMA_PER_LOAD)
            if (score, kr * cr) > (best[2], best[0] * best[1]):
                best = (kr, cr, score)
    return best


def _equal_blocks(total: int, most: int, multiple: int) -> int:
    """Rows per block (a multiple of `multiple`, at most about `most`) cutting `total` rows into
    blocks of equal size."""
    most = max(multiple, most // multiple * multiple)
    blocks = math.ceil(total / most)
    return math.ceil(math.ceil(total / blocks) / multiple) * multiple


def _pointwise_wgrad(plan: Plan, lanes: int) -> Plan:
    """1x1 weight gradient as dot products over pixels: a KR x CR tile of grad_output rows x input
    rows, per work item KC x CC rows whose vector totals take a quarter of the L2, chunks of PC
    pixels whose rows take another quarter."""
    g, t, p = plan.geometry, plan.target, plan.problem
    acc_bytes = p.dtype.accumulator.itemsize
    rows, cols = g.cout_g, g.cin_g
    kr, cr, score = dots_tile(rows, cols, t.vector_registers)
    pairs = max(kr * cr, (t.l2_bytes // 4) // (lanes * acc_bytes))    # (k, c) totals per item, at most
    # Each item reads its rows of both operands over all pixels: the block shape that reads the
    # least, rows x (column blocks) + columns x (row blocks), among the shapes within `pairs`.
    best = None
    for cblocks in range(1, math.ceil(cols / cr) + 1):
        cc = math.ceil(math.ceil(cols / cblocks) / cr) * cr
        if cc * kr > pairs:
            continue
        kc = _equal_blocks(rows, pairs // cc, kr)
        cost = rows * math.ceil(cols / cc) + cols * math.ceil(rows / kc)
        if best is None or cost < best[0]:
            best = (cost, kc, cc)
    _, kc, cc = best or (0, kr, cr)
    # bf16 on vdpbf16ps: each lane takes a pair of pixels per step, the chunks copied as they are
    # (two bf16 to a 32-bit word), so a chunk is a whole number of word vectors
    bf16_pairs = p.dtype is DType.BF16 and t.bf16_dot
    step = 2 * lanes if bf16_pairs else lanes
    pc = max(step, min(DOTS_MAX_CHUNK, (t.l2_bytes // 4) // ((kc + cc) * acc_bytes)) // step * step)
    items = g.groups * math.ceil(rows / kc) * math.ceil(cols / cc)
    splits = _splits(items, g.groups * rows * cols * acc_bytes)
    tiling = Tiling(vector_lanes=lanes, kb=kr, nv=cr, ksb=kc, cols=cc, pc=pc, splits=splits, pairs=bf16_pairs,
                    threads_hint="parallel over (group, out-channel block, in-channel block, part of the "
                                 "reduction); each item owns its sums and reduces in a fixed order, so results do "
                                 "not depend on the thread count")
    return plan.decide("tiling", f"register tile {kr} grad_output rows x {cr} input rows of {lanes} pixels "
                                 f"({score:.2f} useful); per item {kc} x {cc} rows, {items} items x {splits} parts "
                                 f"of the reduction, both operands copied in chunks of {pc} pixels (a quarter of "
                                 f"the L2); "
                                 + ("bf16 copied as it is and multiplied in pairs of pixels on vdpbf16ps (two "
                                    "products per f32 lane and step, f32 sums); " if bf16_pairs else "")
                                 + tiling.threads_hint, tiling=tiling)
