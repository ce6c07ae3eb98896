"""The implicit-GEMM GPU kernel: forward, data gradient and weight gradient of convolutions (normal
or transposed) of every dtype, rendered for CUDA or HIP from `templates/gpu/igemm.cu.j2`.

- bf16/f16 on matrix instructions with f32 accumulation.
- On CUDA, f32 problems with `tf32` set (torch allowed tf32): their operands are rounded to tf32
  (cvt.rna.tf32.f32) as fragments are loaded from shared memory and multiplied by `mma.sync`
  m16n8k8 .tf32 (cuda.h), f32 accumulation.
- On HIP, f32 on `v_mfma_f32_16x16x4f32` (true f32 operands, k-step 4, hip.h), f32 accumulation.
- f64 on matrix instructions (`on_f64_matrix`), f64 accumulation, tiles 64 a side: on CUDA (sm_80+)
  the f64 tensor cores, two `mma.sync` m8n8k4 .f64 making the 16 x 8 x 4 step of the other dtypes'
  fragments (cuda.h); on HIP (gfx90a, gfx940) `v_mfma_f64_16x16x4f64`, whose A and B fragments are
  the f32 16x16x4 shape's and whose accumulators take every fourth row (hip.h).
- On CUDA f32 without tf32: the FMA path (`on_fma`). The same blocks, stages and warp quarters, 64 a
  side; each thread keeps a tile of its warp's quarter in registers (8 x 4 results on 32-wide
  warps, rows and columns strided so that a warp's shared-memory reads fall in different banks)
  and multiplies with fused multiply-adds accumulated in f32. (The template's FMA path also takes
  f64 and 64-wide waves, 4 x 4 results a lane, which no default plan asks for now.)
- f64 (on either path) accumulates, and keeps its weight-gradient partials and workspace, in f64,
  and steps 16 deep so that two stages fit HIP's 64 KiB of LDS.

Every pass is one GEMM per group, its operands gathered from the tensors while they are loaded
into shared memory (padding, stride and dilation are predicates, so channel counts need not be
multiples of anything). A block computes a BLOCK_M x BLOCK_N tile of the GEMM, BLOCK_K at a time
through a ring of shared-memory stages (cp.async on CUDA, register-staged on HIP); each of its four
warps (waves) a quarter of it from the target's matrix instruction (`mma.sync` m16n8k16 on CUDA,
`v_mfma_f32_16x16x16` on HIP, through the wrappers in cuda.h/hip.h). On CUDA the 16-bit fragments
come from `ldmatrix.x4` (one per A fragment, one per pair of B fragments) out of unpadded shared rows
whose 16-byte chunks are XOR-swizzled (the template's tile_at); on HIP each lane reads its fragment
as 16 bytes (ds_read_b128: a pack of two MFMAs for 16-bit operands, four f32 ones, two f64, hip.h),
from the same swizzled rows for 16-bit operands; the other paths pad their rows. On
sm_90a the 16-bit GEMMs multiply on warpgroup MMA instead (`wgmma.mma_async` m64nNk16, HGMMA), warp-
specialised: the GEMM kernels' blocks are two warpgroups, a producer that issues every stage's copies
and gathers and a consumer whose tensor cores read both operands from the stages through shared-memory
descriptors (the stages' swizzle is wgmma's 128/64/32-byte one; tiles of reduction rows take its
MN-major layout); each stage's full and empty mbarriers hand it between them (no block barrier in the
main loop; the consumer keeps one step's MMAs in flight while it waits for the next stage). The
simulator emulates the instruction (sim/wgmma.h) and the mbarriers (sim/mbarrier.h). Tiles, stages, the reduction
order and which operands move by 16-byte copies are igemm_tiles.py's decisions, per GEMM, from the
arch's tile configuration (codegen/arch/gpu.py).

- forward: M = batch x output pixels, N = filters per group, reduction = channels per group x taps.
- data gradient: one GEMM per stride phase (normal.py), every residue with any position launched,
  those without taps writing zeros.
- weight gradient: M = filters per group, N = channels per group x taps, reduction = batch x
  output pixels, split by the launch (its batch x output pixels, SPLIT_PIXELS a split at least, at
  most the SPLIT_MAX that fills about two blocks per SM); each split's f32 partial tile goes to a
  workspace and a second kernel sums the partials of each weight in split order and rounds once. No
  atomics: for a given batch the result is the same bits whatever order blocks and threads run in.

The workspace contract: `<prefix>_bwd_weight_workspace_bytes(batch)` says how many bytes the
caller passes to `<prefix>_bwd_weight(grad_output, input, grad_weight, workspace, batch, stream)`
(the batch's split x the weight's elements x 4). Asked with the weight gradient, the
bias gradient rides the same scheme (`<prefix>_bwd_weight_bias(grad_output, input, grad_weight,
grad_bias, workspace, batch, stream)`, `_bwd_weight_bias_workspace_bytes`): after its GEMM tile each
block's warps take bias channels of its group in turn and sum them over the split's share of the
batch x pixels (threads strided, a shuffle tree) into f32 (f64: f64) partials after the weight's in
the workspace, and the second kernel adds those in split order too and rounds once (see
bias_reason). When the layout pass stages operands channels-last (staging.py), the entries whose
GEMM reads them (`<prefix>_fwd`, `<prefix>_bwd_data`) take a workspace too, after the pointers,
sized by `<prefix>_<entry>_workspace_bytes(batch)`: they launch the transpose kernel into it, then
the GEMM on it; the weight-gradient entries that stage their input and grad_output keep the copies
after the partials in theirs (the fused bias gradient still sums the caller's tensor). Asked alone,
the bias gradient (`<prefix>_bwd_bias`) is a plain per-channel sum in f32 (f64 for f64). Tensors may be contiguous or channels-last (each of input, weight and output by
its own layout: every access goes through its strides). A transposed problem runs through the same
equivalences as the CPU (codegen/passes/canonicalise.py): its forward is the normal convolution's
data gradient (plus the bias), its data gradient the normal forward, its weight gradient the normal
one with input and grad_output swapped, its bias gradient a sum over the normal input.
"""

