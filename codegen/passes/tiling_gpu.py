"""GPU tiling (the `tiling` pass's branch for CUDA and HIP targets): threads per block and what
each thread computes, from the target's warp size and thread limit.

- direct: one thread per result element (an output, input-gradient or weight-gradient element,
  or one channel of a bias gradient); DIRECT_THREADS threads per block (whole warps: 8 warps of
  32, 4 waves of 64), the grid as many blocks as cover the results at the run-time batch size.
- igemm: 4 warps (waves) per block, each a quarter of the block's GEMM tile (64 or 128 a side),
  pipeline stages and 16-byte copies from codegen/gpu_tiles.py; the data gradient's stride phases
  and the weight gradient's split-K count (codegen/gpu_igemm.py) are named in the reason.
A function of problem and target only.
"""

from __future__ import annotations

import math

from ..errors import ConvgenError
from ..plan import GpuTiling, KOp, Plan

DIRECT_THREADS = 256


def _results(plan: Plan) -> tuple[str, int, str]:
    """(what one thread computes, results per image or in all, what it sums over) of the direct kernel."""
    g, p = plan.geometry, plan.problem
    taps = math.prod(g.kernel)
    if plan.kop is KOp.FWD:
        return "output element", g.cout * math.prod(g.y_size), f"{g.cin_g * taps} (channel, tap) products"
    if plan.kop is KOp.DGRAD:
        return ("input-gradient element", g.cin * math.prod(g.x_size),
                f"at most {g.cout_g * taps} (channel, tap) products")
    if plan.kop is KOp.WGRAD:
        return ("weight-gradient element", g.cout * g.cin_g * taps, f"batch x {math.prod(g.y_size)} output positions")
    channels = g.cout if plan.operands[0].kind == "Y" else g.cin
    return "bias-gradient channel", channels, "batch x its channel's pixels"


def run_gpu(plan: Plan) -> Plan:
    """The tiling of `plan` for a CUDA or HIP target, by its algorithm (TILINGS)."""
    if plan.algorithm == "empty":
        return plan.decide("tiling", "no kernel: nothing to launch", tiling=None)
    tile = TILINGS.get(plan.algorithm)
    if tile is None:
        raise ConvgenError(f"tiling: no GPU tiling for algorithm {plan.algorithm!r}; GPU tilings: {sorted(TILINGS)}")
    return tile(plan)


def _direct(plan: Plan) -> Plan:
    """direct: whole warps per block, one thread per result element, rolled loops, 32-bit in-image offsets
    where they fit."""
    from ..gpu_direct import index_type, min_blocks_reason
    from ..target import TargetKind

    gpu = plan.target.gpu
    threads = min(DIRECT_THREADS, gpu.max_threads_per_block) // gpu.warp_size * gpu.warp_size
    what, count, over = _results(plan)
    per_image = plan.kop in (KOp.FWD, KOp.DGRAD)
    bias = plan.kop is KOp.WGRAD and plan.problem.bias
    biases = (plan.geometry.cin if plan.problem.transposed else plan.geometry.cout) if bias else 0
    blocks = math.ceil((count * (plan.problem.n if per_image else 1) + biases) / threads)
    index, index_why = index_type(plan.problem, threads)
    occupancy = f"; {min_blocks_reason(threads)}" if plan.target.kind is TargetKind.CUDA else ""
    tiling = GpuTiling(threads_per_block=threads, warps_per_block=threads // gpu.warp_size, per_thread=what,
                       threads_hint=f"one thread per {what}, {count} {'per image' if per_image else 'in all'}")
    return plan.decide("tiling", f"{threads} threads per block ({threads // gpu.warp_size} warps of {gpu.warp_size}); "
                                 f"one thread per {what}, summing {over} in double in a fixed order (no atomics, "
                                 f"no shared memory); {blocks} block(s) at batch {plan.problem.n}"
                                 f"{' (the grid follows the run-time batch)' if per_image else ''}"
                                 + ("; the bias gradient fused into the same launch: past the weights, one thread per "
                                    "channel sums its batch x pixels in double" if bias else "")
                                 + f"; every loop rolled, one load pair and multiply-add a step (unrolled, the "
                                   f"compile-time trip counts held loads in flight past any register cap){occupancy}; "
                                   f"offsets and coordinates within an image as {index} ({index_why})",
                       tiling=tiling)


