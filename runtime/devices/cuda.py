"""A torch CUDA device: which target serves it, and its kernels loaded and launched on its memory.

`target_of(device)` maps a torch 'cuda' device to a convgen target: on an NVIDIA build of torch
its compute capability (`torch.cuda.get_device_capability`, (8, 0) -> cuda-sm_80; (9, 0) -> cuda-sm_90a,
the arch-specific kernels measured faster there: codegen/arch/gpu.py DEVICE_DEFAULT); on a ROCm
build (`torch.version.hip` set; the device is still 'cuda') its `gcnArchName` (devices/hip.py,
'gfx90a:sramecc+:xnack-' -> hip-gfx90a). An arch with no target is a ConvgenError naming the
device, its arch and the targets there are. Known per device index after the first call.

`GpuKernel` is dispatch's kernel for a plan built by the vendor's compiler into a loadable
library (building/gpu_library.py), or served by an ahead-of-time bundle's fat library: its
`extern "C"` plan entry takes the pointers by role, the run-time batch size and a stream, and
is called on torch's current stream of the tensors' device (`torch.cuda.current_stream()`),
without synchronising: like any torch CUDA op, the results are ready in stream order. A
non-zero status is the vendor's error code: out of memory (a workspace -- split-K partials, staged
channels-last copies -- comes from torch's caching allocator, which the kernel's loading hands to
the plan entry, or from its stream-ordered cudaMallocAsync / hipMallocAsync where the entry has no
`<entry>_set_allocator`) empties torch's caching allocator and retries once, then raises
torch.OutOfMemoryError; any other status raises ConvgenError with the code.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable, Container, Sequence

import torch

from ..codegen.errors import ConvgenError
from ..codegen.arch.gpu import GPU_ARCHS, WHY_NOT, device_default, supported
from ..codegen.source import KernelSource
from ..codegen.target import Target, parse_target
from . import hip
from .. import knobs
from .cpu import Kernel, load_entry

OUT_OF_MEMORY = 2   # cudaErrorMemoryAllocation and hipErrorOutOfMemory alike

_targets: dict[tuple[int, str], Target] = {}   # (device index, CONVGEN_GPU_ARCH) -> target


def arch_of(device: torch.device) -> tuple[str, str]:
    """(vendor, arch) of a torch 'cuda' device: ("cuda", "sm_90") or, on ROCm, ("hip", "gfx90a")."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if torch.version.hip:
        return "hip", hip.arch_name(torch.cuda.get_device_properties(index).gcnArchName)
    major, minor = torch.cuda.get_device_capability(index)
    return "cuda", f"sm_{major}{minor}"


def runs_on(arch: str, device_arch: str) -> bool:
    """Whether machine code built for `arch` runs on a device whose own arch is `device_arch`:
    NVIDIA's within one major version, up to the device's minor (sm_80 code on sm_86), an
    arch-specific one ('a': sm_90a) on that very arch only; AMD's on its own gfx only."""
    if not (arch.startswith("sm_") and device_arch.startswith("sm_")):
        return arch == device_arch
    code, own = arch.removeprefix("sm_"), device_arch.removeprefix("sm_")
    if code.endswith("a"):
        return code[:-1] == own.rstrip("a")
    return code[:-1] == own[:-1] and int(code[-1]) <= int(own.rstrip("a")[-1])


