"""The SIMT simulator as a device: GPU kernels built for it (building/sim_build.py) run on the
CPU's memory, loaded with ctypes.

`SimLibrary` calls a launch entry with the order and seed of knobs and turns a simulator failure
into a `SimulatorError`: a failing kernel returns a non-zero status from its launch entry and the
library's `convgen_sim_error()` holds the message, so the calling process never dies. Before the
call it tells the library the buffers the entry is given (each tensor's storage extent, by role),
so that the simulator's checks (sim/checks.h: racecheck, memcheck, alignment, initcheck) name an
access outside them; the message's code locations come back as source lines (addr2line). With
`profile=True` the call also returns each launch's counters (bank conflicts, sectors, bytes, ...).
`SimKernel` is dispatch's kernel for a GPU plan under CONVGEN_SIM (called like a CPU Kernel);
`build` writes, builds and loads a source in one step (tests and experiments, outside the cache).
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import shlex
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Callable, Container, NamedTuple, Sequence

from .. import knobs
from ..building.sim_build import compile_command, gpu_templates_dir
from ..codegen.errors import BuildError, ConvgenError, SimulatorError
from ..codegen.source import KernelSource
from ..stats import bump
from .cpu import Kernel


_profiling = threading.local()


@contextlib.contextmanager
def profiling():
    """`with convgen.sim_profile() as launches:` every kernel launch the calling thread makes in the
    simulator inside the block is profiled; `launches` collects one dict per launch: "entry" (the
    plan entry), "kernel" and the counters of COUNTERS (sim/checks.h says what each counts)."""
    launches: list[dict] = []
    previous = getattr(_profiling, "launches", None)
    _profiling.launches = launches
    try:
        yield launches
    finally:
        _profiling.launches = previous


# A launch's profile counters, in the order convgen_sim_profile_get writes them (sim/simt.h).
COUNTERS = ("blocks", "barriers", "tensor_instructions", "shared_requests", "shared_wavefronts", "shared_ideal",
            "global_requests", "global_sectors", "bytes_read", "bytes_written", "store_requests", "store_sectors")


class Buffer(NamedTuple):
    """A memory range an entry is given: its name (the role), first byte, size and element size."""
    name: str
    base: int
    nbytes: int
    element: int


class BufferPointer(ctypes.c_void_p):
    """A launch entry's pointer argument that also says which buffer it points into (sim.pointer)."""
    buffer: Buffer | None = None


def extent(array, name: str) -> Buffer:
    """The memory a torch tensor (its storage) or numpy array (its bytes) owns, as a Buffer."""
    if hasattr(array, "untyped_storage"):
        storage = array.untyped_storage()
        return Buffer(name, storage.data_ptr(), storage.nbytes(), array.element_size())
    lo = hi = array.ctypes.data   # a numpy array: the bytes its view spans
    for size, stride in zip(array.shape, array.strides):
        if size == 0:
            return Buffer(name, lo, 0, array.itemsize)
        if stride < 0:
            lo += (size - 1) * stride
        else:
            hi += (size - 1) * stride
    return Buffer(name, lo, hi + array.itemsize - lo, array.itemsize)


