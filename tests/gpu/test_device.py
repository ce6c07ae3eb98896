"""torch CUDA/ROCm tensors served by the kernels of their device's arch (runtime/devices/cuda.py).

Without a GPU (this machine) the tests prove what can be proven here: the arch -> target
mapping with faked device facts, the errors (meta and fake CUDA tensors), the fake kernels on
CUDA fake tensors, the launch path of GpuKernel against a stand-in library (pointers by role, the
batch, torch's current stream, the out-of-memory retry), that the CPU path's remembered calls
never reach device code, and that nvcc/hipcc build loadable libraries that export the plan entry.
The tests in the last section need a CUDA device and skip, saying so, where torch has none.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import types

import pytest
import torch

import convgen
from convgen.building import gpu_library
from convgen.codegen.emit import emit
from convgen.codegen.errors import ConvgenError, ConvSpecError
from convgen.codegen.pipeline import lower
from convgen.codegen.source import KernelSource
from convgen.codegen.target import parse_target
from convgen.devices import cuda as cuda_device
from convgen.dispatch.problem import base_problem

from support.reference import assert_close


# ------------------------------------------------------------------------ arch -> target


@pytest.fixture
def fake_device(monkeypatch):
    """Fakes torch's view of cuda:0; call it with capability=(9, 0) or gcn='gfx90a:sramecc+:xnack-'."""
    def fake(capability=None, gcn=None):
        cuda_device.forget_targets()
        monkeypatch.setattr(torch.version, "hip", "6.2.0" if gcn else None)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda index=None: types.SimpleNamespace(gcnArchName=gcn))
    yield fake
    cuda_device.forget_targets()


@pytest.mark.parametrize("capability, target", [((8, 0), "cuda-sm_80"), ((8, 6), "cuda-sm_86"),
                                                ((8, 9), "cuda-sm_89"), ((9, 0), "cuda-sm_90a")])
def test_an_nvidia_device_is_served_by_its_compute_capability(fake_device, capability, target):
    fake_device(capability=capability)
    assert cuda_device.target_of(torch.device("cuda", 0)).name() == target
    assert cuda_device.target_of(torch.device("cuda")).name() == target   # no index: the current device


@pytest.mark.parametrize("capability, chosen, target", [((9, 0), "sm_90a", "cuda-sm_90a"),
                                                     ((9, 0), "sm_90", "cuda-sm_90"),
                                                     ((8, 6), "sm_80", "cuda-sm_80"),
                                                     ((8, 9), "SM_86", "cuda-sm_86")])
def test_convgen_gpu_arch_picks_another_arch_the_device_runs(fake_device, monkeypatch, capability, chosen, target):
    fake_device(capability=capability)
    monkeypatch.setenv("CONVGEN_GPU_ARCH", chosen)
    assert cuda_device.target_of(torch.device("cuda", 0)).name() == target
    monkeypatch.delenv("CONVGEN_GPU_ARCH")   # read on every call: the device's own again (sm_90a on 9.0)
    own = f"sm_{capability[0]}{capability[1]}"
    assert cuda_device.target_of(torch.device("cuda", 0)).name() == f"cuda-{'sm_90a' if own == 'sm_90' else own}"


@pytest.mark.parametrize("capability, chosen, runnable", [((9, 0), "sm_80", "sm_90, sm_90a"),
                                                          ((8, 0), "sm_90a", "sm_80"),
                                                          ((8, 0), "sm_86", "sm_80"),
                                                          ((8, 6), "gfx90a", "sm_80, sm_86"),
                                                          ((9, 0), "sm_99", "sm_90, sm_90a")])
def test_convgen_gpu_arch_the_device_cannot_run_is_refused_naming_what_it_runs(fake_device, monkeypatch, capability,
                                                                             chosen, runnable):
    fake_device(capability=capability)
    monkeypatch.setenv("CONVGEN_GPU_ARCH", chosen)
    with pytest.raises(ConvgenError) as info:
        cuda_device.target_of(torch.device("cuda", 0))
    message = str(info.value)
    assert f"CONVGEN_GPU_ARCH='{chosen.lower()}'" in message and f"runs the machine code of {runnable};" in message


