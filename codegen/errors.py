"""The error hierarchy shared by the compiler and the runtime.

Every message names the parameter, the values and the rule that was broken, and where it can,
what to do about it.
"""


class ConvgenError(Exception):
    """Base class of every error convgen raises on purpose."""


class ConvSpecError(ConvgenError, ValueError):
    """A convolution's arguments break a rule (shape, stride, padding, groups, ...)."""


class BuildError(ConvgenError):
    """A generated kernel failed to build, or the build tools are missing."""


class CacheError(ConvgenError):
    """The kernel cache cannot be used (directory, lock or artifact trouble)."""


class SimulatorError(ConvgenError):
    """A kernel broke the GPU execution model in the SIMT simulator (a barrier reached by only
    some threads, a divergent warp collective, a bad mask): the message names the kernel, the
    block, the threads and the call sites."""
