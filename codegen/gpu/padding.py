"""Channels padded for the implicit GEMM's forward (igemm.py): where the layout pass stages a single-group
forward's input and weight (staging.py) whose channels are not whole 16-byte copies -- an RGB stem's 3 --
their copies hold zeros past the caller's channels, and the forward reads them as a problem of that
many channels (its products with the zeros are zeros)."""

from __future__ import annotations

import dataclasses
import math

from .igemm_tiles import vector_of
from .normal import Normal


def padded_channels(normal: Normal, staged: tuple[str, ...], itemsize: int) -> int:
    """The input channels the forward GEMM reads: the caller's, or, where the layout pass stages both its
    input and its weight (staging.py) and the channels (a single group) are not whole 16-byte copies,
    rounded up to them: both copies hold zeros in the channels past the caller's (the products they add
    are zeros), so that every tap's channels move by 16-byte copies -- an RGB stem's 3 channels as 8 of
    bf16/f16, 4 of f32 or f64, where they would be gathered element by element."""
    vector = vector_of(itemsize)
    if "X" in staged and "W" in staged and max(normal.groups, 1) == 1 and normal.channels % vector:
        padded = -(-normal.channels // vector) * vector
        # (an image of the copy, and the weight's, indexed in 32 bits as the caller's: igemm.refusal)
        if max(math.prod(normal.in_size), normal.filters * math.prod(normal.kernel)) * padded < 2**31:
            return padded
    return normal.channels


def padding_words(normal: Normal, staged: tuple[str, ...], itemsize: int) -> str:
    """How a staged copy's channels are padded, in the layout pass's words ("" where they are not)."""
    channels = padded_channels(normal, staged, itemsize)
    return f" with {channels} channels ({channels - normal.channels} of zeros)" if channels != normal.channels else ""


def forward_normal(normal: Normal, staged: tuple[str, ...], itemsize: int) -> Normal:
    """`normal` as the forward GEMM reads it: its input channels padded_channels."""
    channels = padded_channels(normal, staged, itemsize)
    return normal if channels == normal.channels else dataclasses.replace(normal, channels=channels)
