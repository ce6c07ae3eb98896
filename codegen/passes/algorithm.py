"""Pass `algorithm`: which algorithm computes the kernel op (like ATen's backend choice).

GPU targets take their own branch (gpu_algorithms.py); what follows here is the CPU's.

Candidates are listed for every problem so the runtime can tune among them; the heuristic
choice is recorded with its reason.
"""

from __future__ import annotations

import math

from ..ir import DType, Layout, Op
from ..errors import ConvgenError
from ..pipeline import Pass
from ..plan import KOp, Plan
from ..target import TargetKind
from . import tiling
from .gpu_algorithms import run_gpu


def _empty_reason(plan: Plan) -> str | None:
    """Why the result is all zeros (or a bias broadcast) with no kernel at all, or None."""
    p, g = plan.problem, plan.geometry
    if p.n == 0:
        return "batch is 0: outputs are empty and weight/bias gradients are zero"
    if plan.kop is KOp.BIAS:
        # the sum runs over grad_output, which ATen gives zero channels when the input has none
        return None if math.prod(p.output_shape) else "grad_output is empty: the bias gradient is zero"
    if g.cin_g == 0 or g.cout_g == 0:
        # ATen: a normal convolution of an input without channels has an output without channels
        # (so its bias gradient is zero), and a transposed one needs input channels; either way
        # every product is empty.
        return "zero channels per group: every result is empty or zero (plus the bias in a forward pass)"
    return None


def run(plan: Plan) -> Plan:
    p = plan.problem
    why_empty = _empty_reason(plan)
    if why_empty:
        return plan.decide("algorithm", why_empty, algorithm="empty", candidates=("empty",))
    if plan.target.kind is not TargetKind.CPU:
        return run_gpu(plan)
    if plan.kop is KOp.BIAS:
        return plan.decide("algorithm", "per-channel reduction", algorithm="reduce", candidates=("reduce",))
    g = plan.geometry
    if g.cin_g == 1 and g.groups > 1:
        kind = f"depthwise (1 input channel per group, multiplier {g.cout_g})"
    elif g.kernel == (1, 1, 1) and g.stride == (1, 1, 1) and g.pad_lo == (0, 0, 0):
        kind = "pointwise (1x1, a GEMM over channels)"
    else:
        kind = "general"
    candidates = CANDIDATES[plan.kop]
    if plan.kop is KOp.WGRAD and g.cin_g == 1:
        # first (the default) where it is depthwise; one input channel without groups (a raw-audio
        # front end, c1d_small_c: 1 -> 16, k80 s4) ran 14.3 ms on it against lanes' 3.6 (AVX2
        # shape; AVX-512 8.6 / 2.8; Xeon, 2 threads, kernel alone)
        candidates = ("depthwise",) + candidates if g.groups > 1 else candidates + ("depthwise",)
    if _planes_fit(plan):
        candidates = candidates + ("depthwise",)
    if _planes_wgrad_fits(plan):
        candidates = candidates + ("planes",)
    if _pointwise_fits(plan):
        candidates = candidates + ("pointwise",)
    if _grouplanes_fits(plan):
        candidates = ("grouplanes",) + candidates
    choice, why = candidates[0], WHY[candidates[0]]
    if plan.kop in (KOp.FWD, KOp.DGRAD) and plan.requested_algorithm is None:
        choice, why = _lanes_or_blocked(plan)
    if "pointwise" in candidates and plan.requested_algorithm is None and plan.kop is not KOp.WGRAD:
        choice, why = _pointwise_over(plan, choice, why)
    if plan.kop is KOp.WGRAD and plan.requested_algorithm is None and choice == "lanes":
        choice, why = _gemm_over(plan, choice, why)
    if "pointwise" in candidates and plan.requested_algorithm is None and plan.kop is KOp.WGRAD:
        choice, why = _dots_over(plan, choice, why)
    if "planes" in candidates and plan.requested_algorithm is None:
        choice, why = _planes_over(plan, choice, why)
    if "depthwise" in candidates and plan.kop is not KOp.WGRAD and plan.requested_algorithm is None:
        choice, why = "depthwise", PLANES_WHY
    if "grouplanes" in candidates and plan.requested_algorithm is None:
        choice, why = "grouplanes", WHY["grouplanes"]
    if _amx_fits(plan):
        candidates = candidates + ("amx",)
        if plan.requested_algorithm is None and g.cin_g >= AMX_MIN_CHANNELS and g.cout_g >= AMX_MIN_CHANNELS:
            choice, why = "amx", WHY["amx"]
    if plan.requested_algorithm is not None:
        if plan.requested_algorithm not in candidates:
            raise ConvgenError(f"algorithm {plan.requested_algorithm!r} is not a candidate for a {plan.kop.value} "
                               f"kernel; candidates: {list(candidates)}")
        choice, why = plan.requested_algorithm, "requested"
    return plan.decide("algorithm", f"{kind}: {choice} ({why}); candidates {list(candidates)}; every size a "
                                    f"compile-time constant except the batch",
                       algorithm=choice, candidates=candidates)


# The depthwise planes kernel is the default where it fits (and grouplanes does not). On Zen 3
# (NCHW f32, 2 threads, batch 8, ms, planes against blocked; forward, the data gradient alike):
# 3x3 at 7x7 (960 channels) 0.18 vs 0.73, 14x14 (384) 0.28 vs 0.57, 56x56 (144) 2.3 vs 2.8,
# 112x112 (32) 1.8 vs 2.5; 5x5 at 7x7 (1152) 0.59 vs 1.49, 14x14 (672) 1.41 vs 1.67, 28x28 (240)
# 1.28 vs 1.39; 1-D k31 at 4096 2.2 vs 2.1.
PLANES_WHY = ("one (image, channel) plane per item, copied into a zero-padded buffer whose rows share one pitch: "
              "each tap one flat run of vectors, no per-row work")


def _planes_fit(plan: Plan) -> bool:
    """Whether the depthwise planes kernel computes this forward or data gradient: one channel per
    group on both sides, unit strides, at most two spatial axes."""
    g = plan.geometry
    return (plan.kop in (KOp.FWD, KOp.DGRAD) and g.groups > 1 and g.cin_g == 1 and g.cout_g == 1 and
            g.stride == (1, 1, 1) and g.kernel[0] == 1 and g.x_size[0] == 1 and g.y_size[0] == 1)


def _planes_wgrad_fits(plan: Plan) -> bool:
    """The planes weight gradient: groups of more than one input channel (one is the depthwise
    kernel's, which takes the same planes at unit strides where they pay)."""
    g = plan.geometry
    return plan.kop is KOp.WGRAD and g.groups > 1 and g.cin_g > 1


