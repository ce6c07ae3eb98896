"""The generator's version, part of every generated header and every cache key."""

import functools
from importlib import metadata


@functools.lru_cache(maxsize=1)
def generator_version() -> str:
    try:
        return metadata.version("convgen")
    except metadata.PackageNotFoundError:
        return "0.1.0"
