"""What the tests compare convgen against: ATen in float64, tolerances per dtype, layout helpers,
and checks of one loaded kernel against ATen.

The reference (DESIGN.md "Testing") is `torch.ops.aten.convolution` / `convolution_backward` on
the same inputs upcast to float64; an error is ‖out − ref‖ / ‖ref‖ computed in float64.
Shapes and memory formats are compared with torch's own call on the original (not upcast)
tensors, since the memory format of torch's results depends on the dtype.
"""

from __future__ import annotations

import math
import zlib
from typing import Sequence

import torch

# Relative error bounds ‖out − ref‖ / ‖ref‖ against the float64 reference, for reductions of up
# to SHORT_REDUCTION terms (every result in these tests but the weight and bias gradients of the
# long 1-D case 19b, 32 k terms).
#   f64:  only the order of accumulation differs from the reference: a few units of
#         2^-53 ≈ 1.1e-16 times √(terms); 1e-12 leaves a margin of over 100x.
#   f32:  1e-6, DESIGN.md's figure: about 17 units of 2^-24 ≈ 6e-8.
#   bf16: inputs are rounded to bf16 before the reference is computed, so only the f32
#         accumulation and the final rounding (2^-9 ≈ 2e-3 per element) remain: 1e-2.
#   f16:  likewise, with the final rounding at 2^-12 ≈ 2.4e-4: 1e-3.
# The rounding error of a sum grows like √(terms): past SHORT_REDUCTION terms the bound grows by
# √(terms / SHORT_REDUCTION). (torch's own float32 bias gradient of case 19b is 1.06e-6 off.)
# A real bug (a term missing, one element unwritten) costs far more: one of 32 k terms missing
# in one element of case 19b's weight gradient is a relative error of about 1e-4.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}
SHORT_REDUCTION = 4096
# f32 on tf32 matrix instructions (a GPU target while torch.backends.cudnn.allow_tf32): each operand
# is rounded to 11 significant bits (cvt.rna), a relative error of at most u = 2^-11 each, so each
# product is off by at most 2u + u^2 relative; products are exact in f32 after that and summed in
# f32 (f32's own bound above still applies, and is added). Independent rounding errors of
# random-signed terms average out rather than add up: the norm-wise error ||out - ref|| / ||ref||
# is about the root mean square of a product's relative error, sqrt(2) x (u / sqrt(3)) ~ 0.8u ~ 4e-4
# for errors spread evenly over [-u, u] (measured here: 2.5-3.5e-4), and never more than the
# per-product bound 2u = 2^-10 ~ 9.8e-4 unless the terms cancel abnormally. So 2^-10: about twice
# to three times what is expected, independent of the reduction's length (each product's error is
# relative to itself). Rounding in a wrong direction or a fragment that skips the rounding shows as
# 0.5-1x the bound at worst -- the simulator's emulation refuses unrounded operands outright, and
# a misplaced element or a missing term costs far more.
TF32_TOLERANCE = 2.0 ** -10


def tolerance(dtype: torch.dtype, terms: int = 1, tf32: bool = False) -> float:
    """The bound for a result whose elements each sum `terms` products (`tf32`: f32 on tf32
    matrix instructions)."""
    return TOLERANCE[dtype] * max(1.0, math.sqrt(terms / SHORT_REDUCTION)) + (TF32_TOLERANCE if tf32 else 0.0)


