"""The per-vendor wrapper headers (templates/gpu/cuda.h, hip.h) as text to inline into a kernel
file, so that every generated GPU file is self-contained: nvcc and hipcc compile it with no -I,
and the SIMT simulator compiles the very same text (under -DCONVGEN_SIM the wrapper includes the
simulator instead of the vendor runtime). Each is wrapped in an include guard, so a file may
inline it more than once.
"""

from __future__ import annotations

import functools
import importlib.resources

from ..errors import ConvgenError

VENDORS = ("cuda", "hip")


@functools.lru_cache(maxsize=None)
def vendor_wrappers(vendor: str) -> str:
    """templates/gpu/<vendor>.h without its `#pragma once`, inside an include guard."""
    if vendor not in VENDORS:
        raise ConvgenError(f"GPU vendor {vendor!r}: expected one of {', '.join(VENDORS)}")
    text = (importlib.resources.files("convgen.templates") / "gpu" / f"{vendor}.h").read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if line.strip() != "#pragma once")
    guard = f"CONVGEN_{vendor.upper()}_WRAPPERS_"
    return f"// ---- templates/gpu/{vendor}.h, inline\n#ifndef {guard}\n#define {guard}\n{body}\n#endif  // {guard}\n"