@pytest.mark.parametrize("arch, device_arch, runs", [("sm_80", "sm_86", True), ("sm_86", "sm_80", False),
                                                     ("sm_80", "sm_90", False), ("sm_90a", "sm_90", True),
                                                     ("sm_89", "sm_86", False), ("gfx90a", "gfx90a", True),
                                                     ("gfx90a", "gfx940", False)])
def test_which_machine_code_a_device_runs(arch, device_arch, runs):
    assert cuda_device.runs_on(arch, device_arch) is runs


def test_check_and_bench_on_a_gpu_target_without_a_device_say_so(monkeypatch):
    from support.commands import run_cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    shape = ("--input", "2,8,9,9", "--weight", "16,8,3,3", "--target", "cuda-sm_90")
    code, out, err = run_cli("check", *shape)
    assert code == 2 and "this machine has no GPU device" in err and "--sim" in err and not out
    code, out, err = run_cli("bench", *shape)
    assert code == 2 and "this machine has none" in err and "convgen check --target cuda-sm_90 --sim" in err


@pytest.mark.parametrize("gcn, target", [("gfx90a:sramecc+:xnack-", "hip-gfx90a"), ("gfx940", "hip-gfx940")])
def test_a_rocm_device_is_served_by_its_gcn_arch_name(fake_device, gcn, target):
    fake_device(gcn=gcn)
    assert cuda_device.target_of(torch.device("cuda", 0)).name() == target


@pytest.mark.parametrize("fact, words", [
    (dict(capability=(7, 0)), ["cuda:0", "sm_70", "sm_80+", "cuda-sm_80"]),
    (dict(capability=(12, 0)), ["cuda:0", "sm_120", "no target", "cuda-sm_90"]),
    (dict(gcn="gfx1100"), ["cuda:0", "gfx1100", "RDNA3", "hip-gfx90a"]),
])
def test_a_device_whose_arch_has_no_target_is_a_clear_error(fake_device, fact, words):
    fake_device(**fact)
    with pytest.raises(ConvgenError) as info:
        cuda_device.target_of(torch.device("cuda", 0))
    for word in words:
        assert word in str(info.value)


# ------------------------------------------------------------------------ errors and fake kernels


def test_tensors_on_different_devices_are_refused_naming_both():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with pytest.raises(ConvSpecError, match="input is on meta and weight is on cpu"):
        convgen.conv2d(x.to("meta"), w)
    with pytest.raises(ConvSpecError, match="input is on device meta: convgen runs its kernels on the CPU and on CUDA"):
        convgen.conv2d(x.to("meta"), w.to("meta"))


def test_a_cpu_weight_with_a_cuda_input_is_refused_like_torch():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 3, 8, 8, device="cuda")
        w = torch.empty(8, 3, 3, 3)
        with pytest.raises(ConvSpecError, match="Expected all tensors to be on the same device, but input is on "
                                                "cuda:0 and weight is on cpu"):
            convgen.conv2d(x, w)
        with pytest.raises(ConvSpecError, match="bias is on cpu"):
            convgen.conv2d(x, torch.empty(8, 3, 3, 3, device="cuda"), torch.empty(8))


def test_the_fake_kernels_give_cuda_results_on_cuda_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.empty(2, 3, 8, 8, device="cuda"), torch.empty(8, 3, 3, 3, device="cuda")
        y = torch.ops.convgen.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        assert (y.shape, y.device.type) == ((2, 8, 8, 8), "cuda")
        grads = torch.ops.convgen.convolution_backward(y, x, w, [8], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                       [True, True, True])
        assert [tuple(g.shape) for g in grads] == [(2, 3, 8, 8), (8, 3, 3, 3), (8,)]
        assert {g.device.type for g in grads} == {"cuda"}


