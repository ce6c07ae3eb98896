"""The GPU's shape-generic tier: one kernel file per (kernel op, dtype, GPU target) that takes every
size of the problem at run time, built once (`convgen setup` on a machine with the device, else its
first use, in the generic tier's own directory) and then serving any problem of that kernel op at once,
while the kernel specialised for the problem builds in the background (runtime/dispatch/tiers.py).

Its entry reads the problem from the size array the CPU's generic tier takes (codegen/cpu/generic.py
(codegen/sizes.py) SIZE_FIELDS and `sizes`: the normal convolution's geometry and the operands' strides in the caller's
layouts; the runtime makes it with that function for both) and picks, at run time, one of two kernels:

- the implicit GEMM with run-time sizes (templates/gpu/igemm_generic.cu.j2) for the forward, the data
  gradient and the weight gradient, where every group has at least MIN_CHANNELS channels and filters
  and at most 65535 groups: the specialised kernels' main loop (igemm_core.cu.j2: the target's matrix
  instructions -- mma.sync with ldmatrix on CUDA's 16-bit dtypes, the FMA register tile for CUDA's f32,
  the f64 tensor cores, MFMA on HIP -- a ring of shared stages, 16-byte copies) with one block tile for
  every problem (TILE x TILE). Its copies go by iterators with run-time sizes (a tap walk moved BLOCK_K
  at a time, no division a copy), so it wants channels-last activations with whole 16-byte copies of a
  group's channels: the entry stages a dense NCHW input (forward; with the weight, (filter, tap,
  channel)) or grad_output (data gradient) channels-last in its workspace by a tiled transpose, and the
  data gradient reads a copy of the weight in its reduction's order. The data gradient folds the stride
  phases into its reduction (taps off the stride's grid read zeros; remainders compared, no division a
  copy); the weight gradient splits the batch's pixels as the specialised kernels do, partials summed in
  split order, and on ldmatrix (16-bit CUDA) copies both operands along filters and channels into tiles
  of reduction rows (WGRAD_MN's scheme, the operands staged channels-last where dense NCHW), else copies
  a dense NCHW grad_output along its pixels and gathers the input. What no copy can read is gathered
  element by element, its index decoded (slow, but correct for any strides). The workspace is the
  entry's own, stream-ordered (convgen_malloc_async);
- the direct kernel (templates/gpu/direct.cu.j2, one thread per result element, every sum in double)
  for the rest -- depthwise and other narrow groups, whose tiles would be a few rows of TILE -- and for
  the bias gradient asked alone.

Both are correct for every problem whose offsets within an image and the weight fit 32 bits (serves).
"""

from __future__ import annotations

import dataclasses

from ..errors import ConvgenError
from ..ir import DType
from ..keys import sha256_text
from ..plan import KOp, Plan
from ..render import render
from ..sizes import Layer, sizes
from ..source import KernelSource
from ..target import Target, TargetKind
from ..version import generator_version
from .direct import MIN_BLOCKS, STORAGE, TEMPLATE, THREADS, index_type, min_blocks_reason
from .igemm import ACCUMULATORS, BITS, MAX_SPLIT, SCALARS, SPLIT_PIXELS
from .igemm_tiles import _row, _stages, block_tiles, on_ldmatrix, swizzled_rows, vector_of
from .wrappers import vendor_wrappers

KOPS = (KOp.FWD, KOp.DGRAD, KOp.WGRAD, KOp.BIAS)
# the entry's parameters: the normal convolution's operands by kind, the size array (host memory), the
# batch, a stream
SIGNATURE = (("ptr", "X"), ("ptr", "W"), ("ptr", "Y"), ("ptr", "B"), ("ptr", "sizes"), ("i64", "n"),
             ("stream", "stream"))
# the kernel each kernel op launches (direct.cu.j2)
KERNELS = {KOp.FWD: "conv_y", KOp.DGRAD: "conv_x", KOp.WGRAD: "conv_w", KOp.BIAS: "sum_channels"}
IGEMM_TEMPLATE = "gpu/igemm_generic.cu.j2"
IGEMM_KOPS = (KOp.FWD, KOp.DGRAD, KOp.WGRAD)   # the bias gradient alone is the direct kernel's
TILE = 64            # the implicit GEMM's block tile, rows and columns, for every problem
GENERIC_STAGES = 4   # its shared stages where copies are asynchronous (CUDA), at most; 2 elsewhere
MIN_CHANNELS = 8     # a group's channels and filters, at least, for the implicit GEMM (else the direct kernel)
WHY = ("shape-generic: sizes, strides, padding, dilation and groups are run-time arguments; the implicit GEMM "
       f"on the target's matrix instructions ({TILE}x{TILE} tiles) where a group has {MIN_CHANNELS}+ channels and "
       "filters, else the direct kernel (one thread per result element, sums in double)")


