"""The SIMT simulator as a device: GPU kernels built for it (building/sim_build.py) run on the
CPU's memory, loaded with ctypes.

`SimLibrary` calls a launch entry with the order and seed of knobs and turns a simulator failure
into a `SimulatorError`: a failing kernel returns a non-zero status from its launch entry and the
library's `convgen_sim_error()` holds the message, so the calling process never dies (a wild
memory access still can: build with `sanitize=True`, or run in a subprocess, for those).
`SimKernel` is dispatch's kernel for a GPU plan under CONVGEN_SIM (called like a CPU Kernel);
`build` writes, builds and loads a source in one step (tests and experiments, outside the cache).
"""

from __future__ import annotations

import ctypes
import shlex
import subprocess
from pathlib import Path
from typing import Callable, Container, Sequence

from .. import knobs
from ..building.sim_build import compile_command
from ..codegen.errors import BuildError, ConvgenError, SimulatorError
from ..codegen.source import KernelSource
from ..stats import bump
from .cpu import Kernel


class SimLibrary:
    """A library built for the simulator; `call` runs one of its extern "C" launch entries."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.convgen_sim_error.restype = ctypes.c_char_p
        self.lib.convgen_sim_configure.argtypes = [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_int]
        self.lib.convgen_sim_launches.restype = ctypes.c_ulonglong
        self.warp_size = self.lib.convgen_sim_warp_size()

    def launches(self) -> int:
        return self.lib.convgen_sim_launches()

    def call(self, entry: str, *args, order: str | None = None, seed: int | None = None, workers: int = 0) -> None:
        """Run launch entry `entry` (returns int status) with ctypes `args`, in the order and seed
        of knobs (or those given); raise SimulatorError with the simulator's message on failure."""
        order = order or knobs.sim_order()
        if order not in knobs.SIM_ORDERS:
            raise ConvgenError(f"simulator order {order!r}: expected one of {', '.join(knobs.SIM_ORDERS)}")
        seed = knobs.sim_seed() if seed is None else seed
        self.lib.convgen_sim_configure(knobs.SIM_ORDERS.index(order), seed, workers)
        fn = getattr(self.lib, entry)
        fn.restype = ctypes.c_int
        status = fn(*args)
        if status != 0:
            message = self.lib.convgen_sim_error().decode("utf-8", "replace")
            raise SimulatorError(f"{self.path.name}: {entry}: {message or f'launch status {status}'}")


def build(source: str, directory: Path, name: str, vendor: str, *, sanitize: bool = False,
          pch: Path | None = None) -> SimLibrary:
    """Write `source` to directory/name.cu, build it for the simulator and load it; with `pch` (a
    directory from building/sim_build.py's precompiled_header for `vendor`) as the runtime builds
    do: the kernel file alone, the simulator's own functions linked from there."""
    directory.mkdir(parents=True, exist_ok=True)
    src, out = directory / f"{name}.cu", directory / f"{name}.{vendor}.so"
    src.write_text(source)
    command = compile_command(str(src), str(out), vendor, sanitize=sanitize, pch=pch, split=pch is not None)
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise BuildError(f"the host compiler {command[0]!r} was not found; set CXX") from None
    if done.returncode != 0:
        raise BuildError(f"simulator build of {src} failed (exit {done.returncode})\n"
                         f"command: {shlex.join(command)}\n{done.stdout}{done.stderr}")
    return SimLibrary(out)


def pointer(array) -> ctypes.c_void_p:
    """A numpy array's or CPU torch tensor's data pointer for a launch entry."""
    address = array.data_ptr() if hasattr(array, "data_ptr") else array.ctypes.data
    return ctypes.c_void_p(address)


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
            try:
                library.call(entry, *[ctypes.c_void_p(None if i is None else tensors[i].data_ptr()) for i in slots],
                             ctypes.c_int64(n), ctypes.c_void_p(None))
            finally:
                bump("sim_launches", library.launches() - before)
        return run