# ------------------------------------------------------------------------ the launch path, stood in for


_STAND_IN = r"""
#include <stdint.h>
static void* seen[5]; static long long seen_batch; static void* seen_stream; static int calls, fail;
int entry(void* gy, void* x, void* gw, void* gb, long long batch, void* stream) {
    seen[0] = gy; seen[1] = x; seen[2] = gw; seen[3] = gb; seen_batch = batch; seen_stream = stream;
    ++calls; return fail-- > 0 ? 2 : 0;
}
void* seen_pointer(int i) { return seen[i]; }
long long seen_n(void) { return seen_batch; }
void* seen_s(void) { return seen_stream; }
int calls_made(void) { return calls; }
void fail_next(int n) { fail = n; }
/* the plan entry's allocator hook (codegen/gpu/entry.py): what the runtime sets, called as the entry would */
static void* (*alloc_fn)(unsigned long long, void*); static void (*release_fn)(void*, void*);
void entry_set_allocator(void* alloc, void* release) {
    alloc_fn = (void* (*)(unsigned long long, void*))alloc; release_fn = (void (*)(void*, void*))release;
}
void* try_alloc(unsigned long long bytes, void* stream) { return alloc_fn ? alloc_fn(bytes, stream) : (void*)1; }
void try_release(void* p, void* stream) { if (release_fn) release_fn(p, stream); }
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A GpuKernel over a CPU library with the plan entry's parameters that records its call;
    torch's current device and stream faked (cuda:0, stream 0x5000)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the stand-in library")
    src, lib = tmp_path / "stand_in.c", tmp_path / "stand_in.so"
    src.write_text(_STAND_IN)
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    signature = (("ptr", "grad_output"), ("ptr", "input"), ("ptr", "grad_weight"), ("ptr", "grad_bias"),
                 ("i64", "n"), ("stream", "stream"))
    source = KernelSource(name="stand_in", text="", entry="entry", signature=signature,
                          target=parse_target("cuda-sm_90"), language="cuda")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda_device, "_raw_stream", lambda index: 0x5000 + index)
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    kernel = cuda_device.GpuKernel(source, lib)
    recorder = ctypes.CDLL(str(lib))
    for name in ("seen_pointer", "seen_s", "try_alloc"):
        getattr(recorder, name).restype = ctypes.c_void_p
    recorder.try_alloc.argtypes = [ctypes.c_ulonglong, ctypes.c_void_p]
    recorder.try_release.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    recorder.seen_n.restype = ctypes.c_longlong
    return kernel, recorder, emptied


class _OnDevice:
    """A tensor's stand-in on cuda:0: its data pointer and device, nothing else."""

    def __init__(self, address):
        self.address, self.device = address, torch.device("cuda", 0)

    def data_ptr(self):
        return self.address


def test_a_gpu_kernel_gets_its_pointers_by_role_the_batch_and_torchs_current_stream(stand_in):
    kernel, recorder, _ = stand_in
    roles = ("grad_output", "input", "grad_weight", "grad_bias")
    run = kernel.bind(roles, ["grad_output", "input", "grad_weight"], 7, 1)
    run(_OnDevice(0x1000), _OnDevice(0x2000), _OnDevice(0x3000), None)
    assert [recorder.seen_pointer(i) for i in range(4)] == [0x1000, 0x2000, 0x3000, None]
    assert (recorder.seen_n(), recorder.seen_s(), recorder.calls_made()) == (7, 0x5000, 1)


def test_out_of_memory_for_the_workspace_empties_torchs_cache_and_retries_once(stand_in):
    kernel, recorder, emptied = stand_in
    run = kernel.bind(("grad_output", "input", "grad_weight", "grad_bias"),
                      ["grad_output", "input", "grad_weight"], 2, 1)
    recorder.fail_next(1)
    run(_OnDevice(0x1000), _OnDevice(0x2000), _OnDevice(0x3000), None)
    assert (recorder.calls_made(), len(emptied)) == (2, 1)
    recorder.fail_next(2)
    with pytest.raises(torch.OutOfMemoryError, match="stand_in on cuda:0: out of memory for its workspace"):
        run(_OnDevice(0x1000), _OnDevice(0x2000), _OnDevice(0x3000), None)