# The planes weight gradient against lanes, whose vectors hold a group's output channels (a vector
# narrower than the target's where there are fewer: 4 lanes for 4 channels). Zen 4, 2 threads, NCHW,
# batch 8, kernel alone, ms, lanes / planes (gemm 3-5x slower than lanes on all of these). f32: 32
# groups at 56x56 of 2 channels 4.50 / 0.82, of 4 (rnx_grouped) 5.99 / 2.06; 4 channels at 112x112
# 12.3 / 4.3, at 224x224 (batch 4) 12.0 / 4.0, at 14x14 0.47 / 0.16, at 10x10 0.195 / 0.107, at
# 7x7 0.145 / 0.098; 8 channels at 28x28 2.50 / 1.79, at 14x14 0.83 / 0.56, but at 7x7 0.18 /
# 0.33; 12 at 28x28 6.06 / 4.16; 2 in, 8 out at 28x28 1.10 / 0.49; 4 channels 5x5 at 28x28 1.98 /
# 0.84; 1-D, 8 channels at 4096 1.54 / 1.24; 2 groups of 64 in, 4 out at 56x56 3.49 / 1.51. A full
# vector of output channels goes to lanes: 16 at 14x14 1.94 / 2.44, 32 at 7x7 1.53 / 5.02 (though
# 16 at 28x28 8.12 / 7.41 and at 56x56 16.3 / 14.5). bf16 alike (lanes in pairs): 4 channels at
# 56x56 4.50 / 1.88, 8 at 28x28 2.19 / 1.67, 16 at 14x14 1.25 / 2.14. In the AVX2 code shape (8
# lanes): 4 channels at 56x56 6.40 / 3.09, at 14x14 0.34 / 0.19, but 8 at 28x28 2.63 / 2.66 and
# 1-D 1.41 / 1.39. Strided (the input copied in its stride phases): f32 stride 2, 4 channels 112x112 ->
# 56x56 10.1 / 5.2, 8 channels 56 -> 28 (ResNeXt's downsampling 3x3) 4.37 / 3.25, 4 channels 28 -> 14
# 0.39 / 0.27, 4x4 kernel 64 -> 32 1.24 / 0.95; but 16 channels 28 -> 14 2.54 / 4.31; bf16 alike (8
# channels 56 -> 28 3.31 / 2.70, 16 channels 1.60 / 3.89); AVX2 shape, 4 channels 112 -> 56 10.1 / 5.7.
# Images of fewer than PLANES_WGRAD_MIN_PIXELS output pixels stay with lanes (the
# per-image copies and sums are not amortized), as do buffers of more than PLANES_WGRAD_MAX_L2S L2s.
PLANES_WGRAD_MIN_PIXELS = 64
PLANES_WGRAD_MAX_L2S = 4


def _planes_over(plan: Plan, choice: str, why: str) -> tuple[str, str]:
    """planes for a weight gradient of few output channels per group, where it measured faster than `choice`."""
    g, t = plan.geometry, plan.target
    acc = plan.problem.dtype.accumulator.itemsize
    lanes = t.vector_bytes // acc
    pixels = g.y_size[0] * g.y_size[1] * g.y_size[2]
    if any(op.layout is not Layout.CONTIGUOUS for op in plan.operands if op.kind in ("X", "Y")):
        return choice, why
    if g.cout_g >= lanes or pixels < PLANES_WGRAD_MIN_PIXELS:
        return choice, why
    kr, _ = tiling.planes_wgrad_tile(g.cout_g, g.cin_g * g.kernel[0] * g.kernel[1] * g.kernel[2],
                                     t.vector_registers)
    if tiling.planes_wgrad_bytes(g, kr, lanes, acc) > PLANES_WGRAD_MAX_L2S * t.l2_bytes:
        return choice, why
    return "planes", (f"{g.cout_g} output channels per group fill less than a vector of {lanes} (lanes' tile), "
                      f"while over planes the pixels fill every lane")


def _grouplanes_fits(plan: Plan) -> bool:
    """Whether the grouplanes kernels compute this kernel op: one channel per group on both sides
    (depthwise, multiplier 1) with channels the contiguous axis of input and output, so that one
    vector load takes a run of groups. Where they fit they are the default: on Zen 3 (ms, kernels
    alone, grouplanes against the best other candidate) mbv2_dw (144 channels at 56x56) forward
    2.0-2.6 against blocked's 6.5, data gradient 2.5-3.3 against blocked's 6.7, weight and bias
    gradients 2.9-3.3 against depthwise's 13.5; mbv2_dw_s2 (96 at 112x112, stride 2) 3.4-4.9
    against 13.0, 3.5-4.3 against 15.8 and 3.3-3.7 against 45.
    Small groups (M = 2, 4 or 8 channels on both sides, whole groups per vector) take them for the
    forward and data gradient: each input vector's channel m of every group is spread across the
    group's lanes (a shuffle) against per-lane weights. On Zen 4 (f32, channels last, batch 8,
    2 threads, kernel alone, ms, grouplanes / blocked, one run each): rnx_grouped (32 groups of 4 at
    56x56) forward 4.09 / 8.33 (lanes 13.1), data gradient 13.8 / 20.0 (bf16 11.2 / 17.2), at
    stride 2 5.8 / 8.5; 64 groups of 2, forward 6.8 / 17.2; 32 groups of 8 at 28x28, forward 9.4 /
    11.0, data gradient 8.0 / 8.6. Their weight gradient spreads each group's grad_output channels
    across its lanes instead (once per pixel, for every tap): grouplanes / lanes, same conditions,
    rnx_grouped 2.46 / 11.73 and 3.09 / 14.54 (bf16 3.47 / 8.88), rnx_g32_256 (32 groups of 8 at
    28x28) 3.53 / 4.31 and 3.97 / 4.35, regnet_g8 (8 groups of 8 at 56x56) 2.12 / 3.87 and
    2.57 / 5.01 (bf16 2.69 / 2.58)."""
    g = plan.geometry
    lanes = plan.target.vector_bytes // plan.problem.dtype.accumulator.itemsize
    small = g.cin_g == g.cout_g and g.cin_g > 1 and lanes % g.cin_g == 0
    return (g.groups > 1 and (g.cin_g == 1 and g.cout_g == 1 or small) and
            all(op.layout is Layout.CHANNELS_LAST for op in plan.operands if op.kind in ("X", "Y")))


def _pointwise_fits(plan: Plan) -> bool:
    """Whether the pointwise kernels compute this kernel op: a 1x1 kernel, with any strides and
    padding, or for the forward non-overlapping patches (kernel = stride, no dilation or padding:
    ViT's and ConvNeXt's patch embeddings and downsampling), whose reduced values are (input
    channel, tap) pairs. The forward and data gradient are a packed GEMM reduced over channels (a
    strided data gradient's columns are the grad_output pixels, each written where it reaches, the
    rest zeroed), the weight gradient dot products over pixels."""
    g = plan.geometry
    return g.kernel == (1, 1, 1) or (plan.kop is KOp.FWD and _patches(g))


def _patches(g) -> bool:
    """Whether the windows tile the input without overlap: kernel = stride, no dilation or padding."""
    return g.kernel == g.stride and g.dilation == (1, 1, 1) and g.pad_lo == (0, 0, 0)