def reduction_terms(x_shape: Sequence[int], w_shape: Sequence[int], y_shape: Sequence[int]) -> dict[str, int]:
    """An upper bound on the terms each element of each result sums, normal or transposed:
    channels per group times kernel volume for the output and the input gradient, batch times
    image size for the weight and bias gradients."""
    over_channels = max(w_shape[0], w_shape[1]) * math.prod(w_shape[2:])
    over_images = x_shape[0] * max(math.prod(x_shape[2:]), math.prod(y_shape[2:]))
    return {"forward": over_channels, "grad_input": over_channels, "grad_weight": over_images,
            "grad_bias": over_images}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; when ‖ref‖ is 0, the largest |out| (so 0 means exact)."""
    assert out.shape == ref.shape, f"shape {list(out.shape)} != reference {list(ref.shape)}"
    o, r = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    if o.numel() == 0:
        return 0.0
    diff = torch.linalg.vector_norm(o - r).item()
    norm = torch.linalg.vector_norm(r).item()
    if norm == 0.0:
        return o.abs().max().item()
    return diff / norm


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str, terms: int = 1,
                 tf32: bool = False) -> None:
    """`out` within the dtype's tolerance of the float64 reference, with no NaN or inf of its own;
    `terms`: how many products each element sums; `tf32`: computed on tf32 matrix instructions
    (see `tolerance`)."""
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}, expected {dtype}"
    assert out.shape == ref.shape, f"{what}: shape {list(out.shape)}, reference {list(ref.shape)}"
    bad = ~torch.isfinite(out.detach()) & torch.isfinite(ref.detach())
    assert not bad.any(), f"{what}: {int(bad.sum())} NaN/inf elements where the reference is finite"
    err, tol = rel_err(out, ref), tolerance(dtype, terms, tf32)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e} ({dtype}{', tf32' if tf32 else ''}, {terms} terms)"


# ------------------------------------------------------------------------------- layouts


def channels_last_format(dim: int) -> torch.memory_format | None:
    """The channels-last memory format of a `dim`-dimensional tensor, None for 3-D (there is none)."""
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(dim)


def memory_formats(dim: int) -> list[torch.memory_format]:
    cl = channels_last_format(dim)
    return [torch.contiguous_format] + ([cl] if cl is not None else [])


def assert_same_format(out: torch.Tensor, native: torch.Tensor, what: str) -> None:
    """Same shape and, for every memory format, the same answer to is_contiguous as torch's result.

    Not for empty results: they have no layout, and torch's strides for them are artefacts of
    its code paths (a batch-0 forward from a channels-last input comes back contiguous, its
    input gradient channels-last; zero-channel gradients come back with zero strides)."""
    assert out.shape == native.shape, f"{what}: shape {list(out.shape)}, torch gives {list(native.shape)}"
    if native.numel() == 0:
        return
    for fmt in memory_formats(out.dim()):
        assert out.is_contiguous(memory_format=fmt) == native.is_contiguous(memory_format=fmt), (
            f"{what}: is_contiguous({fmt}) is {out.is_contiguous(memory_format=fmt)} with strides "
            f"{out.stride()}, torch gives {native.is_contiguous(memory_format=fmt)} with strides {native.stride()}")


def in_channels_last(t: torch.Tensor) -> torch.Tensor:
    """`t` with its elements in channels-last memory order (the same logical values)."""
    from convgen.codegen.ir import Layout
    from convgen.dispatch.problem import memory_format
    return t.contiguous(memory_format=memory_format(Layout.CHANNELS_LAST, t.dim()))


def in_layout(t: torch.Tensor, layout) -> torch.Tensor:
    """`t` with its elements in `layout`'s memory order (the same logical values)."""
    from convgen.codegen.ir import Layout
    return t.contiguous(memory_format=channels_last_format(t.dim())) if layout is Layout.CHANNELS_LAST else t