from __future__ import annotations

import dataclasses
import math

from ..arch.gpu import GPU_ARCHS
from ..errors import ConvSpecError
from ..ir import ConvProblem, DType, Layout, Op
from ..plan import GpuTiling, KOp, Plan
from ..render import render
from ..target import Target, TargetKind
from .context import ENTRIES, TensorContext, bias_rows, check_entries, check_prefix, file_fields, tensor_fields
from .family import Family
from .igemm_tiles import (WARPS, GemmTile, IgemmTiles, choose_tiles, kernel_strides, on_f64_matrix, on_fma, on_ldmatrix,
                          on_wgmma, vector_of, wgrad_copies_along_channels)
from .iterators import copy_iterators
from .padding import forward_normal, padded_channels
from .normal import Normal, Phase
from .staging import staging

TEMPLATE = "gpu/igemm.cu.j2"
SCALARS = {DType.BF16: "convgen_bf16", DType.F16: "convgen_f16", DType.F32: "float", DType.F64: "double"}
# The operands' type in shared memory: 16-bit floats as raw bits (unsigned short), f32 as tf32 as
# raw bits (unsigned, rounded as fragments load); on the FMA path (f32 without tf32, f64) the values.
BITS = {DType.BF16: "unsigned short", DType.F16: "unsigned short", DType.F32: "unsigned"}
# What the FMA path accumulates in: f32 in f32 (as the matrix instructions do), f64 in f64.
ACCUMULATORS = {DType.F32: "float", DType.F64: "double"}
MAX_SPLIT = 64
SPLIT_PIXELS = 4 * 32   # a weight-gradient split takes at least four 32-deep steps of the batch's pixels
SPLIT_K_ENTRIES = ("bwd_weight", "bwd_weight_bias")   # their partials go to a workspace