def test_the_plan_entrys_workspaces_come_from_torchs_caching_allocator(stand_in, monkeypatch):
    """Loading a GPU kernel hands its plan entry torch's caching allocator (`<entry>_set_allocator`):
    the entry's allocations reach torch.cuda.caching_allocator_alloc on the entry's stream, its
    releases caching_allocator_delete; torch's out of memory is a null block (the entry's status 2)."""
    _, recorder, _ = stand_in
    calls = []

    def alloc(size, device=None, stream=None):
        calls.append(("alloc", size, stream))
        if size > 1 << 40:
            raise torch.OutOfMemoryError("too much")
        return 0x7000

    monkeypatch.setattr(torch.cuda, "caching_allocator_alloc", alloc)
    monkeypatch.setattr(torch.cuda, "caching_allocator_delete", lambda pointer: calls.append(("delete", pointer)))
    assert recorder.try_alloc(4096, 0x5000) == 0x7000
    recorder.try_release(0x7000, 0x5000)
    assert recorder.try_alloc(1 << 41, 0x5000) is None
    assert calls == [("alloc", 4096, 0x5000), ("delete", 0x7000), ("alloc", 1 << 41, 0x5000)]


_GENERIC_STAND_IN = r"""
static void* seen[5]; static long long seen_sizes[42], seen_batch; static void* seen_stream;
int generic_entry(void* x, void* w, void* y, void* b, const long long* sizes, long long batch, void* stream) {
    seen[0] = x; seen[1] = w; seen[2] = y; seen[3] = b; seen[4] = (void*)sizes;
    for (int i = 0; i < 42; ++i) seen_sizes[i] = sizes[i];
    seen_batch = batch; seen_stream = stream;
    return 0;
}
void* seen_pointer(int i) { return seen[i]; }
long long seen_size(int i) { return seen_sizes[i]; }
long long seen_n(void) { return seen_batch; }
void* seen_s(void) { return seen_stream; }
"""


def test_a_generic_gpu_kernel_gets_its_operands_by_kind_the_sizes_in_host_memory_and_the_stream(tmp_path,
                                                                                               monkeypatch):
    """The GPU generic tier's launch path (devices/cpu.py GenericKernel over a GpuKernel): the plan's
    roles mapped to the entry's kinds (X, W, Y, B), the size array as a host pointer, the batch and
    torch's current stream."""
    from convgen.codegen.gpu import generic as gpu_generic
    from convgen.devices.cpu import GenericKernel

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the stand-in library")
    src, lib = tmp_path / "generic_stand_in.c", tmp_path / "generic_stand_in.so"
    src.write_text(_GENERIC_STAND_IN)
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    source = KernelSource(name="generic_stand_in", text="", entry="generic_entry", signature=gpu_generic.SIGNATURE,
                          target=parse_target("cuda-sm_90"), language="cuda")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda_device, "_raw_stream", lambda index: 0x5000 + index)
    sizes = tuple(range(100, 142))
    kernel = GenericKernel(cuda_device.GpuKernel(source, lib), {"X": "grad_input", "W": "weight", "Y": "grad_output"},
                           sizes)
    roles = ("grad_output", "weight", "grad_input")
    kernel.bind(roles, roles, 5, 1)(_OnDevice(0x1000), _OnDevice(0x2000), _OnDevice(0x3000))
    recorder = ctypes.CDLL(str(lib))
    recorder.seen_pointer.restype, recorder.seen_s.restype = ctypes.c_void_p, ctypes.c_void_p
    recorder.seen_n.restype = recorder.seen_size.restype = ctypes.c_longlong
    assert [recorder.seen_pointer(i) for i in range(4)] == [0x3000, 0x2000, 0x1000, None]
    assert [recorder.seen_size(i) for i in range(42)] == list(sizes)
    assert (recorder.seen_n(), recorder.seen_s(), kernel.calls) == (5, 0x5000, 1)