def non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous view: every other element of a doubled last axis."""
    view = t.repeat_interleave(2, -1)[..., ::2]
    assert torch.equal(view, t) and (t.numel() <= 1 or not view.is_contiguous())
    return view


def randn(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator,
          memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """Fresh standard-normal values (never zeros), drawn in float64 and rounded to `dtype`."""
    t = torch.randn(tuple(shape), dtype=torch.float64, generator=generator).to(dtype)
    return t.contiguous(memory_format=memory_format)


def generator_for(test_id: str) -> torch.Generator:
    """A generator seeded from the test's id: fresh values per test, the same on every run
    (Python's hash() of a string changes between runs, crc32 does not)."""
    return torch.Generator().manual_seed(zlib.crc32(test_id.encode()))


# ------------------------------------------------------------------------------- ATen calls


def _ints(v, rank: int) -> list[int]:
    return [v] * rank if isinstance(v, int) else list(v) if len(v) != 1 else list(v) * rank


def aten_padding(padding, rank: int, kernel: Sequence[int], dilation: Sequence[int]):
    """ATen's `convolution` takes symmetric integer padding only: 'same' with an odd total
    (an even kernel) is computed by torch as the symmetric part plus a one-sided pad of the
    input (`F.pad`), exactly as torch.nn.functional does it. Returns (symmetric padding, extra
    pad for F.pad or None)."""
    if padding == "valid":
        return [0] * rank, None
    if padding != "same":
        return _ints(padding, rank), None
    sym, extra = [], []
    for kr, d in zip(kernel, dilation):
        total = d * (kr - 1)
        sym.append(total // 2)
        extra.append(total - 2 * (total // 2))
    if not any(extra):
        return sym, None
    pad = []
    for e in reversed(extra):  # F.pad lists the last axis first; the odd element goes high
        pad += [0, e]
    return sym, pad


class Aten:
    """torch's own convolution for one set of arguments, in any dtype, with 'same' supported.

    `forward` and `backward` return torch's results for the given tensors; `forward64` and
    `backward64` the float64 reference (inputs upcast exactly).
    """

    def __init__(self, stride, padding, dilation, transposed, output_padding, groups, rank, kernel):
        self.rank = rank
        self.stride = _ints(stride, rank)
        self.dilation = _ints(dilation, rank)
        self.transposed = transposed
        self.output_padding = _ints(output_padding, rank)
        self.groups = groups
        self.padding, self.extra = aten_padding(padding, rank, kernel, self.dilation)

    def _pad(self, x):
        return x if self.extra is None else torch.nn.functional.pad(x, self.extra)

    def forward(self, x, w, b):
        return torch.ops.aten.convolution(self._pad(x), w, b, self.stride, self.padding, self.dilation,
                                          self.transposed, self.output_padding, self.groups)

    def backward(self, gy, x, w, bias_sizes, mask):
        if self.extra is None:
            return torch.ops.aten.convolution_backward(gy, x, w, bias_sizes, self.stride, self.padding,
                                                       self.dilation, self.transposed, self.output_padding,
                                                       self.groups, list(mask))
        # 'same' with one-sided padding: differentiate through F.pad, as torch.nn.functional does
        xx = x.detach().requires_grad_(bool(mask[0]))
        ww = w.detach().requires_grad_(bool(mask[1]))
        bb = torch.zeros(bias_sizes, dtype=x.dtype, device=x.device, requires_grad=bool(mask[2]))
        y = self.forward(xx, ww, bb)
        wanted = [t for t, m in zip((xx, ww, bb), mask) if m]
        grads = iter(torch.autograd.grad(y, wanted, gy) if wanted else ())
        return tuple(next(grads) if m else None for m in mask)

    def forward64(self, x, w, b):
        return self.forward(up(x), up(w), up(b))

    def backward64(self, gy, x, w, bias_sizes, mask):
        return self.backward(up(gy), up(x), up(w), bias_sizes, mask)


def up(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to(torch.float64)


def check_forward_or_data_gradient(kernel, problem, gen: torch.Generator) -> None:
    """Run a loaded forward or data-gradient kernel of `problem` (any padding, even uneven) on random
    operands in the problem's layouts and assert it matches ATen in float64, padding the input (or
    the reference's input) explicitly, since ATen takes only even padding; outputs start as NaN,
    so any left unwritten fail."""
    from convgen.codegen.ir import Op
    from convgen.dispatch.problem import TORCH_DTYPES, memory_format
    tdt = TORCH_DTYPES[problem.dtype]
    rank = len(problem.kernel)

    def tensor(shape, layout):
        t = torch.randn(shape, generator=gen, dtype=torch.float64).to(tdt)
        return t.contiguous(memory_format=memory_format(layout, t.dim()))

    def padded(t):
        return torch.nn.functional.pad(t, [side for lo, hi in reversed(problem.padding) for side in (lo, hi)])

    x, w = tensor(problem.input_shape, problem.input_layout), tensor(problem.weight_shape, problem.weight_layout)
    args = (list(problem.stride), [0] * rank, list(problem.dilation), False, [0] * rank, problem.groups)
    taps = torch.Size(problem.kernel).numel()
    if problem.op is Op.FWD:
        terms = problem.c // problem.groups * taps
        b = torch.randn(problem.k, generator=gen, dtype=torch.float64).to(tdt) if problem.bias else None
        out = torch.full(problem.output_shape, float("nan"), dtype=tdt)
        out = out.contiguous(memory_format=memory_format(problem.output_layout, out.dim()))
        kernel({"input": x, "weight": w, "bias": b, "output": out}, problem.n, 2)
        ref = torch.ops.aten.convolution(padded(x.double()), w.double(), up(b), *args)
    else:
        terms = problem.k // problem.groups * taps
        gy = tensor(problem.output_shape, problem.output_layout)
        out = torch.full(problem.input_shape, float("nan"), dtype=tdt)
        out = out.contiguous(memory_format=memory_format(problem.input_layout, out.dim()))
        kernel({"grad_output": gy, "weight": w, "grad_input": out}, problem.n, 2)
        full = torch.ops.aten.convolution_backward(gy.double(), padded(x.double()), w.double(), None, *args,
                                                   (True, False, False))[0]
        ref = full[(slice(None), slice(None)) + tuple(slice(lo, lo + size) for (lo, _), size in
                                                      zip(problem.padding, problem.in_size))]
    assert not torch.isnan(out).any(), "outputs left unwritten"
    assert rel_err(out, ref) <= tolerance(tdt, terms), f"rel err {rel_err(out, ref):.2e}"


def check_weight_gradient(kernel, problem, gen: torch.Generator) -> None:
    """Run a loaded weight-gradient kernel of `problem` (any padding, even uneven; the bias gradient
    where problem.bias) on random operands in the problem's layouts and assert it matches ATen in
    float64 on the explicitly padded input; results start as NaN, so any left unwritten fail."""
    import math
    from convgen.dispatch.problem import TORCH_DTYPES, memory_format
    tdt = TORCH_DTYPES[problem.dtype]

    def tensor(shape, layout, fill=None):
        t = (torch.randn(shape, generator=gen, dtype=torch.float64) if fill is None
             else torch.full(shape, fill, dtype=torch.float64)).to(tdt)
        return t.contiguous(memory_format=memory_format(layout, t.dim()))

    x, gy = tensor(problem.input_shape, problem.input_layout), tensor(problem.output_shape, problem.output_layout)
    gw = tensor(problem.weight_shape, problem.weight_layout, float("nan"))
    gb = torch.full((problem.k,), float("nan"), dtype=tdt)
    kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb if problem.bias else None},
           problem.n, 2)
    flat = [side for lo, hi in reversed(problem.padding) for side in (lo, hi)]
    _, ref_w, ref_b = torch.ops.aten.convolution_backward(
        gy.double(), torch.nn.functional.pad(x.double(), flat), torch.empty(problem.weight_shape, dtype=torch.float64),
        [problem.k], list(problem.stride), [0] * len(problem.kernel), list(problem.dilation), False,
        list(problem.output_padding), problem.groups, [False, True, problem.bias])
    terms = problem.n * math.prod(problem.output_shape[2:])
    assert not torch.isnan(gw).any(), "weight gradients left unwritten"
    assert rel_err(gw, ref_w) <= tolerance(tdt, terms), f"grad_weight rel err {rel_err(gw, ref_w):.2e}"
    if problem.bias:
        assert rel_err(gb, ref_b) <= tolerance(tdt, terms), f"grad_bias rel err {rel_err(gb, ref_b):.2e}"