class SimLibrary:
    """A library built for the simulator; `call` runs one of its extern "C" launch entries."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.convgen_sim_error.restype = ctypes.c_char_p
        self.lib.convgen_sim_configure.argtypes = [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_int]
        self.lib.convgen_sim_launches.restype = ctypes.c_ulonglong
        self.warp_size = self.lib.convgen_sim_warp_size()
        # libraries of an older convgen (a bundle refused by version anyway) have no checks
        self.checked = bool(getattr(self.lib, "convgen_sim_checked", lambda: 0)())
        if hasattr(self.lib, "convgen_sim_profile_get"):
            self.lib.convgen_sim_profile_get.restype = ctypes.c_char_p

    def launches(self) -> int:
        return self.lib.convgen_sim_launches()

    def _set_buffers(self, buffers: Sequence[Buffer] | None) -> None:
        """Tell the library the buffers of the next calls (none: global accesses unchecked)."""
        if not hasattr(self.lib, "convgen_sim_set_buffers"):
            return
        buffers = list(buffers or ())
        n = len(buffers)
        self.lib.convgen_sim_set_buffers(
            int(n > 0), n, (ctypes.c_char_p * n)(*[b.name.encode() for b in buffers]),
            (ctypes.c_ulonglong * n)(*[b.base for b in buffers]), (ctypes.c_ulonglong * n)(*[b.nbytes for b in buffers]),
            (ctypes.c_int * n)(*[b.element for b in buffers]))

    def call(self, entry: str, *args, order: str | None = None, seed: int | None = None, workers: int = 0,
             buffers: Sequence[Buffer] | None = None, profile: bool = False) -> list[dict]:
        """Run launch entry `entry` (returns int status) with ctypes `args`, in the order and seed
        of knobs (or those given); raise SimulatorError with the simulator's message on failure.
        `buffers`: every buffer the entry may touch (else those of the BufferPointer arguments when
        every pointer argument is one, else global accesses go unchecked). `profile`: returns one
        dict of counters per launch the entry made (else an empty list)."""
        order = order or knobs.sim_order()
        if order not in knobs.SIM_ORDERS:
            raise ConvgenError(f"simulator order {order!r}: expected one of {', '.join(knobs.SIM_ORDERS)}")
        seed = knobs.sim_seed() if seed is None else seed
        self.lib.convgen_sim_configure(knobs.SIM_ORDERS.index(order), seed, workers)
        if buffers is None:
            pointers = [a for a in args if isinstance(a, ctypes.c_void_p) and a.value]
            if pointers and all(isinstance(a, BufferPointer) and a.buffer for a in pointers):
                buffers = [a.buffer for a in pointers]
        self._set_buffers(buffers)
        if hasattr(self.lib, "convgen_sim_profile"):
            self.lib.convgen_sim_profile(int(profile))
        fn = getattr(self.lib, entry)
        fn.restype = ctypes.c_int
        try:
            status = fn(*args)
        finally:
            self._set_buffers(None)
        if status != 0:
            message = self.lib.convgen_sim_error().decode("utf-8", "replace")
            raise SimulatorError(f"{self.path.name}: {entry}: {source_lines(self.path, message) or f'launch status {status}'}")
        return self._profiles() if profile else []

    def _profiles(self) -> list[dict]:
        out = (ctypes.c_ulonglong * len(COUNTERS))()
        launches = []
        for i in range(self.lib.convgen_sim_profile_count()):
            kernel = self.lib.convgen_sim_profile_get(i, out).decode()
            launches.append({"kernel": kernel, **dict(zip(COUNTERS, out))})
        self.lib.convgen_sim_profile(0)
        return launches


def source_lines(library: Path, message: str) -> str:
    """`message` with its {pc 0x...} tokens (offsets into `library`) as file:line, read with
    addr2line from the library's line tables: the innermost frame outside the vendor wrappers and
    the simulator's headers (the kernel's own line); library+0x... where that cannot be read."""
    offsets = sorted(set(re.findall(r"\{pc (0x[0-9a-f]+)\}", message)))
    if not offsets:
        return message
    names = {o: f"{library.name}+{o}" for o in offsets}
    tool = shutil.which("addr2line")
    if tool:
        try:
            done = subprocess.run([tool, "-a", "-i", "-e", str(library), *offsets], capture_output=True, text=True,
                                  timeout=60)
            frames: dict[str, list[str]] = {}
            current = None
            for line in done.stdout.splitlines():
                if line.startswith("0x"):
                    current = f"{int(line, 16):#x}"
                    frames[current] = []
                elif current is not None and not line.startswith("??"):
                    frames[current].append(line.split(" (discriminator")[0])
            wrappers = str(gpu_templates_dir())
            for o in offsets:
                found = frames.get(f"{int(o, 16):#x}") or []
                own = [f for f in found if not f.startswith(wrappers)]
                if own or found:
                    names[o] = (own or found)[0]
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return re.sub(r"\{pc (0x[0-9a-f]+)\}", lambda m: names[m.group(1)], message)


def build(source: str, directory: Path, name: str, vendor: str, *, sanitize: bool = False,
          pch: Path | None = None, checks: bool = True, debug: bool = False) -> SimLibrary:
    """Write `source` to directory/name.cu, build it for the simulator and load it; with `pch` (a
    directory from building/sim_build.py's precompiled_header for `vendor`) as the runtime builds
    do: the kernel file alone, the simulator's own functions linked from there. checks=False
    leaves out the checks' instrumentation (to measure what it costs). Line tables only (-g1, as the
    runtime's builds: what the checks' messages name source lines from) unless `debug` (-g, full
    debug information: a quarter more compile time, 56 s against 40 s of CPU for the 100,000-line
    file of every case tests/gpu/test_igemm.py runs) or `sanitize`."""
    directory.mkdir(parents=True, exist_ok=True)
    src, out = directory / f"{name}.cu", directory / f"{name}.{vendor}.so"
    src.write_text(source)
    command = compile_command(str(src), str(out), vendor, sanitize=sanitize, pch=pch, split=pch is not None,
                              checks=checks, debug=debug)
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise BuildError(f"the host compiler {command[0]!r} was not found; set CXX") from None
    if done.returncode != 0:
        raise BuildError(f"simulator build of {src} failed (exit {done.returncode})\n"
                         f"command: {shlex.join(command)}\n{done.stdout}{done.stderr}")
    return SimLibrary(out)


def pointer(array, name: str | None = None) -> BufferPointer:
    """A numpy array's or CPU torch tensor's data pointer for a launch entry, which also tells the
    simulator's checks the buffer it points into (named `name`, else "buffer at 0x...")."""
    address = array.data_ptr() if hasattr(array, "data_ptr") else array.ctypes.data
    p = BufferPointer(address)
    p.buffer = extent(array, name or f"the buffer at {address:#x}")
    return p