@dataclasses.dataclass(frozen=True)
class GenericIgemmContext:
    """igemm_generic.cu.j2's context: the fields igemm_core.cu.j2 reads (as IgemmContext's), the tile."""
    wrappers: str
    prefix: str
    entry: str
    kop: str
    dtype: str
    vendor: str
    scalar: str
    bits: str
    acc: str
    fma: bool
    f64_matrix: bool
    vector: int
    lds: int
    swizzled: bool
    ldmatrix: bool
    block_k: int
    tile_m: int
    tile_n: int
    stages: int
    sm_count: int
    split_pixels: int = SPLIT_PIXELS
    max_split: int = MAX_SPLIT
    min_channels: int = MIN_CHANNELS
    raw: str = "unsigned short"   # an unsigned type of the element's size (the staging transpose moves bits)
    layer: "Layer | None" = None   # a layer's kernel: its constants (None: every size at run time)
    tf32: bool = False    # f32 is exact f32 here (the FMA path on CUDA): the generic kernel serves tf32 or not alike
    wgmma: bool = False   # mma.sync (or MFMA) on every arch: one kernel file for sm_90 and sm_90a alike


def igemm_context(kop: KOp, dtype: DType, target: Target, prefix: str, entry: str, wrappers: str,
                  layer: Layer | None = None) -> GenericIgemmContext:
    """The generic implicit GEMM's context for `kop` in `dtype` on GPU `target`: the specialised kernels'
    multiply for the dtype (igemm.py: FMAs for CUDA's f32, matrix instructions otherwise), one tile;
    `layer`'s constants compiled in where given."""
    itemsize = dtype.itemsize
    f64_matrix = dtype is DType.F64
    fma = dtype is DType.F32 and target.kind is TargetKind.CUDA
    depth = block_tiles(target, itemsize, fma).depth
    swizzled = swizzled_rows(target, itemsize)
    per_stage = 2 * TILE * _row(depth, itemsize, swizzled) * itemsize
    return GenericIgemmContext(
        wrappers=wrappers, prefix=prefix, entry=entry, kop=kop.value, dtype=dtype.value, vendor=target.kind.value,
        scalar=SCALARS[dtype], bits=SCALARS[dtype] if fma or f64_matrix else BITS[dtype],
        acc=ACCUMULATORS.get(dtype, "float"), fma=fma, f64_matrix=f64_matrix, vector=vector_of(itemsize),
        lds=_row(depth, itemsize, swizzled), swizzled=swizzled, ldmatrix=swizzled and on_ldmatrix(target, itemsize),
        block_k=depth, tile_m=TILE, tile_n=TILE, stages=_stages(target, per_stage, GENERIC_STAGES),
        sm_count=target.gpu.sm_count, layer=layer,
        raw={2: "unsigned short", 4: "unsigned", 8: "unsigned long long"}[itemsize])


def igemm_takes(words) -> bool:
    """The entry's rule (`<entry>_igemm_takes`), on a size array: the implicit GEMM where every group has
    MIN_CHANNELS+ channels and filters and there are at most 65535 groups (a grid row each)."""
    return words[1] >= MIN_CHANNELS and words[2] >= MIN_CHANNELS and words[0] <= 65535


def layer_serves(plan: Plan) -> bool:
    """Whether a layer of `plan`'s problem gets a layer's kernel once dynamic (its spatial sizes then no
    longer specialised): a kernel op of the implicit GEMM, which takes the layer's groups. (Depthwise and
    other narrow groups keep their specialised kernels, built in the background a hot size at a time:
    the direct kernel would serve them far slower.)"""
    return serves(plan) and plan.kop in IGEMM_KOPS and igemm_takes(sizes(plan))


@dataclasses.dataclass(frozen=True)
class GenericGpuContext:
    version: str
    problem_name: str
    problem_key: str
    target: str
    vendor: str
    wrappers: str
    prefix: str
    entry: str
    kop: str
    dtype: str
    storage: str
    threads: int
    min_blocks: int
    min_blocks_why: str
    kernels: tuple[str, ...]
    index: str = "int"
    index_why: str = "32-bit in-image offsets: the generic tier serves only problems whose offsets fit"
    transposed: bool = False   # (the size array says which operand the bias gradient sums)
    generic: bool = True


