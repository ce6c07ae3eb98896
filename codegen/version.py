"""The generator's version, part of every generated header and every cache key."""

from importlib import metadata


def generator_version() -> str:
    try:
        return metadata.version("convgen")
    except metadata.PackageNotFoundError:
        return "0.1.0"
