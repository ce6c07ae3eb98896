"""The CPU: kernels as C functions in shared libraries, loaded with ctypes and called on the data
pointers of CPU tensors.

`Kernel` wraps one extern "C" entry point, from a JIT-built artifact (its path in the kernel
cache) or from an address inside an imported ahead-of-time bundle; `bind` fixes everything of a
call but the tensors, for callers that repeat a call signature (api/ops.py's Forward).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Callable, Container, Mapping, Sequence

import torch

from .. import knobs
from ..codegen.errors import BuildError, ConvgenError
from ..codegen.source import KernelSource
from ..codegen.target import TargetKind
from ..stats import bump

_CTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "i32": ctypes.c_int, "stream": ctypes.c_void_p}


def load_entry(source: KernelSource, path: Path, what: str, library=None):
    """(library, entry) of `source` in the shared library at `path` (or in `library`, already
    loaded), typed from the source's signature; a BuildError naming `what` when it cannot load."""
    try:
        lib = library if library is not None else ctypes.CDLL(str(path))
        fn = getattr(lib, source.entry)
    except (OSError, AttributeError) as e:
        raise BuildError(f"kernel {source.name}: {what} {path} could not be loaded ({e}); "
                         f"run `convgen cache verify` or remove it and retry") from e
    fn.argtypes = [_CTYPES[kind] for kind, _ in source.signature]
    fn.restype = ctypes.c_int
    return lib, fn


# The process's pool of large kernel buffers (templates/cpu/common.h.j2): every CPU kernel library
# carries one; the first library loaded that has one serves every kernel (it is never unloaded).
_pool: tuple[ctypes.CDLL, int, int] | None = None
_pool_lock = threading.Lock()


def share_pool(library: ctypes.CDLL, entry: str) -> bool:
    """Point kernel `entry` of `library` at the process's pool of large buffers (the copies, packs
    and partial sums of a call, kept for the next call instead of coming back as fresh pages), with
    a budget of CONVGEN_SCRATCH_MB; False where the kernel predates the pool or the budget is 0
    (it then allocates and frees its buffers every call)."""
    global _pool
    own, use = getattr(library, f"{entry}_pool", None), getattr(library, f"{entry}_use_pool", None)
    budget = knobs.scratch_mb() << 20
    if own is None or use is None or not budget:
        return False
    with _pool_lock:
        if _pool is None:
            take, give = ctypes.c_void_p(), ctypes.c_void_p()
            own.argtypes, own.restype = [ctypes.POINTER(ctypes.c_void_p)] * 2, None
            own(ctypes.byref(take), ctypes.byref(give))
            _pool = (library, take.value, give.value)
        use.argtypes, use.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64], None
        use(_pool[1], _pool[2], budget)
    return True


# Outputs of this many bytes or more get transparent huge pages where Linux offers them on request
# (`/sys/kernel/mm/transparent_hugepage/enabled` = madvise, a common default). glibc serves such a block
# from a fresh mmap and unmaps it when freed (32 MiB is its largest mmap threshold), so every call
# pays a page fault per 4 KB of its output on first touch: 9400 faults, 7-9 ms of a 16 ms data gradient
# for a 38.5 MB output on a KVM guest; with 2 MB pages, 19. Smaller blocks come back from malloc's
# heap already mapped, and are left alone (advice there would only split the heap's mapping).
HUGE_OUTPUT_BYTES = 32 << 20
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
try:
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes, _madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
except (OSError, AttributeError):   # not Linux/glibc: no advice
    _madvise = None


def advise_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """Ask for huge pages under the whole 2 MB pages of a large, fresh CPU tensor before it is first
    written (a hint: refused or unsupported advice changes nothing but the time); returns `t`."""
    nbytes = t.numel() * t.element_size()
    if nbytes >= HUGE_OUTPUT_BYTES and _madvise is not None and t.is_cpu:
        start = t.data_ptr()
        begin, end = (start + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1), (start + nbytes) & ~(_HUGE_PAGE - 1)
        if end > begin:
            _madvise(begin, end - begin, _MADV_HUGEPAGE)
    return t