@dataclasses.dataclass(frozen=True)
class IgemmContext(TensorContext):
    bits: str              # the operands' type in shared memory (BITS; the scalar itself on the FMA path)
    fma: bool              # multiplied on the vector units, a register tile of FMAs per thread (on_fma)
    f64_matrix: bool       # f64 on matrix instructions: DMMA on CUDA, v_mfma_f64_16x16x4f64 on HIP (on_f64_matrix)
    vector: int            # elements of one 16-byte copy
    lds: int               # a shared row's elements: BLOCK_K (swizzled), else BLOCK_K + one vector of padding
    ldmatrix: bool         # 16-bit fragments by ldmatrix.x4 from XOR-swizzled rows (igemm_tiles.on_ldmatrix)
    swizzled: bool         # unpadded rows, XOR-swizzled 16-byte chunks (igemm_tiles.swizzled_rows): ldmatrix's, HIP's 16-bit
    tf32: bool             # f32 operands rounded to tf32 on the tf32 matrix instruction
    transposed: bool       # the entries map a transposed problem's roles onto the normal convolution
    staged: tuple[str, ...]     # operands ("X", "W", "Y") the forward / data gradient read from a copy in the
                                # entry's workspace (the layout pass, staging.py): X, Y channels-last,
                                # W channels-last for the forward and filters innermost for the data gradient
    read_strides: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]   # (x, y, w) as those GEMMs read them
    converts: tuple[tuple[str, tuple[str, ...]], ...]   # ("FWD" | "DGRAD", the kinds its launch converts)
    staged_entries: tuple[str, ...]   # the entries that convert (and so take a workspace)
    raw: str                    # an unsigned type of the element's size: what the conversion moves
    block_k: int
    tiles: tuple[tuple[str, GemmTile], ...]   # ("FWD" | "DGRAD" | "WGRAD", its tile)
    phases: tuple[Phase, ...]
    entries: tuple[str, ...]
    kernels: tuple[str, ...]   # the __global__ functions those entries launch (only these are rendered)
    split_pixels: int = SPLIT_PIXELS   # the weight gradient's least batch x pixels a split
    iterators: tuple[tuple[str, bool], ...] = ()   # ("FWD_A" ... "DGRAD_B", copies by iterator: copy_iterators)
    wgmma: bool = False    # sm_90a: warpgroup MMA from the shared stages (igemm_tiles.on_wgmma), not ldmatrix + mma.sync
    out_along: tuple[tuple[str, int], ...] = ()   # ("FWD" | "DGRAD" | "WGRAD", how its epilogue stores: out_along)
    wgrad_weight_order: bool = True   # the weight gradient's columns in the weight's own order (wgrad_weight_order)
    bias_rows: tuple[int, int, int] = (0, 0, 0)   # a fused bias gradient's channels-last reads (context.bias_rows)
    fwd_channels: int = 0  # a group's input channels as the forward reads them (more where padded: padding.py)