# The pointwise GEMM packs what it reduces over once per item and chunk, which pays off unless the
# reduction is very short. Measured on Zen 3 (batch 8, NCHW, ms, pointwise against the better of
# lanes and blocked; "C->K at size"): forward 2048->512 at 7 7.8 vs 9.5, 1024->256 at 14 7.2 vs
# 9.5, 512->128 at 28 7.4 vs 8.7, 128->512 at 28 7.0 vs 9.2, 144->24 at 56 2.9 vs 3.2, 64->256 at
# 56 9.0 vs 9.2, but 24->144 at 56 3.1 vs 2.4; data gradient (reduced over the K output
# channels) 512->128 6.1 vs 8.6, 1024->256 6.3 vs 7.3, 256->64 8.1 vs 11.7, 64->256 7.7 vs 9.1.
POINTWISE_MIN_REDUCED = 64
# Strided 1x1 kernels (ResNet's shortcuts), on Zen 3 (NCHW f32, 2 threads, batch 8, ms, pointwise
# against blocked, or lanes where it was the default): forward 64->128 at 56x56 stride 2 1.0 vs
# 1.8, 128->256 at 28 1.0 vs 1.2, 256->512 at 56 13.7 vs 18.4, 256->1024 at 28 7.4 vs 9.6,
# 512->1024 at 28 12.5 vs 15.1, 1024->2048 at 14 15.2 vs 21.3 (its strips read every other
# input value, its chunks are halved: see tiling._pointwise); data gradient (the columns are the
# grad_output pixels, the rest of the input gradient zeroed; same convolutions) 1024->2048 16.5
# vs lanes' 45.8, 512->1024 15.3 vs 17.5, 256->512 16.1 vs 20.2, but 128->256 2.0 vs 1.6 and
# 64->128 2.6 vs 1.8: the rule counts the output channels, which the data gradient reduces over.
POINTWISE_MIN_STRIDED_DGRAD = 512
# Forward patches (kernel = stride: ViT's, Swin's and ConvNeXt's patch embeddings and downsampling),
# on Zen 3 (NCHW f32, 2 threads, batch 8, ms, pointwise / blocked / lanes): 16x16 3->768 at 224
# 15.4 / 19.3 / 16.1, 8x8 3->256 at 256 6.9 / 7.3 / 9.3, 4x4 3->96 at 224 3.0 / 3.6 / 3.3, 1-D
# k2 256->256 at 1024 8.2 / 10.1 / 9.4; but 2x2 96->192 at 56 9.8 / 10.7 / 7.4, 2x2 384->768
# at 14 11.7 / 10.5 / 7.3, 2x2 64->128 at 112 29.3 / 27.9 / 19.9, 3x3 32->48 at 99 1.8 / 2.4 /
# 1.0 (lanes' broadcasts serve whole channel vectors where a 2-D patch is small), and 3x3 3->64
# at 96 0.34 / 0.31 / 0.99.
PATCH_POINTWISE_TAPS = 16
PATCH_LANES_MIN_IN = 32
PATCH_MIN_REDUCED = 32


def _pointwise_over(plan: Plan, choice: str, why: str) -> tuple[str, str]:
    """pointwise, where it measured faster than `choice`. With channels last as well (r50_1x1_2048_512,
    ms, pointwise against lanes: forward 8.8 vs 13.0, data gradient 9.3 vs 9.8; r50_1x1_64_256: 11.9
    vs 11.8, 8.3 vs 11.1)."""
    g = plan.geometry
    reduced = g.cin_g * math.prod(g.kernel) if plan.kop is KOp.FWD else g.cout_g
    if g.kernel != (1, 1, 1):     # forward patches
        if plan.problem.rank > 1 and math.prod(g.kernel) < PATCH_POINTWISE_TAPS:
            if g.cin_g >= PATCH_LANES_MIN_IN:
                return "lanes", f"{WHY['lanes']}; non-overlapping {'x'.join(map(str, g.kernel[-2:]))} patches"
            return choice, why
        if reduced >= PATCH_MIN_REDUCED:
            return "pointwise", f"{WHY['pointwise']}; non-overlapping patches, {reduced} (channel, tap) values reduced"
        return choice, why
    if plan.kop is KOp.DGRAD and g.stride != (1, 1, 1) and reduced < POINTWISE_MIN_STRIDED_DGRAD:
        return choice, why
    if _bf16_pairs(plan) and choice == "lanes":
        # lanes reduces bf16 in pairs on vdpbf16ps, pointwise on f32 FMAs (Zen 4, 1 thread, ms, lanes
        # / pointwise: r50_1x1_2048_512 forward 5.7 / 8.3, data gradient 4.9 / 8.4; r50_1x1_64_256
        # data gradient 7.8 / 9.8, forward 9.9 / 9.2)
        return choice, f"{why}; not pointwise: bf16 in pairs on vdpbf16ps"
    if choice == "lanes" and _widening_channels_last_dgrad(plan):
        return choice, (f"{why}; not pointwise: a channels-last 1x1 data gradient to {g.cin_g} channels from "
                        f"{g.cout_g} (measured on Zen 4)")
    if choice == "lanes" and _expanding_channels_last(plan):
        return choice, (f"{why}; not pointwise: a channels-last 1x1 forward to {g.cout_g} channels from "
                        f"{g.cin_g}, whose output stores dominate")
    nchw = all(op.layout is not Layout.CHANNELS_LAST for op in plan.operands if op.kind in ("X", "Y"))
    lanes_channels = g.cout_g if plan.kop is KOp.FWD else g.cin_g
    strided_dgrad = plan.kop is KOp.DGRAD and g.stride != (1, 1, 1)
    if (plan.target.isa == "avx512" and not nchw and g.groups == 1 and not _bf16_pairs(plan) and not strided_dgrad
            and (reduced <= CL_LANES_MAX_REDUCED or lanes_channels % WIDE_LANES_BLOCK == 0)):
        return "lanes", f"{WHY['lanes']}; not pointwise: channels last on AVX-512, {reduced} channels reduced"
    if plan.target.isa == "avx512" and g.stride == (1, 1, 1) and nchw:
        plane = math.prod(g.y_size if plan.kop is KOp.FWD else g.x_size)
        if plane <= PLANE_POINTWISE_WASTES and lanes_channels % WIDE_LANES_BLOCK == 0:
            return "lanes", f"{WHY['lanes']}; not pointwise: {plane} pixels per image fill few 16-pixel vectors"
        if reduced < POINTWISE_WIDE_MIN_REDUCED:
            return choice, f"{why}; not pointwise: {reduced} channels reduced (AVX-512)"
    if reduced >= POINTWISE_MIN_REDUCED:
        return "pointwise", f"{WHY['pointwise']}; {reduced} channels reduced"
    return choice, why