class Kernel:
    """A loaded kernel entry: call it with tensors by role, the batch size and a thread count.

    It comes from a JIT-built shared library at `path`, or (served) from an entry address
    inside an imported ahead-of-time bundle (`served`: a dispatch.bundle.Served).
    """

    def __init__(self, source: KernelSource, path: Path | None, *, served=None):
        self.source = source
        self.path = path
        if served is not None:
            self._owner = served.owner  # keeps the bundle's module alive
            prototype = ctypes.CFUNCTYPE(ctypes.c_int, *(_CTYPES[kind] for kind, _ in source.signature))
            self._fn = prototype(served.address)   # as ctypes.CDLL would give it
            library = served.owner.library()
            if library is not None:
                share_pool(library, source.entry)
            return
        self._lib, self._fn = load_entry(source, path, "the artifact")
        share_pool(self._lib, source.entry)

    @property
    def address(self) -> int:
        """The entry point's address (for the eager launcher, which calls it from C++)."""
        return ctypes.cast(self._fn, ctypes.c_void_p).value

    def __call__(self, tensors: Mapping[str, torch.Tensor | None], n: int, nthreads: int) -> None:
        roles = [name for kind, name in self.source.signature if kind == "ptr"]
        live = [name for name in roles if tensors.get(name) is not None and tensors[name].numel()]
        self.bind(roles, live, n, nthreads)(*(tensors.get(name) for name in roles))

    def bind(self, roles: Sequence[str], live: Container[str], n: int, nthreads: int) -> Callable[..., None]:
        """This kernel as a function of tensors given in the order of `roles`, for calls that share
        everything but the data: the `live` roles have elements (the others are passed as NULL,
        and may be given as None), the batch size is `n`, the thread count `nthreads`."""
        fn, name = self._fn, self.source.name
        slots = tuple(roles.index(role) if role in live else None
                      for kind, role in self.source.signature if kind == "ptr")
        ints = tuple(n if role == "n" else nthreads for kind, role in self.source.signature if kind != "ptr")

        def run(*tensors) -> None:
            status = fn(*[None if i is None else tensors[i].data_ptr() for i in slots], *ints)
            if status == 2:
                raise RuntimeError(f"kernel {name}: the operating system refused this process the AMX tile state "
                                   f"(arch_prctl ARCH_REQ_XCOMP_PERM, a Linux 5.16+ kernel is needed); set "
                                   f"CONVGEN_AMX=0 to generate bf16 kernels without AMX")
            if status != 0:
                raise MemoryError(f"kernel {name}: could not allocate its per-thread scratch memory")
        return run


class GenericKernel:
    """A problem served by the shape-generic tier (codegen/cpu/generic.py): the generic library's
    entry of the problem's kernel op, called with the problem's size array. Called like a Kernel.
    Each call counts; the `hot_after`-th call of this problem calls `on_hot` once (the tiers' cue to
    build its specialised kernel in the background)."""

    def __init__(self, library: Kernel, roles: Mapping[str, str], sizes: Sequence[int], *, hot_after: int = 0,
                 on_hot: Callable[[], None] | None = None, counter: str = "generic_calls"):
        self.source, self.path, self._library = library.source, library.path, library
        self._counter = counter     # generic_calls, or layer_calls for a layer's kernel
        # a GPU library (a device's, or the simulator's: codegen/gpu/generic.py) is called through its
        # own bind, the size array as one more pointer (host memory: the entry reads it before launching)
        self._gpu = library.source.target.kind is not TargetKind.CPU
        self._fn = None if self._gpu else library._fn
        self._sizes = None if self._gpu else (ctypes.c_int64 * len(sizes))(*sizes)   # the CPU entry's
        self._sizes_tensor = torch.tensor(sizes, dtype=torch.int64) if self._gpu else None   # a GPU library's
        self._roles = tuple(roles.get(kind) for kind in ("X", "W", "Y", "B"))   # the entry's operands by kind
        self.calls = 0
        self._hot_after, self._on_hot = hot_after, on_hot

    def _count(self) -> None:
        self.calls += 1
        bump(self._counter)
        if self.calls == self._hot_after and self._on_hot is not None:
            self._on_hot()

    def __call__(self, tensors: Mapping[str, torch.Tensor | None], n: int, nthreads: int) -> None:
        live = [role for role in self._roles if role is not None and tensors.get(role) is not None
                and tensors[role].numel()]
        self.bind(self._roles, live, n, nthreads)(*(tensors.get(role) if role else None for role in self._roles))

    def bind(self, roles: Sequence[str], live: Container[str], n: int, nthreads: int) -> Callable[..., None]:
        """As Kernel.bind: a function of the tensors in the order of `roles`."""
        slots = tuple(roles.index(role) if role is not None and role in live else None for role in self._roles)
        if self._gpu:
            kinds = ("X", "W", "Y", "B")
            inner = self._library.bind((*kinds, "sizes"), [k for k, i in zip(kinds, slots) if i is not None] + ["sizes"],
                                       n, nthreads)
            sizes_tensor = self._sizes_tensor

            def run_gpu(*tensors) -> None:
                self._count()
                inner(*[None if i is None else tensors[i] for i in slots], sizes_tensor)
            return run_gpu
        fn, name, sizes = self._fn, self.source.name, ctypes.addressof(self._sizes)

        def run(*tensors) -> None:
            self._count()
            failed = fn(*[None if i is None else tensors[i].data_ptr() for i in slots], sizes, n, nthreads)
            if failed == 2:
                raise ConvgenError(f"kernel {name}: the problem's sizes are another layer's (its groups, channels, "
                                   f"taps, strides, padding or dilation differ from the constants it was built with)")
            if failed:
                raise MemoryError(f"kernel {name}: could not allocate its per-thread scratch memory")
        return run