def staged_of(problem: ConvProblem, target: Target, staged: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The operands read from a converted copy: `staged` as the plan's layout pass decided, or
    (None) staging.py's decision for `problem` on `target`."""
    if staged is None:
        return staging(problem, target).kinds
    return tuple(staged)


def tiles_of(problem: ConvProblem, target: Target, staged: tuple[str, ...] | None = None) -> IgemmTiles:
    """The three GEMMs' tiles, stages and operand access (igemm_tiles.py) for `problem`, its
    `staged` operands (staged_of) read from their copies."""
    normal = Normal.of(problem)
    staged = staged_of(problem, target, staged)
    padded = forward_normal(normal, staged, problem.dtype.itemsize)
    return choose_tiles(normal, *kernel_strides(normal, ()), target, problem.dtype.itemsize, on_fma(problem, target),
                        on_f64_matrix(problem, target), staged=kernel_strides(padded, staged), dgrad_b="W" in staged,
                        wgrad_staged=bool(_converts(normal, staged, target, problem.dtype.itemsize)["WGRAD"]),
                        gemm=launched_gemm(problem), fwd_normal=padded)


def launched_gemm(problem: ConvProblem) -> str | None:
    """The GEMM a plan of `problem`'s pass launches: the forward's (a transposed problem's: the data
    gradient's), the data gradient's (transposed: the forward's), the weight gradient's; None for a
    bias gradient alone."""
    return {Op.FWD: "DGRAD" if problem.transposed else "FWD", Op.BWD_DATA: "FWD" if problem.transposed else "DGRAD",
            Op.BWD_WEIGHT: "WGRAD"}.get(problem.op)


def _split(normal: Normal, target: Target, tile: GemmTile, partials: str = "f32") -> tuple[int, str]:
    """The weight gradient's largest split (SPLIT_MAX) and the rule in words. The split itself is
    the launch's, from the batch (the template's wgrad_split): batch x output pixels / SPLIT_PIXELS,
    at most SPLIT_MAX, which is what fills about two blocks per SM (CU) of the target."""
    units = (target.gpu or GPU_ARCHS[target.isa]).sm_count
    groups = normal.groups
    kg, cg = normal.filters // groups, normal.channels // groups
    taps, out_pixels = math.prod(normal.kernel), math.prod(normal.out_size)
    tiles = -(-kg // tile.m) * -(-(cg * taps) // tile.n) * groups
    by_units = -(-2 * units // tiles) if tiles else 1
    split = max(1, min(MAX_SPLIT, by_units, 65535 // max(groups, 1)))
    unit = "SM" if target.kind is TargetKind.CUDA else "CU"
    return split, (f"weight gradient: {tiles} output tiles; split the batch x {out_pixels} pixels reduction "
                   f"by the launch's batch, min({split}, batch x {out_pixels} / {SPLIT_PIXELS}) ways (about two "
                   f"blocks per {unit} of {units}, at least {SPLIT_PIXELS} pixels per split), {partials} partials "
                   f"in a workspace summed in split order by a second kernel (no atomics)")


def wgrad_split(context: IgemmContext, batch: int) -> int:
    """How many ways the weight gradient of `context` splits its reduction for `batch` images (the
    template's wgrad_split; its workspace holds this many partials)."""
    out_pixels = math.prod(context.out_size)
    return max(1, min(context.split, batch * out_pixels // context.split_pixels))


def refusal(problem: ConvProblem, target: Target) -> str | None:
    """Why the implicit-GEMM kernel does not take `problem` on `target` (parameter, value, rule), or None."""
    if target.kind is TargetKind.CPU:
        return f"target {target.name()}: the implicit-GEMM GPU kernel needs a cuda or hip target"
    if problem.tf32 and target.kind is not TargetKind.CUDA:
        return (f"tf32 on {target.name()}: the implicit-GEMM kernel's tf32 path is CUDA's mma.sync m16n8k8; "
                "on HIP f32 runs on FMAs (tf32 off)")
    if problem.groups > 65535:
        return (f"groups={problem.groups}: the implicit-GEMM GPU kernel launches a grid row per group; "
                "at most 65535")
    too_big = {name: count for name, count in (("an input image", problem.c * math.prod(problem.in_size)),
                                               ("an output image", problem.k * math.prod(problem.out_size)),
                                               ("the weight", math.prod(problem.weight_shape))) if count >= 2**31}
    if too_big:
        return ("size: the implicit-GEMM GPU kernel indexes within one image and the weight in 32 bits; "
                + ", ".join(f"{name} has {count} elements" for name, count in too_big.items())
                + " (at most 2^31 - 1)")
    tiles = tiles_of(problem, target, ())   # shared bytes do not depend on what is staged: no cost model here
    limit = (target.gpu or GPU_ARCHS[target.isa]).shared_bytes_per_block
    over = [(name, t.shared_bytes) for name, t in (("forward", tiles.fwd), ("data gradient", tiles.dgrad),
                                                   ("weight gradient", tiles.wgrad)) if t.shared_bytes > limit]
    if over:
        return (f"shared memory: the implicit-GEMM tiles need {', '.join(f'{b} bytes ({n})' for n, b in over)}; "
                f"{target.name()} gives a block at most {limit}")
    return None


def _partials(problem: ConvProblem) -> str:
    """What the weight gradient's split-K partials are kept in."""
    return "f64" if problem.dtype is DType.F64 else "f32"


def reasons(problem: ConvProblem, target: Target, staged: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The block tile, the data gradient's stride phases and the weight gradient's split, in words."""
    normal = Normal.of(problem)
    phases = normal.phases()
    with_taps = [p for p in phases if all(a.taps for a in p.axes)]
    tiles = tiles_of(problem, target, staged)
    return (*tiles.reasons,
            f"data gradient: {len(phases)} stride phases ({len(with_taps)} with taps, the rest written as zeros): "
            + " ".join(p.name() for p in phases),
            _split(normal, target, tiles.wgrad, _partials(problem))[1])


def bias_reason(problem: ConvProblem) -> str:
    """How the weight gradient's fused bias gradient is computed, in words."""
    what = "the normal input's channels (grad_output of this transposed problem)" if problem.transposed \
        else "grad_output's filters"
    return (f"bias gradient fused into the weight gradient's two launches: each split's warps sum {what} over the "
            f"split's share of batch x pixels (threads strided, a shuffle tree) into {_partials(problem)} partials "
            f"after the weight's; the second kernel adds them in split order and rounds once")


def _launches(entry: str, transposed: bool) -> tuple[str, ...]:
    """The kernels an entry launches (a transposed problem's forward is the normal data gradient,
    its data gradient the normal forward)."""
    return {"fwd": ("bwd_data",) if transposed else ("fwd",), "bwd_data": ("fwd",) if transposed else ("bwd_data",),
            "bwd_weight": ("bwd_weight_partial", "bwd_weight_sum"),
            "bwd_weight_bias": ("bwd_weight_partial", "bwd_weight_sum"), "bwd_bias": ("bwd_bias",)}[entry]


def _converts(normal: Normal, staged: tuple[str, ...], target: Target, itemsize: int) -> dict[str, tuple[str, ...]]:
    """What each GEMM's launch converts: the forward its staged X and W that are not channels-last
    already (both in any layout where it pads their channels: padding.py), the data gradient its staged
    Y that is not, and its staged W (filters innermost, which no caller layout is); the weight gradient
    its staged X and Y that are not, where with them channels-last it copies both along channels
    (wgrad_copies_along_channels), else nothing."""
    cl = {k: lay is Layout.CHANNELS_LAST for k, lay in zip("XWY", normal.layouts)}
    wgrad = (all(cl[k] or k in staged for k in ("X", "Y")) and wgrad_copies_along_channels(normal, target, itemsize))
    padded = padded_channels(normal, staged, itemsize) != normal.channels   # (both copied, in any layout)
    return {"FWD": tuple(k for k in ("X", "W") if k in staged and (padded or not cl[k])),
            "DGRAD": tuple(k for k in ("Y", "W") if k in staged and (k == "W" or not cl[k])),
            "WGRAD": tuple(k for k in ("X", "Y") if k in staged and not cl[k]) if wgrad else ()}


def _staged_entries(problem: ConvProblem, converts: dict[str, tuple[str, ...]],
                    entries: tuple[str, ...]) -> tuple[str, ...]:
    """The entries among `entries` whose GEMM's launch converts an operand: the fwd entry launches
    the forward GEMM (a transposed problem's: the data gradient), bwd_data the data gradient, the
    weight-gradient entries the weight gradient's."""
    gemm = {"fwd": "DGRAD" if problem.transposed else "FWD", "bwd_data": "FWD" if problem.transposed else "DGRAD",
            "bwd_weight": "WGRAD", "bwd_weight_bias": "WGRAD"}
    return tuple(e for e in entries if e in gemm and converts[gemm[e]])


def igemm_context(problem: ConvProblem, target: Target, prefix: str, *, threads: int | None = None,
                  entries: tuple[str, ...] = ENTRIES, staged: tuple[str, ...] | None = None) -> IgemmContext:
    """The template context for `problem` on GPU `target`; entries `prefix`_<entry> for each of
    `entries` (a subset of ENTRIES; bwd_weight with its _workspace_bytes), only the kernels they
    launch rendered. `threads`, if given, must be the kernel's WARPS warps (waves). `staged`: the
    operands read channels-last from the workspace (the plan's layout decision; None: the same rule,
    staging.py); the entries that convert take a workspace (`<prefix>_<entry>_workspace_bytes`).
    ConvSpecError for what this kernel does not take."""
    why_not = refusal(problem, target)
    if why_not:
        raise ConvSpecError(why_not)
    check_prefix(prefix)
    check_entries(entries)
    warp = target.gpu.warp_size
    # (the GEMM kernels' blocks on warpgroup MMA are two warpgroups; their file's other kernels, one)
    allowed = (WARPS * warp, 2 * WARPS * warp) if on_wgmma(target, problem.dtype.itemsize) else (WARPS * warp,)
    if threads is not None and threads not in allowed:
        raise ConvSpecError(f"threads={threads}: the implicit-GEMM kernel's block is "
                            f"{' or '.join(str(t // warp) for t in allowed)} warps of {warp} "
                            f"({' or '.join(map(str, allowed))} threads) on {target.name()}")
    normal = Normal.of(problem)
    staged = staged_of(problem, target, staged)
    unknown = [k for k in staged if k not in ("X", "W", "Y")]
    if unknown:
        raise ConvSpecError(f"staged {list(staged)}: expected operand kinds among X, W, Y")
    converts = _converts(normal, staged, target, problem.dtype.itemsize)
    tiles = tiles_of(problem, target, staged)
    fma, f64_matrix = on_fma(problem, target), on_f64_matrix(problem, target)
    padded = forward_normal(normal, staged, problem.dtype.itemsize)   # (the forward's copies: their strides)
    read_strides = kernel_strides(padded, staged)
    iterators = copy_iterators(normal, tiles, read_strides, converts, padded)
    return IgemmContext(
        **file_fields(problem, target, prefix, normal), **tensor_fields(normal), scalar=SCALARS[problem.dtype],
        acc=ACCUMULATORS.get(problem.dtype, "float"), split=_split(normal, target, tiles.wgrad)[0], split_pixels=SPLIT_PIXELS,
        why=reasons(problem, target, staged),
        bits=SCALARS[problem.dtype] if fma or f64_matrix else BITS[problem.dtype], fma=fma, f64_matrix=f64_matrix,
        vector=vector_of(problem.dtype.itemsize), lds=tiles.fwd.lds, swizzled=tiles.fwd.swizzled,
        ldmatrix=tiles.fwd.swizzled and on_ldmatrix(target, problem.dtype.itemsize), tf32=problem.tf32,
        transposed=problem.transposed,
        staged=staged, read_strides=read_strides, converts=tuple(converts.items()), iterators=tuple(iterators.items()),
        staged_entries=_staged_entries(problem, converts, entries),
        raw={2: "unsigned short", 4: "unsigned", 8: "unsigned long long"}[problem.dtype.itemsize],
        block_k=tiles.fwd.depth, tiles=(("FWD", tiles.fwd), ("DGRAD", tiles.dgrad), ("WGRAD", tiles.wgrad)),
        phases=normal.phases(), entries=tuple(entries), wgmma=on_wgmma(target, problem.dtype.itemsize),
        out_along=tuple(out_along(problem, target, tiles).items()), wgrad_weight_order=wgrad_weight_order(normal, tiles),
        bias_rows=bias_rows(normal, problem.transposed, problem.dtype.itemsize, warp),
        fwd_channels=padded.channels // max(normal.groups, 1),
        kernels=tuple(sorted({k for e in entries for k in _launches(e, problem.transposed)})))


def out_along(problem: ConvProblem, target: Target, tiles: IgemmTiles | None = None) -> dict[str, int]:
    """How each GEMM's epilogue stores its results (templates/gpu/igemm.cu.j2): 1 through shared memory,
    then 16-byte stores along the GEMM's columns, where its output is contiguous along them (channels-last
    output and grad_input; the weight gradient's partials, in the GEMM's own order: wgrad_weight_order);
    2 likewise along its rows, where they are an image's consecutive pixels (NCHW output, and grad_input
    of a stride-1 problem: one phase, every position); 0 element by element. Every other stride of the
    tensor (and a group's channels) whole 16-byte chunks, so that each chunk starts aligned where the
    tensor does (the kernel checks each chunk's address and stores elements where it is not); and a
    pass of the least rows (a grain of each band: _pass_fits) staged within the GEMM's shared stages.
    The FMA path stores element by element (0)."""
    normal, tiles = Normal.of(problem), tiles or tiles_of(problem, target)
    if on_fma(problem, target):
        return {"FWD": 0, "DGRAD": 0, "WGRAD": 0}
    itemsize, partial_itemsize = problem.dtype.itemsize, 8 if problem.dtype is DType.F64 else 4
    g = normal.groups or 1
    cg, kg = normal.channels // g, normal.filters // g
    rd, rh, rw = normal.kernel
    taps = rd * rh * rw

    def along(strides, size, group, rows_dense, vector):
        n, c, d, h, w = strides
        pixels = size[0] * size[1] * size[2]
        if c == 1 and group % vector == 0 and all(s % vector == 0 for s in (n, d, h, w)):
            return 1
        if rows_dense and (w, h, d) == (1, size[2], size[1] * size[2]) and pixels % vector == 0 and n % vector == 0 \
                and c % vector == 0:
            return 2
        return 0

    strides = tensor_fields(normal)
    vector = 16 // itemsize
    alongs = {"FWD": along(strides["y_strides"], normal.out_size, kg, True, vector),
              "DGRAD": along(strides["x_strides"], normal.in_size, cg, tuple(normal.stride) == (1, 1, 1), vector),
              "WGRAD": 1 if cg * taps % (16 // partial_itemsize) == 0 else 0}   # partials in the GEMM's order
    cuda, wgmma = target.kind is TargetKind.CUDA, on_wgmma(target, itemsize)
    return {gemm: a if a and _pass_fits(tile, a, partial_itemsize if gemm == "WGRAD" else itemsize, cuda, wgmma) else 0
            for (gemm, a), tile in zip(alongs.items(), (tiles.fwd, tiles.dgrad, tiles.wgrad))}


def wgrad_weight_order(normal: Normal, tiles: IgemmTiles) -> bool:
    """Whether the weight gradient's (channel, tap) columns (tap-major or not: its tile) run in the
    weight's own memory order, so that its partials, in the GEMM's order, are laid out as the weight."""
    cg = normal.channels // (normal.groups or 1)
    rd, rh, rw = normal.kernel
    _, c, d, h, w = tensor_fields(normal)["w_strides"]
    return ((c, w, h, d) == (1, cg, rw * cg, rh * rw * cg) if tiles.wgrad.tap_major
            else (w, h, d, c) == (1, rw, rh * rw, rd * rh * rw))


def _pass_fits(tile: GemmTile, along: int, out_bytes: int, cuda: bool, wgmma: bool) -> bool:
    """Whether the epilogue's least pass (a grain of rows of each band: a 64-row half on wgmma, a
    fragment's 16 rows of each warp row otherwise), padded as the template pads it, fits the GEMM's
    shared stages (templates/gpu/igemm.cu.j2 out_pass_grains, which takes the most that fit)."""
    rows = 64 if wgmma else 2 * 16
    pad = (8 if cuda else 16 // out_bytes) if along == 1 else 16 // out_bytes
    return (rows * (tile.n + pad) if along == 1 else tile.n * (rows + pad)) * out_bytes <= tile.shared_bytes


def render_igemm(problem: ConvProblem, target: Target, prefix: str = "conv", **options) -> str:
    """CUDA or HIP source (by `target`) of the implicit-GEMM kernels for `problem`, with their entries."""
    return render(TEMPLATE, c=igemm_context(problem, target, prefix, **options))


TF32_WHY = ("; f32 as tf32 because torch allows it (torch.backends.cudnn.allow_tf32, torch's default for "
            "convolutions): operands rounded to tf32 (10-bit mantissa, cvt.rna: round to nearest, ties away) as "
            "fragments load, mma.sync m16n8k8 .tf32 with f32 accumulation, 4-byte shared elements, k-step 8; "
            "set allow_tf32 False for f32 on the CUDA cores")
MATRIX_WHY = "; {dtype} on the {units} (the target's matrix instruction), f32 accumulation"
F64_MATRIX_WHY = {"cuda": "; f64 on the f64 tensor cores (mma.sync m8n8k4 .f64, DMMA), f64 accumulation",
                  "hip": "; f64 on the matrix cores (v_mfma_f64_16x16x4f64), f64 accumulation"}
FMA_WHY = ("; {dtype} on the {units} (no {dtype} matrix instruction in convgen yet): each thread keeps a tile of "
           "results in registers, fused multiply-adds accumulated in {dtype}")


def _why(plan: Plan) -> str:
    """The kernel's shape, and how the plan's dtype multiplies on the target."""
    tiles = plan.target.gpu.igemm.matrix
    span = f"{tiles.sides[0]}-{tiles.sides[-1]}" if len(tiles.sides) > 1 else f"{tiles.sides[0]}"
    why = (f"an implicit GEMM, {span} x {span} x {tiles.depth} block tiles, {WARPS} warps of a quarter each, the "
           "accumulators rounded once; data gradients by stride phases, weight gradients split-K with partials "
           "summed in order (a transposed problem through the normal convolution's equivalent pass)")
    problem, target = plan.problem, plan.target
    cuda = target.kind is TargetKind.CUDA
    if problem.tf32:
        return why + TF32_WHY
    if on_f64_matrix(problem, target):
        return why + F64_MATRIX_WHY[target.kind.value]
    if on_fma(problem, target):
        return why + FMA_WHY.format(dtype=problem.dtype.value, units="CUDA cores" if cuda else "SIMDs")
    return why + MATRIX_WHY.format(dtype=problem.dtype.value, units="tensor cores" if cuda else "matrix cores")


def _tiling(plan: Plan) -> tuple[GpuTiling, str]:
    """WARPS warps (waves) per block, the GEMM tile, stages and copies of the GEMM this pass launches
    (igemm_tiles.py); the reason names the pass's stride phases or split, and how the bias gradient
    rides along."""
    gpu = plan.target.gpu
    unit = "warps" if gpu.warp_size == 32 else "waves"
    tiles = tiles_of(plan.problem, plan.target)
    *_, pipeline, phases, split = reasons(plan.problem, plan.target)
    transposed = plan.problem.transposed
    # a transposed forward runs the normal data gradient's GEMM, its data gradient the normal forward's
    gemm = {KOp.FWD: tiles.dgrad if transposed else tiles.fwd, KOp.DGRAD: tiles.fwd if transposed else tiles.dgrad,
            KOp.WGRAD: tiles.wgrad, KOp.BIAS: None}[plan.kop]
    forward_rows = (plan.kop is KOp.FWD) != transposed
    if gemm is None:
        what = "one channel's bias-gradient sum (strided threads, a shuffle tree, the warps' sums in order)"
    elif plan.kop is KOp.WGRAD:
        what = f"{gemm.m} filters x {gemm.n} (channel, tap) columns of one group and one split"
    elif forward_rows:
        what = f"{gemm.m} (image, output pixel) rows x {gemm.n} filters of one group"
    else:
        what = f"{gemm.m} (image, input position) rows of one stride phase x {gemm.n} channels of one group"
    fma = on_fma(plan.problem, plan.target) and gemm is not None
    rows, columns = (gemm.m // 2 // (gpu.warp_size // 8), gemm.n // 2 // 8) if fma else (0, 0)
    held = (f"; each thread keeps {rows * columns} results in registers ({rows} rows x {columns} columns of its warp's "
            f"quarter), multiplied by fused multiply-adds" if fma else "")
    wgmma = on_wgmma(plan.target, plan.problem.dtype.itemsize)
    share_of = (f"warpgroup MMAs of 64x{gemm.n}x16, {gemm.m // 64} a 16-deep slice" if wgmma else
                f"warp tile {gemm.m // 2}x{gemm.n // 2}") if gemm is not None else ""
    tile = ("" if gemm is None else f"tile {gemm.describe(plan.target.kind is TargetKind.CUDA, wgmma)}; "
            f"{share_of}{held}; {pipeline}")
    extra = {KOp.DGRAD: phases if not transposed else None, KOp.FWD: phases if transposed else None,
             KOp.WGRAD: split}.get(plan.kop)
    bias = plan.kop is KOp.WGRAD and plan.problem.bias
    epilogue = _epilogue(plan, tiles, fma) if gemm is not None else None
    share = f"a block's {gemm.m}x{gemm.n} tile" if gemm else "the bias gradient"
    # (sm_90a's GEMM kernels: a second warpgroup, the producer; the bias gradient's kernel keeps one)
    groups = 2 if gemm is not None and on_wgmma(plan.target, plan.problem.dtype.itemsize) else 1
    threads = groups * WARPS * gpu.warp_size
    tiling = GpuTiling(threads_per_block=threads, warps_per_block=groups * WARPS,
                       per_thread=(f"{rows}x{columns} results of {share}" if fma else
                                   f"a 1/{threads} share of {share}"), threads_hint=f"a block per {what}")
    return tiling, (f"{threads} threads per block ({groups * WARPS} {unit} of {gpu.warp_size}"
                    + ("; two warpgroups, the producer and the consumer" if groups == 2 else "") + "); a block per "
                    f"{what}" + (f"; {tile}" if tile else "") + (f"; {extra}" if extra else "")
                    + (f"; {epilogue}" if epilogue else "") + (f"; {bias_reason(plan.problem)}" if bias else ""))


def _epilogue(plan: Plan, tiles: IgemmTiles, fma: bool) -> str:
    """How the pass's GEMM stores its results (out_along; templates/gpu/igemm.cu.j2's epilogue)."""
    if fma:
        return "epilogue: each thread's results stored element by element"
    problem = plan.problem
    gemm = {KOp.FWD: "DGRAD" if problem.transposed else "FWD", KOp.DGRAD: "FWD" if problem.transposed else "DGRAD",
            KOp.WGRAD: "WGRAD"}[plan.kop]
    along = out_along(problem, plan.target, tiles)[gemm]
    what = (f"the split's {_partials(problem)} partials (in the GEMM's order; their sum put in the weight's)"
            if gemm == "WGRAD" else "results")
    if along == 0:
        return (f"epilogue: {what} stored element by element (the output is not whole 16-byte chunks along the "
                f"tile's rows or columns, or a pass of them would not fit the shared stages)")
    line = "columns" if along == 1 else "rows (an image's consecutive pixels)"
    bias = ", the bias added" if plan.kop is KOp.FWD and problem.bias else ""
    return (f"epilogue: {what} staged in shared memory a pass at a time{bias}, "
            f"then 16-byte stores along the tile's {line}, consecutive threads consecutive chunks")


FAMILY = Family("igemm", lambda plan: refusal(plan.problem, plan.target), _why, _tiling, igemm_context, TEMPLATE,
                lambda context: SPLIT_K_ENTRIES + context.staged_entries)
