"""convgen: generated convolution kernels, forward and backward, as a drop-in for torch's.

Public API (a contract): conv1d/2d/3d, conv_transpose1d/2d/3d, convolution, convolution_backward,
nn (modules), convert, stats, and the errors ConvgenError, ConvSpecError, BuildError, CacheError.
A whole model: enabled() (a context manager), enable(), disable(), is_enabled() serve torch's own
aten convolutions (runtime/api/serve_aten.py).
Ahead of time: collect (a model's problems), load_bundle (kernels built by `convgen aot`).
Importing convgen builds nothing and reads no settings.

Where things live (runtime/README.md has the map): one subpackage per concern, importing only
the ones after it in this list: cli (the command line), bench (against torch), aot (making
bundles), api (functions, registered ops, autograd, enabled()), dispatch (call -> problem ->
kernel), devices (loading and launching per device), building (builds and the cache); then
knobs.py (settings) and stats.py (counters). tests/test_layout.py checks the direction.
"""

from .codegen.errors import BuildError, CacheError, ConvgenError, ConvSpecError
from .codegen.version import generator_version as _version
from .api.functional import (conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d,
                             convolution, convolution_backward)
from .api import library   # registers torch.ops.convgen.convolution and convolution_backward
from .stats import stats
from . import nn
from .nn import convert
from .api.shapes import collect
from .dispatch.bundle import load_bundle
from .api.serve_aten import disable, enable, enabled, is_enabled
from .devices.sim import profiling as sim_profile
from .dispatch.tiers import wait as wait_builds

__version__ = _version()

__all__ = [
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution",
    "convolution_backward", "nn", "convert", "enabled", "enable", "disable", "is_enabled", "stats", "collect", "load_bundle", "sim_profile", "wait_builds", "ConvgenError", "ConvSpecError", "BuildError", "CacheError",
]