def _igemm(plan: Plan) -> Plan:
    """igemm: 4 warps (waves) per block, the GEMM tile, stages and copies of the GEMM this pass
    launches (codegen/gpu_tiles.py); the reasons name the pass's stride phases or split, and how
    the bias gradient rides along."""
    from ..gpu_igemm import bias_reason, on_fma, reasons, tiles_of
    from ..target import TargetKind

    gpu = plan.target.gpu
    unit = "warps" if gpu.warp_size == 32 else "waves"
    tiles = tiles_of(plan.problem, plan.target)
    *_, pipeline, phases, split = reasons(plan.problem, plan.target)
    transposed = plan.problem.transposed
    # a transposed forward runs the normal data gradient's GEMM, its data gradient the normal forward's
    gemm = {KOp.FWD: tiles.dgrad if transposed else tiles.fwd, KOp.DGRAD: tiles.fwd if transposed else tiles.dgrad,
            KOp.WGRAD: tiles.wgrad, KOp.BIAS: None}[plan.kop]
    forward_rows = (plan.kop is KOp.FWD) != transposed
    what = ("one channel's bias-gradient sum (strided threads, a shuffle tree, the warps' sums in order)" if gemm is None else
            f"{gemm.m} (image, output pixel) rows x {gemm.n} filters of one group" if forward_rows and plan.kop is not KOp.WGRAD
            else f"{gemm.m} (image, input position) rows of one stride phase x {gemm.n} channels of one group"
            if plan.kop is not KOp.WGRAD else
            f"{gemm.m} filters x {gemm.n} (channel, tap) columns of one group and one split")
    fma = on_fma(plan.problem, plan.target) and gemm is not None
    rows, columns = (gemm.m // 2 // (gpu.warp_size // 8), gemm.n // 2 // 8) if fma else (0, 0)
    held = (f"; each thread keeps {rows * columns} results in registers ({rows} rows x {columns} columns of its warp's "
            f"quarter), multiplied by fused multiply-adds" if fma else "")
    tile = ("" if gemm is None else f"tile {gemm.describe(plan.target.kind is TargetKind.CUDA)}; warp tile "
            f"{gemm.m // 2}x{gemm.n // 2}{held}; {pipeline}")
    extra = {KOp.DGRAD: phases if not transposed else None, KOp.FWD: phases if transposed else None,
             KOp.WGRAD: split}.get(plan.kop)
    bias = plan.kop is KOp.WGRAD and plan.problem.bias
    share = f"a block's {gemm.m}x{gemm.n} tile" if gemm else "the bias gradient"
    tiling = GpuTiling(threads_per_block=4 * gpu.warp_size, warps_per_block=4,
                       per_thread=(f"{rows}x{columns} results of {share}" if fma else
                                   f"a 1/{4 * gpu.warp_size} share of {share}"), threads_hint=f"a block per {what}")
    return plan.decide("tiling", f"{4 * gpu.warp_size} threads per block (4 {unit} of {gpu.warp_size}); a block per "
                                 f"{what}" + (f"; {tile}" if tile else "") + (f"; {extra}" if extra else "")
                                 + (f"; {bias_reason(plan.problem)}" if bias else ""),
                       tiling=tiling)


def _fixed_block(plan: Plan, what: str, context, bias_why: str) -> Plan:
    """depthwise, stem: their kernel's fixed block, its tiles and split in the context's own words
    (and how a weight gradient's fused bias gradient is computed)."""
    context = context(plan.problem, plan.target, "p")
    bias = plan.kop is KOp.WGRAD and plan.problem.bias
    gpu = plan.target.gpu
    unit = "warps" if gpu.warp_size == 32 else "waves"
    tiling = GpuTiling(threads_per_block=context.threads, warps_per_block=context.threads // gpu.warp_size,
                       per_thread=what, threads_hint=f"{context.threads} threads per block; {what}")
    return plan.decide("tiling", f"{context.threads} threads per block ({context.threads // gpu.warp_size} {unit} of "
                                 f"{gpu.warp_size}); " + "; ".join(context.why + ((bias_why,) if bias else ())),
                       tiling=tiling)


def _depthwise(plan: Plan) -> Plan:
    from ..gpu_depthwise import BIAS_WHY, depthwise_context

    return _fixed_block(plan, "a block per tile of channels x output pixels (or a stride phase's positions)",
                        depthwise_context, BIAS_WHY)


def _stem(plan: Plan) -> Plan:
    from ..gpu_stem import BIAS_WHY, stem_context

    return _fixed_block(plan, "(filter, channel, tap) sums kept in registers over staged pixel tiles", stem_context,
                        BIAS_WHY)


# GPU algorithm -> its tiling function (a new GPU algorithm adds its own)
TILINGS = {"direct": _direct, "igemm": _igemm, "depthwise": _depthwise, "stem": _stem}