# The pointwise GEMMs on AVX-512 (tiles of 14 channels x 2 vectors of 16 pixels), against blocked
# and lanes (Xeon, f32 NCHW, 2 threads, kernel alone, ms, pointwise / the other): fewer than 256
# reduced channels went to blocked or lanes by their scores: r50_1x1_64_256 forward 4.28 / 3.43
# (blocked), r50_1x1_256_64 data gradient 4.28 / 2.92, mb_pw_16_96 3.47 / 2.41, mb_pw_144_24
# forward 1.26 / 1.13, shuffle_g3 1.46 / 1.34 and 1.51 / 1.25, c3d_1x1 1.19 / 1.02, r50_1x1_512_128
# data gradient 3.59 / 3.49 (pointwise kept r50_1x1_256_64's forward, 3.82 against lanes' 4.02,
# and r50_1x1_1024_256's, 3.01 / 3.15). Images of at most 64 pixels (7x7) leave pointwise's pixel
# vectors a quarter empty: lanes, where its channel blocks are whole, r50_1x1_2048_512 forward 3.84
# / 3.26 and data gradient 3.35 / 3.05, r50_1x1_512_2048 3.27 / 2.94 and 3.80 / 3.05.
POINTWISE_WIDE_MIN_REDUCED = 256
# In channels last on AVX-512 lanes reads each pixel's channels as whole vectors and beat pointwise
# on 1x1 kernels without groups (Xeon, f32, 2 threads, kernel alone, ms, pointwise / lanes):
# forward r50_1x1_256_64 5.17 / 3.12, r50_1x1_512_128 4.10 / 2.80, r50_1x1_1024_256 3.58 / 2.95,
# r50_1x1_2048_512 3.83 / 3.08, mb_pw_144_24 1.79 / 1.07, c3d_1x1 1.46 / 0.82, strided
# r50_ds_256_512_s2 7.90 / 5.83; data gradient r50_1x1_64_256 5.02 / 3.12, r50_1x1_128_512 4.05 /
# 2.85, mb_pw_16_96 4.84 / 2.73, c3d_1x1 1.68 / 0.91. Pointwise kept a long reduction into a
# partial channel block (mb_pw_960_160's forward, 960 -> 160: 0.63 / 0.83), groups (shuffle_g3,
# 1.73 / 2.03) and strided data gradients (r50_ds_256_512_s2 9.78 / 15.99).
CL_LANES_MAX_REDUCED = 512
PLANE_POINTWISE_WASTES = 64
WIDE_LANES_BLOCK = 64   # channels of lanes' AVX-512 tile (4 vectors of 16)


# The data gradient of a channels-last 1x1 that narrows (to a quarter: the input gradient has 4x the
# channels it reduces over) stays with lanes on AVX512-BF16 hosts: Zen 4, f32, 2 threads, kernel
# alone, ms, lanes / pointwise, two runs: r50_1x1_2048_512 4.44 / 5.40 and 4.78 / 5.46,
# r50_1x1_1024_256 4.69 / 4.81 and 4.78 / 4.94, r50_1x1_512_128 5.09 / 5.54 and 5.11 / 5.54
# (r50_1x1_64_256's, which widens, stays pointwise: 6.30 against 9.24).
def _widening_channels_last_dgrad(plan: Plan) -> bool:
    g = plan.geometry
    return (plan.target.evex_tiles and plan.kop is KOp.DGRAD and g.stride == (1, 1, 1)
            and any(op.layout is Layout.CHANNELS_LAST for op in plan.operands if op.kind == "X")
            and g.cin_g >= EXPAND_RATIO * g.cout_g)


# A 1x1 forward that widens few channels to many writes far more than it reads; in channels last the
# lanes kernel writes each pixel's channels as whole vectors (past the caches when large), where the
# pointwise tile writes 6 channels of 16 pixels, 24 bytes per pixel. Measured on Zen 4 (f32, channels
# last, batch 8, 2 threads, kernel alone, ms, pointwise / lanes, three runs): 64->256 at 56x56 7.70 /
# 6.11, 7.86 / 6.37, 7.48 / 4.82; 128->512 at 28x28 5.71 / 5.68, 5.59 / 4.68, 5.59 / 4.69; but
# 256->64 at 56x56 6.55 / 9.96, 6.54 / 9.66, 6.17 / 9.12, and 256->1024 at 14x14 ran even.
EXPAND_MAX_IN, EXPAND_RATIO = 128, 4


def _expanding_channels_last(plan: Plan) -> bool:
    g = plan.geometry
    written_cl = any(op.layout is Layout.CHANNELS_LAST for op in plan.operands if op.kind == "Y")
    return (plan.kop is KOp.FWD and written_cl and g.stride == (1, 1, 1)
            and g.cin_g <= EXPAND_MAX_IN and g.cout_g >= EXPAND_RATIO * g.cin_g)


# The pointwise weight gradient (dot products over pixels, both operands copied a chunk at a time)
# streams more operand bytes per FMA than gemm's tile (KR + CR vectors per KR x CR FMAs, against
# gemm's two vectors and MR broadcasts), so it wins where the reduction over pixels is long and
# the input channels few: there gemm and lanes spend their time packing the whole of grad_output
# into a fresh buffer per call (38 MB for MobileNet's 16->96 expansion at 112x112, whose page
# faults alone cost 15-20 ms in some runs). On Zen 3 (NCHW f32, 2 threads, batch 8, ms, pointwise
# against the better of gemm and lanes): 16->96 at 112x112 4.9 against 7.1 (24 when the buffer
# faults), 8->48 at 112 1.9 against 3.2, 3->64 at 112 2.2 against 4.4, 32->64 at 112 5.2 against
# 6.7, 24->144 at 56 2.5 against 2.8, 48->288 at 28 1.7 against 1.9, 3->16 at 128x128 (batch 4)
# 0.30 against 0.87, 1-D 16->96 at 8192 3.5 against 5.0; 32->192 at 28 1.04 against 0.92 and
# 16->16 at 112 1.01 against 1.02. With 64 input channels or more, or fewer output channels than
# input, gemm or lanes won (64->256 at 56 9.6 against 9.2, 512->128 at 28 9.0 against 6.5,
# 96->24 at 56 1.4 against 1.1); in channels last lanes won (32->64 at 112 11.5 against 7.0).
DOTS_WGRAD_MAX_IN = 48
# On AVX512-BF16 hosts (Target.evex_tiles; Zen 4, f32 NCHW, 2 threads, kernel alone, ms, pointwise /
# lanes) the expansion r50_1x1_64_256 goes to pointwise too: 5.73 / 6.65 and 5.48 / 6.50 (128->512
# at 28x28 stays lanes, 5.38 / 5.18; a strided 64->128 0.71 / 0.67); a third run 5.66 / 7.10.
DOTS_WGRAD_EVEX_MAX_IN = 64   # with unit strides and at least EXPAND_RATIO times as many output channels
# bf16 where the target multiplies it on vdpbf16ps (Target.bf16_dot): the pointwise weight gradient
# copies its chunks as they are and takes pairs of pixels per lane and step, twice the products of
# its f32 path per instruction, and wins wherever an image has DOTS_WGRAD_PAIRS_MIN_PLANE output
# pixels or more. Zen 4, NCHW bf16, 2 threads, kernel alone, ms, pointwise / the former default:
# r50_1x1_64_256 2.79 / 4.80 (gemm), r50_1x1_256_64 2.87 / 3.54, r50_1x1_128_512 2.68 / 3.49,
# r50_1x1_512_128 2.76 / 2.79, mb_pw_144_24 0.64 / 1.78 (lanes), c1d_256_k1 (512 pixels) 3.79 /
# 4.17, r18_ds_1x1_s2 0.48 / 0.61; smaller images keep gemm (14x14: r50_1x1_1024_256 2.97 / 2.46,
# r50_1x1_256_1024 2.89 / 3.02; 7x7: r50_1x1_2048_512 4.23 / 2.69, mb_pw_960_160 0.63 / 0.54).
DOTS_WGRAD_PAIRS_MIN_PLANE = 512


