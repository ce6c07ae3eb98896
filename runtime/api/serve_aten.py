"""convgen serving torch's own convolutions: `enabled()`, `enable()`, `disable()`, `is_enabled()`.

Inside `with convgen.enabled():` every `aten.convolution` and `aten.convolution_backward` that
torch dispatches on the CPU (nn modules, `torch.nn.functional.conv*`, third-party models,
compiled and exported graphs when they run) is computed by convgen's generated kernels, while
torch keeps doing the rest: autograd records torch's own ConvolutionBackward node (whose backward
calls `aten.convolution_backward`, served too), torch.compile and torch.export trace
`aten.convolution` as usual with its meta kernel, and DDP, hooks and checkpointing see nothing
different. Outside, torch computes.

The supported devices of `enabled()` are the CPU's, by decision: CUDA tensors inside the block
keep torch's cuDNN/MIOpen kernels. Registering an aten CUDA kernel would replace cuDNN for every
convolution of the process while a block is open, and convgen's GPU kernels have not yet run on
a real device or been timed against cuDNN (README, GPU section). On CUDA tensors convgen is asked
for explicitly: `convgen.conv2d(x.cuda(), w.cuda())`, `convgen.nn`, `convgen.convert(model)`.

How: while convgen may serve (`enable()` is in force or some thread is inside an `enabled()`
block), one `torch.library.Library("aten", "IMPL")` registers CPU kernels for the two ops. ATen's
own kernels for them are registered under the CompositeExplicitAutograd alias key, which a CPU
registration shadows without removing; each registered kernel decides per call:

- serving (see below): runtime/api/ops.py's `convolution` / `convolution_backward`, the same kernels
  as `convgen.convolution`, below autograd (no autograd node of convgen's own);
- otherwise (another thread's block keeps the registration alive): ATen's kernel, called by its
  CompositeExplicitAutograd entry (`_op_dk`), which is exactly what torch runs without the
  registration, after one Python hop. A call convgen does not take (a dtype it has no kernels
  for, an argument its rules refuse) is also left to ATen, which computes it or raises its own
  error; `stats()["aten_fallbacks"]` counts those.

The registration is withdrawn when the last block closes (and `enable()` is not in force), so
torch's calls outside cost what they cost before, but only while this is the process's only
Python thread: torch's dispatcher does not expect kernels to change while other threads may be
dispatching, so with several threads alive it stays until a later last block closes
single-threaded, and torch's calls outside a block take the hop. Registering and withdrawing
cost about 25 µs, once per outermost block.

`stats()["aten_forward"]` and `["aten_backward"]` count the calls convgen served.

Threads: `enable()` / `disable()` set the process-wide default, which every thread follows
outside a block; `with enabled(on)` sets the state of the calling thread only, for the block
(like `torch.no_grad()`), and restores that thread's previous state on exit, also when the block
raises; blocks nest. A thread started inside a block follows the default, not the block.
torch runs CPU backward passes on the thread that calls `backward()`, so a `backward()` inside
the block is served. A block written inside a torch.compile'd function is a graph break (it
changes state at run time; fullgraph=True refuses it): enter it around the compiled call.
convgen's own calls of ATen that must stay torch's (`collect`, which lets
torch compute, and `bench`'s torch side and float64 reference) run under `enabled(False)`.
"""

from __future__ import annotations

import threading

import torch

from . import ops
from ..codegen.errors import ConvSpecError
from ..stats import bump

_ENTRY = torch._C.DispatchKey.CompositeExplicitAutograd
_CONVOLUTION = torch.ops.aten.convolution.default
_CONVOLUTION_BACKWARD = torch.ops.aten.convolution_backward.default

_default = False                 # enable() / disable()
_active = 0                      # open on-blocks in all threads, plus 1 while enable() is in force
_local = threading.local()       # .state: None outside any block, else the innermost block's on/off;
                                 # .saved: the states the thread's open blocks replaced
_library: torch.library.Library | None = None
_register_lock = threading.Lock()
_switch_lock = threading.Lock()   # enable() and disable(), each as one step


def is_enabled() -> bool:
    """Whether convgen serves the calling thread's aten convolutions right now."""
    state = getattr(_local, "state", None)
    return _default if state is None else state


# ---------------------------------------------------------------------------- the kernels


def _grad_mask(input, weight, bias):
    """The gradients autograd will ask for, so their kernels build with the forward's (one ninja
    run); None when nothing will be differentiated."""
    if not torch.is_grad_enabled():
        return None
    mask = (input.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
    return mask if any(mask) else None


def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    args = (stride, padding, dilation, transposed, output_padding, groups)
    if is_enabled():
        try:
            forward = ops.forward(input, weight, bias, *args, _grad_mask(input, weight, bias))
        except (ConvSpecError, NotImplementedError):
            bump("aten_fallbacks")
        else:
            bump("aten_forward")
            return forward.run(input, weight, bias)
    return _CONVOLUTION._op_dk(_ENTRY, input, weight, bias, *args)


def _convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    args = (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
            output_mask)
    if is_enabled():
        try:
            results = ops.convolution_backward(*args)
        except (ConvSpecError, NotImplementedError):
            bump("aten_fallbacks")
        else:
            bump("aten_backward")
            return results   # None where output_mask is off: an undefined tensor, as ATen's
    return _CONVOLUTION_BACKWARD._op_dk(_ENTRY, *args)


def _acquire() -> None:
    """One more reason to serve (an on-block, or enable()): the kernels are registered."""
    global _active, _library
    with _register_lock:
        _active += 1
        if _library is None:
            library = torch.library.Library("aten", "IMPL")
            library.impl("convolution", _convolution, "CPU")
            library.impl("convolution_backward", _convolution_backward, "CPU")
            _library = library


def _release() -> None:
    """One reason fewer; with none left, the kernels are withdrawn when no other thread runs."""
    global _active, _library
    with _register_lock:
        _active -= 1
        if _active == 0 and _library is not None and threading.active_count() == 1:
            _library._destroy()
            _library = None


def registered() -> bool:
    """Whether convgen's kernels are registered for aten's CPU convolutions right now."""
    return _library is not None


# ---------------------------------------------------------------------------- the switches


def enable() -> None:
    """Serve every thread's aten convolutions from now on (outside `enabled(False)` blocks)."""
    global _default
    with _switch_lock:
        if not _default:
            _acquire()
            _default = True


def disable() -> None:
    """Let torch compute every thread's convolutions from now on (outside `enabled()` blocks)."""
    global _default
    with _switch_lock:
        if _default:
            _default = False
            _release()


class enabled:
    """`with convgen.enabled():` convgen serves the calling thread's aten convolutions in the
    block; `enabled(False)` lets torch compute them in the block. The previous state of the
    thread comes back on exit, also when the block raises. Also a decorator."""

    __slots__ = ("on",)

    def __init__(self, on: bool = True):
        if not isinstance(on, bool):
            raise TypeError(f"convgen.enabled(on): on must be True or False, but got {on!r}")
        self.on = on

    def __enter__(self):
        if self.on:
            _acquire()
        saved = getattr(_local, "saved", None)
        if saved is None:
            saved = _local.saved = []
        saved.append(getattr(_local, "state", None))   # per thread, so one object may be entered anywhere
        _local.state = self.on
        return self

    def __exit__(self, *exc):
        _local.state = _local.saved.pop()
        if self.on:
            _release()
        return False

    def __call__(self, fn):
        import functools

        on = self.on

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with enabled(on):
                return fn(*args, **kwargs)
        return wrapper