def serves(plan: Plan) -> bool:
    """Whether the GPU's generic tier computes `plan` (a GPU plan with a kernel whose offsets within
    an image and the weight fit 32 bits)."""
    return (plan.target.kind is not TargetKind.CPU and plan.kop in KOPS and plan.algorithm not in (None, "empty")
            and index_type(plan.problem, _threads(plan.target))[0] == "int")


def _threads(target: Target) -> int:
    gpu = target.gpu
    return min(THREADS, gpu.max_threads_per_block) // gpu.warp_size * gpu.warp_size


def source(kop: KOp, dtype: DType, target: Target, layer: Plan | None = None) -> KernelSource:
    """The generic kernel of `kop` for `dtype` on the GPU `target` (CUDA or HIP, as its kind); given
    `layer` (a plan of a layer that layer_serves), that layer's kernel: the implicit GEMM with the
    layer's constants compiled in (codegen/cpu/generic.py Layer), serving every spatial size of the layer."""
    if layer is not None:
        return _layer_source(kop, dtype, target, layer)
    arch = target.name().replace("-", "_")
    name = f"generic_{kop.value}_{dtype.value}_{arch}"
    entry, prefix = f"cg_{name}", f"cgk_{name}"
    threads = _threads(target)
    direct = GenericGpuContext(
        version=generator_version(), problem_name=f"every {kop.value} problem in {dtype.value}",
        problem_key="(sizes at run time)", target=target.name(), vendor=target.kind.value,
        wrappers=vendor_wrappers(target.kind.value), prefix=prefix, entry=f"{entry}_direct", kop=kop.value,
        dtype=dtype.value, storage=STORAGE[dtype], threads=threads, min_blocks=MIN_BLOCKS,
        min_blocks_why=min_blocks_reason(threads), kernels=(KERNELS[kop],))
    header = (f"// Generated by convgen {generator_version()} -- do not edit.\n// problem: every {kop.value} problem "
              f"in {dtype.value}\n// target:  {target.name()}\n// kernel:  {kop.value}, algorithm generic\n"
              f"// decisions:\n//   [tier] {WHY}\n")
    text = header + "\n" + render(TEMPLATE, c=direct)
    if kop in IGEMM_KOPS:   # (the vendor wrappers are in the direct kernel's part already)
        text += "\n" + render(IGEMM_TEMPLATE, c=igemm_context(kop, dtype, target, f"{prefix}_mm", f"{entry}_igemm", ""))
        choice = f"    if ({entry}_igemm_takes(sizes)) return {entry}_igemm(X, W, Y, B, sizes, batch, stream);\n"
    else:
        choice = ""
    text += ("\n// The entry: the implicit GEMM where it takes the problem, else the direct kernel.\n"
             f"extern \"C\" int {entry}(void* X, void* W, void* Y, void* B, const long long* sizes, long long batch, "
             f"void* stream) {{\n{choice}    return {entry}_direct(X, W, Y, B, sizes, batch, stream);\n}}\n")
    return KernelSource(name=name, text=text, entry=entry, signature=SIGNATURE, target=target,
                        language=target.kind.value)


def _layer_source(kop: KOp, dtype: DType, target: Target, layer: Plan) -> KernelSource:
    if not layer_serves(layer) or kop is not layer.kop:
        raise ConvgenError(f"layer {layer.problem.name()}: no GPU layer kernel for its {kop.value} (the implicit GEMM "
                           f"takes a layer whose groups have {MIN_CHANNELS}+ channels and filters, kernel ops "
                           f"{', '.join(k.value for k in IGEMM_KOPS)})")
    constants = Layer.of(layer)
    key = sha256_text(",".join(map(str, constants.words)))[:16]
    name = f"layer_{kop.value}_{dtype.value}_{target.name().replace('-', '_')}_{key[:10]}"
    entry = f"cg_{name}"
    why = ("a layer's kernel: the implicit GEMM with the layer's groups, channels, taps, strides, padding, "
           "dilation and weight strides compile-time constants, spatial sizes and the activations' strides "
           "run-time arguments")
    header = (f"// Generated by convgen {generator_version()} -- do not edit.\n// problem: every spatial size of one "
              f"{kop.value} layer in {dtype.value} ({layer.problem.name()} and its sizes)\n// key:     {key}\n"
              f"// target:  {target.name()}\n// kernel:  {kop.value}, algorithm generic\n// decisions:\n"
              f"//   [tier] {why}\n")
    context = igemm_context(kop, dtype, target, f"cgk_{name}", entry, vendor_wrappers(target.kind.value), constants)
    return KernelSource(name=name, text=header + "\n" + render(IGEMM_TEMPLATE, c=context), entry=entry,
                        signature=SIGNATURE, target=target, language=target.kind.value)
