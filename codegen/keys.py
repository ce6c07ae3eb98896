"""Stable content keys: sha256 over a canonical JSON form (never Python's hash())."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json


_SCALARS = (int, bool, str, float, type(None))


def to_jsonable(value):
    """Dataclasses, enums, tuples and scalars to plain JSON values, deterministically."""
    kind = type(value)
    if kind in _SCALARS:   # (exact types first: the runtime keys a problem several times a call)
        return value
    if kind is tuple or kind is list:
        return [to_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in sorted(value.items())}
    return value


def canonical_json(value) -> str:
    return json.dumps(to_jsonable(value), sort_keys=True, separators=(",", ":"))


def sha256_text(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        data = p.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def canonical_key(value) -> str:
    return sha256_text(canonical_json(value))