def _dots_over(plan: Plan, choice: str, why: str) -> tuple[str, str]:
    """pointwise for a 1x1 weight gradient, where it measured faster than `choice`."""
    g = plan.geometry
    if any(op.layout is Layout.CHANNELS_LAST for op in plan.operands if op.kind in ("X", "Y")):
        return choice, why
    wide = (plan.target.evex_tiles and plan.problem.dtype is DType.F32 and g.stride == (1, 1, 1)
            and g.cin_g <= DOTS_WGRAD_EVEX_MAX_IN and g.cout_g >= EXPAND_RATIO * g.cin_g)
    if (g.cin_g <= DOTS_WGRAD_MAX_IN and g.cout_g >= g.cin_g) or wide:
        return "pointwise", (f"dot products over pixels, a chunk of both operands copied at a time; "
                             f"{g.cin_g} input channels, {g.cout_g} output channels")
    plane = g.y_size[0] * g.y_size[1] * g.y_size[2]
    if plan.problem.dtype is DType.BF16 and plan.target.bf16_dot and plane >= DOTS_WGRAD_PAIRS_MIN_PLANE:
        return "pointwise", (f"dot products over pixels, bf16 in pairs of pixels on vdpbf16ps; {plane} output "
                             f"pixels per image")
    return choice, why


# The weight gradient's packed GEMM (gemm: gW[k][c, tap], reduced over pixels, input values packed
# per item and chunk) against lanes (with its register tile stepped in assembly), on Zen 3 (NCHW
# f32, 2 threads, ms, gemm vs lanes; batch 8 unless noted):
# - 1x1 with 256 or more input channels: 256->64 at 56x56 9.4 vs 11.0, 512->128 at 28 7.3 vs 9.9,
#   1024->256 at 14 10.1 vs 11.7, 256->1024 at 14 7.9 vs 8.8, 2048->512 at 7 8.7 vs 11.5, stride 2
#   256->512 at 56 16.3 vs 28.8; but 128->512 9.1 vs 9.1, 64->256 9.9 vs 10.3 and stride 2
#   64->128 2.0 vs 1.7.
# - 1-D: 64->64 k5 at 1024 (batch 16) 8.9 vs 13.6, 256->256 k1 11.1 vs 15.5, stride 2 19.3 vs
#   31.8, transposed 6.3 vs 12.1, wavenet_1d (dilation 4) 29.4 vs 66.4.
# - Strided windows over large images: r50_3x3_128_s2 18.6 vs 18.0 and 64->128 s2 10.1 vs 10.5,
#   transposed 2x2 s2 (unet) 15.8 vs 17.4, 4x4 s2 to 3 channels 3.4 vs 7.1; but 3x3x3 s2 at
#   16x56x56 (64 out) 14.7 vs 12.6.
# - Dilation alone leaves lanes reading whole rows: deeplab_dil2 (256 channels) 40.9 vs 43.7, but
#   64 channels at 45x45, dilation 3, 8.8 vs 5.1.
# - Few rows (input channel, tap) leave lanes' per-pixel addressing unamortised: 3->64 3x3 at
#   224x224 (batch 2) 10.1 vs 20.4.
# Lanes wins with unit strides and many rows (r50_3x3_64 18.1 vs 13.3, unet3d 22.9 vs 17.5,
# r50_3x3_128 18.1 vs 13.8), few pixels per image, few output channels per group (rnx_grouped 16.9
# vs 11.4, 24 output channels 2.3 vs 1.8).
GEMM_WGRAD_MIN_OUT = 64
GEMM_WGRAD_MIN_IN = 256          # 1x1: input channels
GEMM_WGRAD_MIN_PLANE = 512       # strided: output pixels per image
GEMM_WGRAD_MIN_DILATED_OUT = 256
GEMM_WGRAD_MAX_FEW_ROWS = 32     # below this many (input channel, tap) rows
# Strided windows of many taps over few output pixels: ViT-B/16's 16x16 stride-16 embedding (3 ->
# 768 at 224x224, 196 output pixels per image) 17.1 ms against lanes' 20.6; 2x2 stride 2 (384 ->
# 768 at 14x14) stays with lanes, 8.8 against 10.3.
GEMM_WGRAD_MIN_STRIDED_TAPS = 16
# Where lanes' weight-gradient tile takes 32 registers (Target.evex_tiles: AVX2 code with AVX512-VL,
# i.e. AVX512-BF16 hosts), the boundaries move. Zen 4, f32 NCHW, 2 threads, kernel alone, ms, gemm
# against lanes: overlapping strided windows over images of GEMM_WGRAD_MIN_PLANE output pixels or
# more go to lanes (r18_3x3_64_s2 6.00 / 5.02, c3d_s2 13.2 / 10.6 and 10.7 / 9.4, r50_stem 9.59 /
# 7.91 and 8.00 / 7.79, c3d_stem within 2%, a transposed 3x3 stride 2 5.79 / 5.01, r50_3x3_128_s2
# 11.2 / 10.7 and 14.9 / 14.5), and so do dilated ones (deeplab_dil2 25.7 / 24.7, 27.6 / 26.4);
# non-overlapping strided windows (kernel no larger than the stride) stay with gemm (cnx_down_2x2
# 10.9 / 12.1, unet_up_2x2 24.0 / 26.0), as do strided windows of GEMM_WGRAD_MIN_STRIDED_TAPS taps
# or more over smaller images (dcgan_tconv 2.93 / 3.11, 3.52 / 3.75), and fewer than
# GEMM_WGRAD_EVEX_FEW_ROWS (input channel, tap) rows (a transposed 64 -> 3 4x4 stride 2 at 64x64, 48
# rows: 2.83 / 4.48); and images of fewer than GEMM_WGRAD_EVEX_MAX_PLANE output pixels go to gemm
# (r50_3x3_512, 7x7: 9.5 / 10.2 and 11.0 / 11.6; r18_3x3_512_n1, one 7x7 image: 1.54 / 2.48; at
# 14x14 r50_3x3_256 stays lanes, 10.2 / 9.9 and 9.7 / 9.6).
GEMM_WGRAD_EVEX_MAX_PLANE = 64
GEMM_WGRAD_EVEX_FEW_ROWS = 64
# On AVX-512 (Xeon, f32 NCHW, 2 threads, kernel alone, ms, gemm / lanes) 1-D windows of unit stride
# go to lanes (c1d_64_k5 4.63 / 3.82, c1d_tconv 3.61 / 3.11, wavenet_1d 16.1 / 15.6; strided ones
# stay gemm, c1d_stride2 9.2 / 9.8), and the few-rows bound is AVX2's 32 (tconv_to_rgb, 48 rows,
# 2.74 / 1.51; vgg_3_64, 27 rows, stays gemm: 4.89 / 6.00).


