"""Which of the implicit GEMM's operands (igemm.py) move by 16-byte copies from iterators: offsets set
up before the main loop and advanced a step at a time (templates/gpu/igemm.cu.j2), not decoded from
the reduction index at every step."""

from __future__ import annotations

from .igemm_tiles import IgemmTiles
from .normal import Normal

# A GEMM operand's 16-byte copies take their sources from offsets set up before the main loop and
# advanced a step at a time (templates/gpu/igemm.cu.j2, "iterators"), not from the reduction index
# decoded at every step, where the reduction is read in the operand's memory order (tap-major over
# channels-last activations, linearly along the weight as read) and a row's taps fit a 64-bit mask. A
# step may straddle taps (the template's TapWalk): a group's channels (filters) need only be whole
# 16-byte copies, which the operand's 16-byte copies already ask. The template checks the same
# conditions (static_assert).
MAX_ITERATOR_TAPS = 64


def copy_iterators(normal: Normal, tiles: IgemmTiles, read_strides, converts: dict,
                   fwd_normal: Normal | None = None) -> dict[str, bool]:
    """Which operands' copies go by iterator: FWD_A (the input: channels-last, or along its pixels),
    FWD_B (the weight, read linearly in the reduction's order), DGRAD_A (grad_output: channels-last, or
    along its pixels), DGRAD_B (the weight's filters-innermost copy). `fwd_normal`: the forward's
    channels where the layout pass pads its copies (padding.forward_normal)."""
    g = normal.groups or 1
    cg = (fwd_normal or normal).channels // g
    rd, rh, rw = normal.kernel
    taps = rd * rh * rw
    _, ws_c, ws_d, ws_h, ws_w = read_strides[2]
    fwd, dgrad = tiles.fwd, tiles.dgrad
    # an axis of one element (a 1x1 kernel's taps, one channel) has no stride to keep
    extents = {"c": cg, "w": rw, "h": rh, "d": rd}
    read = {"c": ws_c, "w": ws_w, "h": ws_h, "d": ws_d}
    order = (("c", 1), ("w", cg), ("h", rw * cg), ("d", rh * rw * cg)) if fwd.tap_major else \
        (("w", 1), ("h", rw), ("d", rh * rw), ("c", taps))
    linear = all(extents[axis] == 1 or read[axis] == stride for axis, stride in order)
    return {"FWD_A": fwd.a_mn or (fwd.vector_a and fwd.tap_major and taps <= MAX_ITERATOR_TAPS),
            "FWD_B": fwd.vector_b and linear,
            "DGRAD_A": dgrad.a_mn or (dgrad.vector_a and dgrad.tap_major and taps <= MAX_ITERATOR_TAPS),
            "DGRAD_B": dgrad.vector_b and "W" in converts["DGRAD"] and dgrad.tap_major}