def test_the_cpu_paths_remembered_calls_never_reach_device_code(monkeypatch):
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    convgen.conv2d(x, w, padding=1)   # built and remembered
    reached = []
    monkeypatch.setattr(cuda_device, "target_of", lambda device: reached.append(device))
    calls = []

    def profile(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_filename)
    sys.setprofile(profile)
    try:
        convgen.conv2d(x, w, padding=1)
    finally:
        sys.setprofile(None)
    assert reached == []
    assert not [f for f in calls if any(part in f for part in ("devices/cuda", "devices/hip", "dispatch/"))], calls


# ------------------------------------------------------------------------ vendor builds (no device needed)


def _biased_3x3_problem():
    """The forward of a 3x3 convolution of 8 channels to 16 (8x8, padding 1), with a bias."""
    x, w = torch.randn(2, 8, 8, 8), torch.randn(16, 8, 3, 3)
    return base_problem(x, w, torch.randn(16), 1, 1, 1, False, 0, 1)


@pytest.mark.parametrize("target", ["cuda-sm_80", "cuda-sm_90", "hip-gfx90a"])
def test_the_vendor_compiler_builds_a_loadable_library_that_exports_the_plan_entry(target):
    t = parse_target(target)
    if (convgen.knobs.nvcc() if t.kind.value == "cuda" else convgen.knobs.hipcc()) is None:
        pytest.skip(f"no {'nvcc' if t.kind.value == 'cuda' else 'hipcc'} on this machine to build {target}")
    source = emit(lower(_biased_3x3_problem(), t))
    path = gpu_library.build_library(source)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
    assert f" T {source.entry}\n" in symbols


@pytest.mark.parametrize("target", ["cuda-sm_90", "hip-gfx90a"])
def test_the_vendor_compiler_builds_the_generic_tiers_libraries(target):
    """Each kernel op's generic library (codegen/gpu/generic.py), in f32 and bf16, exports its entry."""
    from convgen.codegen.gpu import generic as gpu_generic
    from convgen.codegen.ir import DType

    t = parse_target(target)
    if (convgen.knobs.nvcc() if t.kind.value == "cuda" else convgen.knobs.hipcc()) is None:
        pytest.skip(f"no {'nvcc' if t.kind.value == 'cuda' else 'hipcc'} on this machine to build {target}")
    for kop in gpu_generic.KOPS:
        for dtype in (DType.F32, DType.BF16):
            source = gpu_generic.source(kop, dtype, t)
            path = gpu_library.build_library(source)
            symbols = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
            assert f" T {source.entry}\n" in symbols