def _gemm_over(plan: Plan, choice: str, why: str) -> tuple[str, str]:
    """gemm for a weight gradient, where it measured faster than lanes (`choice`)."""
    g = plan.geometry
    if g.cout_g < GEMM_WGRAD_MIN_OUT:
        return choice, why
    rows = g.cin_g * math.prod(g.kernel)
    if g.kernel == (1, 1, 1) and g.cin_g >= GEMM_WGRAD_MIN_IN:
        return "gemm", f"{WHY['gemm']}; 1x1 with {g.cin_g} input channels"
    if g.kernel == (1, 1, 1) and _bf16_pairs(plan):
        # no im2col to pack, and both sides reduce in pairs: r50_1x1_64_256 (Zen 4, 2 threads, ms)
        # gemm 4.8 against lanes' 6.4 and pointwise's 5.1
        return "gemm", f"{WHY['gemm']}; 1x1, bf16 in pairs on vdpbf16ps"
    if g.kernel == (1, 1, 1):   # (a 1x1 with unit strides is flattened to 1-D rows: not the 1-D case below)
        return choice, why
    if _bf16_pairs(plan):
        # In bf16 pairs (vdpbf16ps) lanes halves its steps while gemm's im2col packing stays: on Zen 4,
        # 1 thread, ms, lanes against gemm: r50_3x3_128_s2 16.4 / 18.5, deeplab_dil2 27.7 / 35.6,
        # wavenet_1d 27.3 / 33.7, r50_stem 9.0 / 15.0, odd_asym 0.32 / 0.89 (r50_1x1_2048_512 stays
        # gemm: 4.6 / 8.1).
        return choice, f"{why}; bf16 in pairs on vdpbf16ps, where lanes beats gemm's im2col but for wide 1x1"
    wide = plan.target.isa == "avx512"
    if plan.problem.rank == 1 and not (wide and g.stride == (1, 1, 1)):
        return "gemm", f"{WHY['gemm']}; 1-D"
    evex = plan.target.evex_tiles and plan.problem.dtype is DType.F32   # the Zen 4 boundaries below
    if rows < (GEMM_WGRAD_EVEX_FEW_ROWS if evex and not wide else GEMM_WGRAD_MAX_FEW_ROWS):
        return "gemm", f"{WHY['gemm']}; only {rows} (input channel, tap) rows"
    if evex:
        plane = math.prod(g.y_size)
        if plane < GEMM_WGRAD_EVEX_MAX_PLANE:
            return "gemm", f"{WHY['gemm']}; {plane} output pixels per image (lanes' tile in 32 registers, measured on Zen 4)"
        if any(s > 1 for s in g.stride) and all(k <= s for k, s in zip(g.kernel, g.stride)):
            return "gemm", f"{WHY['gemm']}; strided windows that do not overlap (kernel {list(g.kernel)}, stride {list(g.stride)})"
        if (any(s > 1 for s in g.stride) and plane < GEMM_WGRAD_MIN_PLANE and math.prod(g.kernel) >= GEMM_WGRAD_MIN_STRIDED_TAPS
                and not wide):   # (AVX-512: lanes, dcgan_tconv 2.62 / gemm 2.80, channels last 3.04 / 3.49)
            return "gemm", f"{WHY['gemm']}; strided windows of {math.prod(g.kernel)} taps over {plane} output pixels"
        return choice, f"{why}; lanes' tile in 32 registers beats gemm on strided and dilated windows (measured on Zen 4)"
    if any(s > 1 for s in g.stride) and math.prod(g.y_size) >= GEMM_WGRAD_MIN_PLANE:
        return "gemm", f"{WHY['gemm']}; strided windows, {math.prod(g.y_size)} output pixels per image"
    if any(s > 1 for s in g.stride) and math.prod(g.kernel) >= GEMM_WGRAD_MIN_STRIDED_TAPS:
        return "gemm", f"{WHY['gemm']}; strided windows of {math.prod(g.kernel)} taps"
    if any(d > 1 for d in g.dilation) and g.cout_g >= GEMM_WGRAD_MIN_DILATED_OUT:
        return "gemm", f"{WHY['gemm']}; dilated windows, {g.cout_g} output channels"
    return choice, why


# "lanes" is chosen over "blocked" when blocked's register tile scores below this fraction of
# lanes' (measured on Zen 3: lanes ran 1.2-1.4x faster on 33-, 28- and 7-wide rows, about as fast
# on 56-, 14- and 32-wide ones with 32-64 channels, and 1.5x slower on 32-wide rows with 256).
# Strided data gradients whose phases all take the same taps (a 4x4 kernel, stride 2) follow the
# scores too since blocked's row blocks: dcgan_tconv's forward, 16-wide phases, blocked 5.8-6.2
# ms against lanes' 6.9-7.0; 8-wide phases with 128 channels, lanes 5.7 against 6.7.
LANES_OVER_BLOCKED = 0.85
STRIDED_LANES_MIN_IN = 16       # a strided NCHW forward takes lanes from this many input channels
# On AVX-512, NCHW, a transposed convolution's data gradient (a strided forward kernel) takes lanes
# from this many input channels (its grad_output's) per rank; 1-D stays on blocked. Zen 4, f32, 2
# threads, kernel alone, ms, blocked / lanes, grad_output's channels and size: 2-D 4x4 s2 64 at 32x32
# (dcgan_tconv) 3.25 / 2.44, 128 at 16x16 6.31 / 2.29, 256 at 8x8 14.1 / 2.5, 2x2 s2 128 at 56x56
# 10.1 / 8.3; 32 channels: 3x3 s2 at 64x64 1.64 / 1.56, 4x4 s2 at 64x64 2.73 / 2.84; 16 (3x3 s2
# at 128x128) 0.78 / 0.90, 3 (tconv_to_rgb) 1.10 / 1.32; 3-D 4x4x4 s2 16 at 16x32x32 1.66 / 1.22,
# 32 at 16x32x32 6.34 / 4.59, 3x3x3 s2 8 at 16x64x64 0.72 / 0.88; 1-D k4 s2 64 at 2048
# (c1d_tconv) 2.73 / 2.83. (Not measured on the full-rate AVX-512 Xeon.)
WIDE_TRANSPOSED_LANES_MIN_IN = {2: 32, 3: 16}


def _bf16_pairs(plan: Plan) -> bool:
    """Whether lanes tiles reduce this problem in bf16 pairs on vdpbf16ps (see Target.bf16_dot)."""
    return plan.problem.dtype is DType.BF16 and plan.target.bf16_dot


