"""Every CPU kernel library exports its entry points and nothing else.

A kernel's helpers must have internal linkage (static, or in an unnamed namespace). One that does
not becomes a weak or a GNU unique symbol, shared across libraries: a unique symbol (a class
template's static data member, a static local of an inline function) is bound process-wide, so every
kernel loaded after the first reads the first one's (a grouplanes data gradient's tap tables did,
at -O1); and in an ahead-of-time bundle, which links many kernels into one library, the linker
keeps one of several same-named definitions. Both give wrong results without an error. Here one
kernel of every (kernel op, algorithm) of the CPU's template table, in the tiling modes that change
the template's code, is built for this host (at -O3, and at -O1, where less is folded into the
code) and its dynamic symbol table read with `nm`.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest

from convgen.building import build
from convgen.codegen.cpu.families import TEMPLATES
from convgen.codegen.emit import emit
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import Target, cpu_target, host_cpu

from support.problems import conv_problem


def _layer(op, c, k, size, kernel, groups=1, stride=1, layout=Layout.CONTIGUOUS, dtype=DType.F32) -> ConvProblem:
    """Two images, padded by half the kernel on each side, with a bias whatever the op."""
    return conv_problem(2, c, k, size, kernel, stride, tuple(q // 2 for q in kernel), groups=groups, op=op,
                        dtype=dtype, layout=layout, bias=True)


def _problems():
    cl = Layout.CHANNELS_LAST
    for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT):
        yield _layer(op, 16, 32, (12, 12), (3, 3))                        # blocked, lanes, direct, gemm
        yield _layer(op, 16, 32, (12, 12), (3, 3), dtype=DType.BF16)      # bf16 pairs where the target has them
        yield _layer(op, 16, 32, (12, 12), (1, 1))                        # pointwise
        yield _layer(op, 8, 8, (12, 12), (3, 3), groups=8)                # depthwise (planes)
        yield _layer(op, 8, 8, (40, 100), (3, 3), groups=8)               # depthwise weight gradient over rows
        yield _layer(op, 8, 8, (12, 12), (3, 3), groups=8, stride=2)      # depthwise, strided
        yield _layer(op, 16, 16, (12, 12), (3, 3), groups=4, layout=cl)   # grouplanes (small groups)
        yield _layer(op, 8, 8, (12, 20), (3, 3), groups=8, layout=cl)     # grouplanes (one channel per group: sliding)
        yield _layer(op, 3, 3, (12, 20), (1, 5), groups=3, layout=cl)     # flat (few channels in channels last)
        yield _layer(op, 16, 16, (12, 12), (3, 3), groups=4)              # planes
        yield _layer(op, 32, 32, (12, 12), (3, 3), dtype=DType.BF16)      # amx where the target has it
    yield _layer(Op.BWD_BIAS, 16, 32, (12, 12), (3, 3))                   # reduce


@dataclasses.dataclass(frozen=True)
class AtO1(Target):
    """A target built at -O1 as well: what -O3 folds into the code (a table read at compile-time
    offsets) is emitted as a symbol at -O1, as in the tests' compiled-for-host code shapes."""

    @property
    def march_flags(self) -> tuple[str, ...]:
        return (*super().march_flags, "-O1")   # after the build's -O3: the last -O wins


def _targets():
    host = host_cpu()
    yield host
    yield AtO1(**{f.name: getattr(host, f.name) for f in dataclasses.fields(host)})
    if host.isa == "avx512" and not host.amx_bf16:   # AMX kernels, built for their C emulation
        yield cpu_target("avx512", host.l1_bytes, host.l2_bytes, bf16_dot=host.bf16_dot, amx_bf16=True)


def _sources():
    """One source per (target, kernel op, algorithm, tiling mode, one input channel per group or more)."""
    seen = {}
    for target in _targets():
        for problem in _problems():
            for algorithm in lower(problem, target).candidates:
                if target.amx_bf16 and not host_cpu().amx_bf16 and algorithm != "amx":
                    continue   # the AMX target is there for its own kernels only
                plan = lower(problem, target, algorithm=algorithm)
                mode = (type(target).__name__, target.name(), plan.kop, algorithm, plan.tiling.planes if plan.tiling else None,
                        plan.tiling.pairs if plan.tiling else None, plan.geometry.cin_g == 1)
                if mode not in seen and plan.algorithm != "empty":
                    seen[mode] = emit(plan)
    return seen


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm to read the libraries' symbols")
def test_kernels_export_only_their_entry_points():
    sources = _sources()
    covered = {(kop, algorithm) for _, _, kop, algorithm, *_ in sources}
    missing = {(kop, algorithm) for kop, algorithm in TEMPLATES if (kop, algorithm) not in covered}
    # AMX kernels need an AVX-512 target to be built here at all
    assert not {m for m in missing if m[1] != "amx" or host_cpu().isa == "avx512"}, f"not built: {sorted(missing)}"
    libraries = build.build_many(list(sources.values()))
    for source, library in zip(sources.values(), libraries):
        out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
        symbols = {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
        expected = {source.entry, f"{source.entry}_pool", f"{source.entry}_use_pool"}
        assert symbols == expected, f"{source.name} exports {sorted(symbols - expected)}"