def test_fat_binary_flags_name_every_arch():
    from convgen.codegen.target import TargetKind

    assert gpu_library.arch_flags(TargetKind.CUDA, ["sm_80", "sm_90"]) == [
        "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
    assert gpu_library.arch_flags(TargetKind.HIP, ["gfx90a", "gfx940"]) == ["--offload-arch=gfx90a",
                                                                             "--offload-arch=gfx940"]


# ------------------------------------------------------------------------ on a real CUDA device

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA (or ROCm) device: torch.cuda.is_available() is False here")

MASKS = [(True, True, True), (True, False, False), (False, True, False), (False, False, True),
         (True, True, False), (False, True, True)]


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_on_the_device_matches_aten_in_float64(dtype):
    x = torch.randn(3, 8, 10, 10, device="cuda", dtype=dtype)
    w = torch.randn(16, 8, 3, 3, device="cuda", dtype=dtype)
    b = torch.randn(16, device="cuda", dtype=dtype)
    y = convgen.conv2d(x, w, b, padding=1)
    assert y.device == x.device
    ref = torch.nn.functional.conv2d(x.cpu().double(), w.cpu().double(), b.cpu().double(), padding=1)
    assert_close(y.cpu(), ref, dtype, "forward", terms=8 * 9)


@needs_cuda
@pytest.mark.parametrize("mask", MASKS)
def test_backward_on_the_device_matches_aten_for_every_output_mask(mask):
    x, w = torch.randn(2, 8, 9, 9, device="cuda"), torch.randn(4, 8, 3, 3, device="cuda")
    gy = torch.randn(2, 4, 5, 5, device="cuda")
    args = ([4], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, list(mask))
    got = convgen.convolution_backward(gy, x, w, *args)
    ref = torch.ops.aten.convolution_backward(gy.cpu().double(), x.cpu().double(), w.cpu().double(), *args)
    for name, g, r in zip(("grad_input", "grad_weight", "grad_bias"), got, ref):
        assert (g is None) == (r is None), name
        if g is not None:
            assert g.device == x.device
            assert_close(g.cpu(), r, torch.float32, name, terms=2 * 25)


@needs_cuda
def test_autograd_convert_and_stats_on_the_device():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3, stride=2, padding=1)).cuda()
    ref_model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(8, 4, 3, stride=2, padding=1))
    ref_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    ref_model = ref_model.double()
    convgen.convert(model)
    x = torch.randn(2, 3, 12, 12, device="cuda", requires_grad=True)
    before = convgen.stats()["builds"]
    y = model(x)
    y.square().sum().backward()
    x64 = x.detach().cpu().double().requires_grad_()
    ref_model(x64).square().sum().backward()
    assert_close(x.grad.cpu(), x64.grad, torch.float32, "grad_input", terms=8 * 9)
    for (name, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        assert_close(p.grad.cpu(), q.grad, torch.float32, name, terms=2 * 144)
    assert convgen.stats()["builds"] > before or convgen.stats()["disk_hits"] > 0 or convgen.stats()["bundle_hits"]


@needs_cuda
def test_kernels_run_on_torchs_current_stream_without_synchronising():
    x, w = torch.randn(4, 8, 16, 16, device="cuda"), torch.randn(8, 8, 3, 3, device="cuda")
    convgen.conv2d(x, w, padding=1)   # built
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = convgen.conv2d(x, w, padding=1)
    torch.cuda.current_stream().wait_stream(side)
    side.synchronize()
    ref = torch.nn.functional.conv2d(x.cpu().double(), w.cpu().double(), padding=1)
    assert_close(y.cpu(), ref, torch.float32, "forward on a side stream", terms=8 * 9)


@needs_cuda
@pytest.mark.parametrize("policy", ["generic", "background"])
def test_the_generic_tier_on_the_device(policy, monkeypatch):
    """CONVGEN_JIT=generic: every pass on the generic kernels (no build once set up); background: a
    first call on them, the specialised kernel built in the background after the second and serving
    the third. Each call's results against ATen in float64."""
    from convgen.dispatch import tiers
    from support.tables import forget_tables

    monkeypatch.setenv("CONVGEN_JIT", policy)
    forget_tables(600)
    x, w = torch.randn(2, 8, 9, 9, device="cuda"), torch.randn(4, 8, 3, 3, device="cuda")
    gy = torch.randn(2, 4, 5, 5, device="cuda")
    args = ([4], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])
    ref = torch.ops.aten.convolution_backward(gy.cpu().double(), x.cpu().double(), w.cpu().double(), *args)
    for call in range(3):
        before = convgen.stats()
        got = convgen.convolution_backward(gy, x, w, *args)
        for name, g, r in zip(("grad_input", "grad_weight", "grad_bias"), got, ref):
            assert_close(g.cpu(), r, torch.float32, name, terms=2 * 25)
        if call == 0:
            assert convgen.stats()["generic_calls"] > before["generic_calls"]
        if call == 1:
            assert tiers.wait(600)
    if policy == "background":
        assert convgen.stats()["swaps"] >= 1
    forget_tables(600)


