"""What every GPU kernel file's template context holds, once: who generated it for what (version,
problem, target, the vendor's wrappers inline, the entries' prefix), the normal convolution's
geometry, and for the families that read tensors through strides (igemm, depthwise, stem) the
tensors' sizes, layouts and strides, the weight gradient's split and the reasons. Each family's
context dataclass derives from these and adds its own decisions; templates read them all as
`c.<field>`. Also the checks every family's context makes of its prefix and entries.
"""

from __future__ import annotations

import dataclasses

from ..errors import ConvSpecError
from ..ir import ConvProblem, Layout
from ..render import operand_strides
from ..target import Target
from ..version import generator_version
from .normal import Normal
from .wrappers import vendor_wrappers

# the entries a GPU kernel file may define, one per user-level pass (see entry.py)
ENTRIES = ("fwd", "bwd_data", "bwd_weight", "bwd_weight_bias", "bwd_bias")


@dataclasses.dataclass(frozen=True)
class GpuContext:
    version: str
    problem_name: str
    problem_key: str
    target: str
    vendor: str
    wrappers: str          # the vendor's wrapper header, inline (the file is self-contained)
    prefix: str
    groups: int
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    pad: tuple[int, int, int]
    dilation: tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class TensorContext(GpuContext):
    scalar: str
    acc: str
    channels: int
    filters: int
    in_size: tuple[int, int, int]
    out_size: tuple[int, int, int]
    layouts: tuple[str, str, str]
    x_strides: tuple[int, ...]
    y_strides: tuple[int, ...]
    w_strides: tuple[int, ...]
    split: int
    why: tuple[str, ...]


def file_fields(problem: ConvProblem, target: Target, prefix: str, normal: Normal) -> dict:
    """GpuContext's fields for `problem` on `target`, entries named `prefix`_<entry>."""
    return dict(version=generator_version(), problem_name=problem.name(), problem_key=problem.kernel_key(),
                target=target.name(), vendor=target.kind.value, wrappers=vendor_wrappers(target.kind.value),
                prefix=prefix, groups=normal.groups, kernel=normal.kernel, stride=normal.stride, pad=normal.pad,
                dilation=normal.dilation)


def tensor_fields(normal: Normal) -> dict:
    """TensorContext's sizes, layouts and the caller's strides of X, Y and W."""
    g = normal.groups or 1
    return dict(channels=normal.channels, filters=normal.filters, in_size=normal.in_size, out_size=normal.out_size,
                layouts=tuple(layout.value for layout in normal.layouts),
                x_strides=operand_strides(normal.layouts[0], normal.channels, normal.in_size),
                y_strides=operand_strides(normal.layouts[2], normal.filters, normal.out_size),
                w_strides=operand_strides(normal.layouts[1], normal.channels // g, normal.kernel))


def check_prefix(prefix: str) -> None:
    if not prefix.isidentifier():
        raise ConvSpecError(f"prefix {prefix!r}: entry names must be C identifiers")


def check_entries(entries: tuple[str, ...], taken: tuple[str, ...] = ENTRIES) -> None:
    if not entries or any(e not in taken for e in entries):
        raise ConvSpecError(f"entries {list(entries)}: expected a non-empty subset of {list(taken)}")


def bias_rows(normal: Normal, transposed: bool, itemsize: int, warp: int) -> tuple[int, int, int]:
    """How a fused bias gradient reads its source (grad_output; a transposed problem's: the normal input)
    where a row's (image, pixel's) channels lie together, channels-last: (VEC, VW, VW1). VEC channels a
    load: one 16-byte load where the group's channels and the row are whole loads, else 1 (0: the source is
    not channels-last); a warp's VW lanes take VW runs of VEC of a row (64 bytes where the group has them),
    its other lanes other rows; VW1: the same for loads of one channel (the source not 16-byte aligned).
    Lanes along one channel's rows instead (as elsewhere) read a sector for every element."""
    channels = normal.channels if transposed else normal.filters
    if normal.layouts[0 if transposed else 2] is not Layout.CHANNELS_LAST:
        return 0, 0, 0
    group = channels // (normal.groups or 1)
    per_load = 16 // itemsize
    vec = per_load if group % per_load == 0 and channels % per_load == 0 else 1

    def lanes(runs: int, run_bytes: int) -> int:
        return 1 << (min(runs, max(1, 64 // run_bytes), warp).bit_length() - 1)
    return vec, lanes(-(-group // vec), vec * itemsize), lanes(group, itemsize)