def _lanes_or_blocked(plan: Plan) -> tuple[str, str]:
    """blocked (columns in the lanes) or lanes (channels in the lanes), by their tile scores."""
    g, t = plan.geometry, plan.target
    lanes = max(1, t.vector_bytes // plan.problem.dtype.accumulator.itemsize)
    if plan.kop is KOp.FWD:
        channels, columns = g.cout_g, g.y_size[2]
    else:
        channels, columns = g.cin_g, math.ceil(g.x_size[2] / g.stride[2])
    *_, blocked = tiling.register_tile(channels, columns, lanes, t.vector_registers, wide=plan.kop is KOp.DGRAD)
    # (scored FMA-bound at best, as blocked's tile is: AVX-512's uncapped 4 x 6 scored 1.42 against
    # blocked's 0.89-1.02 where blocked ran faster; Xeon, f32 NCHW, 2 threads, kernel alone, ms,
    # blocked / lanes: r50_3x3_64 forward 6.98 / 8.01, data gradient 6.53 / 7.50; wavenet_1d
    # 11.3 / 20.7 and 11.2 / 20.6; lanes kept r50_3x3_256 6.14 / 8.36, r50_3x3_512 16.5 / 6.4,
    # deeplab_dil2 30.8 / 17.9, odd_asym 0.28 / 0.18)
    *_, by_channels = tiling.lanes_tile(channels, lanes, t.vector_registers, asm=t.fma_asm, capped=True)
    scores = f"tile scores blocked {blocked:.2f}, lanes {by_channels:.2f}"
    written = next(op for op in plan.operands if op.writes)
    if written.layout is Layout.CHANNELS_LAST and by_channels >= 0.5 and (g.stride == (1, 1, 1) or blocked < 0.95 * by_channels):
        # channels are the contiguous axis: lanes stores whole vectors where blocked would gather
        # and scatter one element per channel stride (forward 0.44x -> 0.61x torch on
        # r50_1x1_64_256). Strides too, since lanes spreads a data gradient's stride phases over
        # the threads evenly and steps each phase's taps at offsets known at compile time (before,
        # 0.76x -> 0.60x torch on r50_3x3_128_s2). Xeon, f32, 2 threads, kernel alone, ms, blocked
        # / lanes: r50_3x3_128_s2 data gradient 10.50 / 8.14 (AVX2 shape 16.87 / 13.40),
        # dcgan_tconv's data gradient (a stride-2 forward kernel) 3.65 / 2.70 (3.94 / 3.47); with
        # strides, blocked where its tile scores within 5% of lanes' or above (odd_asym's data
        # gradient, 17 channels, stride 2: tile scores 0.82 / 0.55, 0.20 / 0.33 ms; AVX2 shape
        # 0.70 / 0.72, 0.36 / 0.40 ms)
        return "lanes", f"{WHY['lanes']}; channels-last {written.role} ({scores})"
    blocked_pairs = (g.cin_g if plan.kop is KOp.FWD else g.cout_g) > 1
    if _bf16_pairs(plan) and by_channels >= 0.5 and (by_channels >= blocked or not blocked_pairs):
        # lanes reduces bf16 in pairs on vdpbf16ps, blocked (one channel per group) on f32 FMAs (Zen 4,
        # 1 thread, ms, lanes / blocked: forward r50_3x3_128_s2 10.3 / 22.5, dcgan_tconv 3.7 / 5.8,
        # r50_stem 9.1 / 9.6, wavenet_1d 30.1 / 33.9; data gradient r50_3x3_128_s2 13.6 / 25.0,
        # dcgan_tconv 2.9 / 5.3). With blocked in pairs as well (two channels a group or more),
        # lanes where its tile scores at least blocked's (Zen 4, 2 threads, kernel alone, ms, lanes /
        # blocked, both in pairs: forward r50_3x3_64 4.64 / 4.91, r50_3x3_128_s2 4.52 / 4.94,
        # deeplab_dil2 11.9 / 22.2, odd_asym 0.134 / 0.164, r50_stem 3.48 / 3.44, wavenet_1d 8.24 /
        # 7.72 (scores 1.03 / 1.02); data gradient r50_3x3_64 4.48 / 4.85, r50_3x3_128_s2 5.09 / 5.40,
        # dcgan_tconv 1.25 / 1.64)
        return "lanes", f"{WHY['lanes']}; bf16 in pairs on vdpbf16ps ({scores})"
    if _bf16_pairs(plan) and by_channels >= 0.5:
        # odd_asym's data gradient (17 channels: lanes' second vector holds one): 0.245 / 0.134
        return "blocked", f"{WHY['blocked']}; bf16 in pairs on vdpbf16ps in both, blocked's tile scores higher ({scores})"
    # (the AVX-512 boundaries below: Xeon, f32 NCHW, 2 threads, kernel alone)
    wide = t.isa == "avx512" and written.layout is not Layout.CHANNELS_LAST
    if plan.kop is KOp.DGRAD and g.stride != (1, 1, 1) and columns > lanes:
        # (AVX-512 took one-vector phases here too while lanes stored a stride-2 phase's pixels
        # value by value: dcgan_tconv's forward, 16-wide phases, blocked 2.68 ms against lanes'
        # 3.57 on the Xeon. With those stores two masked vector stores per channel (vstore_t_step2),
        # lanes is faster there: Zen 4, f32 NCHW, 2 threads, kernel alone, ms, blocked / lanes:
        # dcgan_tconv 3.65 / 2.86, 4x4 s2 256 -> 128 at 16x16 14.0 / 10.7, data gradients of 3x3
        # s2 at 32x32 64 -> 128 2.34 / 1.87, 128 -> 128 5.50 / 3.96, 32 -> 64 0.83 / 0.51.)
        # blocked specialises its tap loop per stride phase at compile time, where lanes tests
        # every tap (data gradients, ms, blocked against lanes: r50_3x3_128_s2, 28-wide phases,
        # 26.2 against 39.6; 3x3 s2 256->256 at 28x28, 14-wide, 23.9 against 31.6; 1x1 s2
        # 128->64 at 56x56 1.7 against 7.1); phases of one vector or less follow the scores
        # (8-wide, 4x4 s2, 128 channels: lanes 5.7 against 6.7)
        return "blocked", f"{WHY['blocked']}; strided data gradient, {columns}-wide phases ({scores})"
    if plan.kop is KOp.FWD and g.stride[2] > 1:
        # lanes broadcasts from every SW-th input column of a padded copy, blocked splits the
        # columns into phases. Since lanes' tile steps in assembly (4 x 3), lanes is as fast or
        # faster in NCHW from 16 input channels (ms, blocked / lanes: 3x3 stride 2 64->128 at 56x56
        # 9.1 / 7.0, 256 at 28x28 14.6 / 14.1, 512 at 14x14 15.6 / 13.1, 32->64 at 112x112 8.7 / 7.7,
        # 16->32 at 112 2.8 / 2.4, 5x5 64 at 56 10.6 / 8.7, r50_3x3_128_s2 16.0 / 15.6, 3x3x3 at
        # 16x56x56 15.0 / 11.8), but not from 3 channels (r50_stem 7.2 / 8.2, MobileNet's stem
        # 2.5 / 3.7), nor for the data gradients of transposed convolutions, which are forward
        # kernels (1-D k4 stride 2 transposed 4.3 / 5.4, 3x3 stride 2 2.7 / 3.0, dcgan 4.1 / 3.8).
        # Channels last (lanes copies the input channels innermost, blocked gathers every row and
        # scatters its stores) lanes is faster from any channel count (Zen 4, 2 threads, blocked / lanes:
        # r50_3x3_128_s2 12.3 / 11.4, 3x3 stride 2 64->128 at 56x56 6.2 / 5.6, 256 at 28x28
        # 11.3 / 11.2, r50_stem 5.95 / 5.47)
        if not plan.problem.transposed and (written.layout is Layout.CHANNELS_LAST or
                                            g.cin_g >= STRIDED_LANES_MIN_IN):
            what = (f"channels-last {written.role}" if written.layout is Layout.CHANNELS_LAST
                    else f"{g.cin_g} input channels")
            return "lanes", f"{WHY['lanes']}; strided rows, {what} ({scores})"
        # On AVX-512 (NCHW) the data gradients of 2-D and 3-D transposed convolutions take lanes too,
        # from more input channels (WIDE_TRANSPOSED_LANES_MIN_IN).
        transposed_min = WIDE_TRANSPOSED_LANES_MIN_IN.get(plan.problem.rank) if wide else None
        if plan.problem.transposed and transposed_min is not None and g.cin_g >= transposed_min:
            return "lanes", (f"{WHY['lanes']}; strided rows of a transposed convolution's data gradient, "
                             f"{g.cin_g} input channels ({scores})")
        return "blocked", f"{WHY['blocked']}; strided rows ({scores})"
    if wide and columns <= 2 * lanes and channels >= WIDE_LANES_MIN_CHANNELS:
        return "lanes", f"{WHY['lanes']}; rows of at most two vectors, {channels} channels ({scores})"
    if wide and g.stride == (1, 1, 1) and columns <= 4 * lanes and channels >= WIDE_LANES_FOUR_VECTORS_MIN_CHANNELS:
        return "lanes", f"{WHY['lanes']}; unit strides, rows of at most four vectors, {channels} channels ({scores})"
    if blocked < LANES_OVER_BLOCKED * by_channels:
        return "lanes", f"{WHY['lanes']}; {scores}"
    return "blocked", f"{WHY['blocked']}; {scores}"


# On AVX-512 blocked's rows of up to two vectors (32 f32 columns) score as well as any (0.89 at 28
# and 56 columns), but from 128 channels lanes ran faster there (Xeon, f32 NCHW, 2 threads, kernel
# alone, ms, blocked / lanes): vgg_512_512 forward 58.6 / 50.2, data gradient 66.8 / 49.4;
# r50_3x3_128 7.04 / 6.36; r18_3x3_128 6.84 / 6.44 (64 channels at 28 stayed blocked: c3d_64
# 0.98x and 0.93x lanes' time; tconv_s1 even).
WIDE_LANES_MIN_CHANNELS = 128
# With unit strides, rows of up to four vectors take lanes from 64 channels: since the AVX-512 shape
# stores whole vectors (vstore_t; its channel-plane stores had been 16 scalar moves each), lanes ran
# faster there (Xeon, f32 NCHW, 2 threads, kernel alone, blocked / lanes time, four runs): forward
# r50_3x3_64 1.15, 1.18, 1.06, 1.03; c3d_64 1.15, 1.08, 1.07, 1.10; vgg_256_256 1.11, 1.21, 1.09,
# 1.09; odd_nobias 1.27, 1.25, 1.11, 1.09; tconv_s1 1.25, 1.22, 1.06, 1.25; data gradient
# r50_3x3_64 0.99, 1.21, 0.98, 1.27; vgg_256_256 1.08, 1.19, 1.28, 1.04; odd_nobias 1.16, 1.13,
# 0.99, 0.99; c3d_64 1.00, 1.03, 1.01, 0.95; tconv_s1 1.29, 1.25, 1.11, 1.09. Not from 32 channels
# (unet3d's data gradient 0.83, 0.94) nor on wider rows (vgg_64_64, 224 wide, 0.87; n1_big, 128
# wide, 0.78 and 1.07).
WIDE_LANES_FOUR_VECTORS_MIN_CHANNELS = 64


def _amx_fits(plan: Plan) -> bool:
    """Whether an AMX kernel computes this kernel op: a bf16 forward, data gradient (a forward of
    grad_output per stride phase) or weight gradient, on a target with AMX-BF16 tiles (any sizes:
    channels are zero-padded to the tiles)."""
    return (plan.problem.dtype is DType.BF16 and plan.target.amx_bf16 and
            plan.kop in (KOp.FWD, KOp.DGRAD, KOp.WGRAD))


# AMX is the default from this many channels per group on both sides (a tile row reduces 32 input
# channels and a tile holds 16 output channels; fewer are zero-padded to them).
AMX_MIN_CHANNELS = 16


# Candidate algorithms per kernel op, the heuristic's default first.
CANDIDATES = {
    KOp.FWD: ("blocked", "lanes", "direct"),
    KOp.DGRAD: ("blocked", "lanes", "direct"),
    KOp.WGRAD: ("lanes", "gemm", "direct"),
}
WHY = {
    "blocked": "register-blocked micro-kernel over zero-padded rows, strides split into phases",
    "lanes": "channels in the vector lanes, pixels broadcast (weight gradient: input values broadcast, no "
             "im2col): no lanes wasted on narrow rows",
    "direct": "per-thread accumulation planes, scalar taps",
    "gemm": "a packed GEMM over output channels x (input channel, tap) columns, register tiles of 6 output "
            "channels x 2 vectors of columns, reduced over pixels in a fixed order",
    "pointwise": "a packed GEMM over channels (1x1 kernel), register tiles of channels x pixels",
    "grouplanes": "depthwise or small groups in channels last: the groups' channels in the vector lanes, a register "
                  "tile of channel vectors x pixels, every pixel's channels one contiguous load",
    "amx": "AMX tiles (bf16 products, f32 sums), 2 x 2 accumulator tiles per step: forward and data gradient (per "
           "stride phase) 16 pixels x 32 channels of a zero-padded channels-last copy by 32 x 16 weights, weight "
           "gradient 16 input channels x 32 pixels of a planar copy by 32 pixels x 16 output channels",
    "planes": "weight gradient over zero-padded planes of one row pitch: each (output channel, input channel, tap) "
              "a flat dot product over pixels in the vector lanes, a register tile of a group's output channels x "
              "(input channel, tap) rows",
    "depthwise": "one (image, channel) plane or channel per item: forward and data gradient over a zero-padded copy "
                 "of the plane, each tap a flat run; weight gradient per-tap vector partial sums over rows or "
                 "planes",
}


PASS = Pass("algorithm", run, requires=("canonical",), provides=("algorithm",), doc=__doc__)