class SimKernel(Kernel):
    """A GPU kernel's plan entry built for the SIMT simulator: called like a Kernel (pointers by
    role, the batch; a null stream), each call in the order of CONVGEN_SIM_ORDER/SEED, its
    launches counted in stats()["sim_launches"], a simulator failure raised as SimulatorError."""

    def __init__(self, source: KernelSource, path: Path):
        self.source = source
        self.path = path
        try:
            self._sim = SimLibrary(path)
            getattr(self._sim.lib, source.entry)
        except (OSError, AttributeError) as e:
            raise BuildError(f"kernel {source.name}: the simulator artifact {path} could not be loaded ({e}); "
                             f"run `convgen cache verify` or remove it and retry") from e

    @property
    def address(self) -> int:
        raise SimulatorError(f"kernel {self.source.name} runs in the simulator: it has no launcher address")

    def bind(self, roles: Sequence[str], live: Container[str], n: int, nthreads: int) -> Callable[..., None]:
        library, entry = self._sim, self.source.entry
        slots = tuple(roles.index(role) if role in live else None
                      for kind, role in self.source.signature if kind == "ptr")

        def run(*tensors) -> None:
            before = library.launches()
            buffers = [extent(tensors[i], roles[i]) for i in slots if i is not None]
            collector = getattr(_profiling, "launches", None)
            try:
                launches = library.call(entry, *[ctypes.c_void_p(None if i is None else tensors[i].data_ptr())
                                                 for i in slots],
                                        ctypes.c_int64(n), ctypes.c_void_p(None), buffers=buffers,
                                        profile=collector is not None)
            finally:
                bump("sim_launches", library.launches() - before)
            if collector is not None:
                collector.extend({"entry": self.source.name, **launch} for launch in launches)
        return run