def target_of(device: torch.device) -> Target:
    """The target whose kernels serve `device`: its own arch's (DEVICE_DEFAULT's where an arch-specific one
    measured faster: sm_90a on sm_90), or CONVGEN_GPU_ARCH's (knobs.gpu_arch) where that arch's machine
    code runs on the device; ConvgenError when its arch has none."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    chosen = knobs.gpu_arch()
    known = _targets.get((index, chosen))
    if known is not None:
        return known
    vendor, arch = arch_of(torch.device("cuda", index))
    if chosen:
        if chosen not in GPU_ARCHS or GPU_ARCHS[chosen].vendor != vendor or not runs_on(chosen, arch):
            runnable = [a.arch for a in GPU_ARCHS.values() if a.vendor == vendor and runs_on(a.arch, arch)]
            runs = ", ".join(runnable) or "none of convgen's archs"
            raise ConvgenError(f"CONVGEN_GPU_ARCH={chosen!r}: device cuda:{index} is {vendor} arch {arch}, which "
                               f"runs the machine code of {runs}; set one of those, or unset it for the device's "
                               f"own arch")
        arch = chosen
    else:
        arch = device_default(arch)   # sm_90 -> sm_90a: measured faster there
    if arch not in GPU_ARCHS or GPU_ARCHS[arch].vendor != vendor:
        why = WHY_NOT.get(arch)
        raise ConvgenError(f"device cuda:{index} is {vendor} arch {arch}, for which convgen has no target"
                           f"{f' ({why})' if why else ''}; convgen's {vendor} targets are "
                           f"{', '.join(supported(vendor))}. Use torch's own convolution on this device "
                           f"(torch.nn.functional.conv*), or move the tensors to the CPU")
    target = _targets[index, chosen] = parse_target(f"{vendor}-{arch}")
    return target


def forget_targets() -> None:
    """Forget the device -> target memo (tests that fake a device's properties)."""
    _targets.clear()


def _raw_stream(index: int) -> int:
    """torch's current stream of device `index`, as the handle the plan entry takes."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)   # what torch's own generated code calls
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


# Workspaces from torch's caching allocator: the plan entry asks `alloc(bytes, stream)` and gives the
# block back with `release(pointer, stream)` right after queueing the launches that use it, on the
# same stream -- as torch's own temporaries, so the block is reused only behind those launches.
_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p)
_RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


@_ALLOC
def _torch_alloc(nbytes: int, stream: int | None) -> int | None:
    try:
        return torch.cuda.caching_allocator_alloc(nbytes, stream=stream or 0)
    except Exception:   # torch.OutOfMemoryError and the like: null, the entry's out-of-memory status
        return None


@_RELEASE
def _torch_release(pointer: int | None, stream: int | None) -> None:
    if pointer:
        torch.cuda.caching_allocator_delete(pointer)


def use_torch_allocator(library: ctypes.CDLL, entry: str) -> bool:
    """Point the plan entry's workspaces at torch's caching allocator (`<entry>_set_allocator`,
    codegen/gpu/entry.py); False for an entry without one (no workspace, or a bundle built before it)."""
    setter = getattr(library, f"{entry}_set_allocator", None)
    if setter is None:
        return False
    setter.argtypes, setter.restype = [ctypes.c_void_p, ctypes.c_void_p], None
    setter(ctypes.cast(_torch_alloc, ctypes.c_void_p), ctypes.cast(_torch_release, ctypes.c_void_p))
    return True


class GpuKernel(Kernel):
    """A GPU plan entry loaded with ctypes from a library built for the device's arch (`path`),
    or from an ahead-of-time bundle's fat library (`library`: an already loaded ctypes.CDLL)."""

    def __init__(self, source: KernelSource, path: Path | None, *, library: ctypes.CDLL | None = None):
        self.source = source
        self.path = path
        self._lib, self._fn = load_entry(source, path, "the GPU library", library)
        use_torch_allocator(self._lib, source.entry)

    @property
    def address(self) -> int:
        raise ConvgenError(f"kernel {self.source.name} is a GPU kernel: the eager launcher does not call it")

    def bind(self, roles: Sequence[str], live: Container[str], n: int, nthreads: int) -> Callable[..., None]:
        """As Kernel.bind; the call goes on torch's current stream of the first live tensor's
        device (`nthreads` has no meaning on a GPU)."""
        fn, source = self._fn, self.source
        slots = tuple(roles.index(role) if role in live else None
                      for kind, role in source.signature if kind == "ptr")
        first = next((i for i in slots if i is not None), None)
        batch = ctypes.c_int64(n)

        def run(*tensors) -> None:
            index = tensors[first].device.index if first is not None else torch.cuda.current_device()
            if index != torch.cuda.current_device():   # the launch goes to the current device's context
                with torch.cuda.device(index):
                    return run(*tensors)
            pointers = [None if i is None else tensors[i].data_ptr() for i in slots]
            status = fn(*pointers, batch, _raw_stream(index))
            if status == OUT_OF_MEMORY:   # the workspace: give back torch's cached blocks, once
                torch.cuda.empty_cache()
                status = fn(*pointers, batch, _raw_stream(index))
            if status != 0:
                _raise(source, status, index)
        return run


# CUDA runtime codes worth a sentence (cudaError_t): what they mean for a convgen kernel
_CUDA_HINTS = {
    35: "the driver is older than the CUDA toolkit that built the kernel (its cudart is linked statically): "
        "set CONVGEN_NVCC to the nvcc of a toolkit this driver runs, or update the driver",
    209: "the library has no machine code for this device's arch",
    222: "the driver cannot run the PTX of this toolkit: update the driver or build with an older nvcc",
}


def _raise(source: KernelSource, status: int, index: int) -> None:
    vendor = source.target.kind.value
    if status == OUT_OF_MEMORY:
        raise torch.OutOfMemoryError(f"convgen kernel {source.name} on cuda:{index}: out of memory for its "
                                     f"workspace ({vendor} error {status}) after emptying torch's cache")
    hint = _CUDA_HINTS.get(status) if vendor == "cuda" else None
    raise ConvgenError(f"convgen kernel {source.name} on cuda:{index} ({source.target.name()}): launch failed "
                       f"with {vendor} error {status}{f': {hint}' if hint else ''}")
