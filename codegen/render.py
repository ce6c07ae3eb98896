"""Rendering, the compiler's floor under the kernel families: the one strict Jinja environment
every template is rendered in, and the element strides of an operand in a memory layout, which
CPU and GPU contexts alike hand to their templates."""

from __future__ import annotations

import functools
import importlib.resources

import jinja2

from .ir import Layout


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    root = importlib.resources.files("convgen.templates")
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                              autoescape=False)


def render(template: str, **context) -> str:
    """The text of `template` (a path under templates/) rendered with `context`."""
    return environment().get_template(template).render(**context)


def operand_strides(layout: Layout, channels: int, size: tuple[int, int, int]) -> tuple[int, ...]:
    """Element strides (batch, channel, d, h, w) of an activation or weight in `layout`."""
    d, h, w = size
    if layout is Layout.CHANNELS_LAST:
        return (d * h * w * channels, 1, h * w * channels, w * channels, channels)
    return (channels * d * h * w, d * h * w, h * w, w, 1)