def _on_device(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values on the CUDA device in exactly its strides (channels-last and non-contiguous views too)."""
    out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cuda")
    return out.copy_(t)


def _device_runs() -> list:
    """CASES.md's cases on the device: f32 (in f32: the tests turn tf32 off) and bf16 in every variant,
    f64 and f16 contiguous; on a Hopper part (compute capability 9.0, served by sm_90a's warpgroup-MMA
    kernels) the bf16 and f16 runs again on sm_90's (mma.sync), ids ending "-on_sm_90". Collected where
    there is no device too (then skipped)."""
    from support.cases import CASES, DTYPES, variants_of

    if not torch.cuda.is_available():   # one skipped test here, not one per run
        return [pytest.param(None, None, None, "", id="no-device")]
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    params = []
    for case in CASES:
        for dtype in ("f32", "bf16", "f64", "f16"):
            variants = variants_of(case) if dtype in ("f32", "bf16") else ["contiguous"]
            for arch in [""] + (["sm_90"] if hopper and dtype in ("bf16", "f16") else []):
                for variant in variants:
                    params.append(pytest.param(case, DTYPES[dtype], variant, arch,
                                               id=f"{case.id}-{dtype}-{variant}{'-on_' + arch if arch else ''}"))
    return params


@needs_cuda
@pytest.mark.parametrize("case, dtype, variant, arch", _device_runs())
def test_cases_md_on_the_device(case, dtype, variant, arch, monkeypatch):
    """Each case's forward and every output_mask of its backward on the device, against ATen in float64
    (computed on the device), in torch's memory formats there; the operands left unchanged."""
    from support.cases import check_case, operands

    if arch:
        monkeypatch.setenv("CONVGEN_GPU_ARCH", arch)
    ops = operands(case, dtype, variant)
    ops = type(ops)(*(_on_device(t) for t in (ops.x, ops.w, ops.b, ops.gy)))
    check_case(case, dtype, ops)


@needs_cuda
def test_convgen_check_runs_on_the_device():
    from support.commands import run_cli

    code, out, err = run_cli("check", "--input", "2,16,12,12", "--weight", "32,16,3,3", "--padding", "1",
                             "--dtype", "bf16", "--layout", "channels_last", "--target", "cuda")
    assert code == 0, out + err
    assert "on the device (cuda:" in out and out.count(" ok") == 5


@needs_cuda
def test_convgen_bench_times_the_device_against_torch():
    import json

    from support.commands import run_cli

    code, out, err = run_cli("bench", "--suite", "smoke", "--target", "cuda", "--repeat", "2", "--min-time", "0.01",
                             "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["machine"]["device"]["name"] == torch.cuda.get_device_name()
    assert report["call"] is None and report["peak"]["pct_peak_basis"]
    rows = report["suites"][0]["rows"]
    assert rows and all(r["within_tolerance"] and r["results"]["backward"]["convgen_ms"] > 0 for r in rows)


def test_the_kernel_breakdown_tool_runs_where_there_is_a_device_and_says_so_where_not():
    """tests/tools/device_kernels.py (on_device.sh's kernels stage): with a device, each pass's kernels
    of the smoke suite by device time, convgen's (its cgk_ kernels) beside torch's; without one, exit
    status 2 and why."""
    from pathlib import Path

    tool = Path(__file__).resolve().parents[1] / "tools" / "device_kernels.py"
    done = subprocess.run([sys.executable, str(tool), "--suite", "smoke", "--batch", "2", "--iters", "1"],
                          capture_output=True, text=True, timeout=600)
    if not torch.cuda.is_available():
        assert done.returncode == 2 and "no CUDA device" in done.stderr, done.stdout + done.stderr
        return
    assert done.returncode == 0, done.stdout + done.stderr
    assert "forward  convgen" in done.stdout and "backward torch" in done.stdout and "cgk_" in done.stdout
