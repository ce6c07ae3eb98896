"""bf16 outputs are rounded exactly as torch rounds f32 to bf16: to nearest, ties to even, NaN kept.

Every CPU kernel accumulates bf16 problems in f32 and rounds once when it stores (from_acc lane by
lane, or vstore_t a vector at a time: templates/cpu/common.h.j2, vector.h.j2; on AVX512-BF16 hosts
vstore_t is one vcvtneps2bf16, the same rounding, whose flush of subnormal results no product here
meets). The other tests compare
bf16 results with a relative tolerance, which a rounding that truncates or breaks ties upwards would
pass. Here each output is a single product of two bf16 values (weights zero except the kernel's
centre, so every other term is an exact zero): a product of two 8-bit significands is exact in f32,
so the kernel's result must be, bit for bit, `(x.float() * w.float()).bfloat16()`, and about one
value in 256 is a tie. Forward (one input channel) and data gradient (one output channel), NCHW and
channels last, every candidate algorithm; a 1x1 case also carries infinities, NaN and products past
bf16's largest value.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import host_cpu
from convgen.dispatch import dispatch
from convgen.dispatch.problem import memory_format

from support.problems import conv_problem

LAYOUTS = {"nchw": Layout.CONTIGUOUS, "channels_last": Layout.CHANNELS_LAST}
# (n, channels on the single side, pixels, kernel, padding)
SHAPES = {"3x3": (2, 20, (40, 40), (3, 3), 1), "1x1_specials": (2, 24, (17, 19), (1, 1), 0)}


def _shape_problem(op: Op, shape: str, layout: Layout) -> ConvProblem:
    """SHAPES' `shape` as a bf16 `op` without bias, one channel on the side it reduces over."""
    n, many, size, kernel, pad = SHAPES[shape]
    c, k = (1, many) if op is Op.FWD else (many, 1)
    return conv_problem(n, c, k, size, kernel, pad=pad, op=op, dtype=DType.BF16, layout=layout, bias=False)


def _keys():
    out = []
    for op in (Op.FWD, Op.BWD_DATA):
        for shape in SHAPES:
            for lay_name, layout in LAYOUTS.items():
                for algorithm in lower(_shape_problem(op, shape, layout), host_cpu()).candidates:
                    out.append((op, shape, lay_name, algorithm))
    return out


KEYS = _keys()


@pytest.fixture(scope="module")
def kernels():
    plans = [lower(_shape_problem(op, shape, LAYOUTS[lay]), host_cpu(), algorithm=algorithm)
             for op, shape, lay, algorithm in KEYS]
    return dict(zip(KEYS, zip(plans, dispatch.load_plans(plans))))


def _operand(shape, layout: Layout, gen: torch.Generator, specials: bool) -> torch.Tensor:
    t = torch.randn(shape, generator=gen, dtype=torch.float32)
    if specials:   # infinities, NaN and values whose products pass bf16's largest (3.39e38)
        flat = t.view(-1)
        picks = torch.randperm(flat.numel(), generator=gen)[:4 * 8]
        flat[picks[0:8]] = float("inf")
        flat[picks[8:16]] = float("-inf")
        flat[picks[16:24]] = float("nan")
        flat[picks[24:32]] = 3.0e38
    return t.bfloat16().contiguous(memory_format=memory_format(layout, len(shape)))


def test_every_key_has_a_kernel_and_the_lists_are_not_empty():
    assert {(op, shape, lay) for op, shape, lay, _ in KEYS} == {
        (op, shape, lay) for op in (Op.FWD, Op.BWD_DATA) for shape in SHAPES for lay in LAYOUTS}


@pytest.mark.parametrize("op, shape, lay, algorithm", KEYS,
                         ids=[f"{op.value}-{shape}-{lay}-{a}" for op, shape, lay, a in KEYS])
def test_bf16_results_are_the_f32_product_rounded_to_nearest_even(kernels, op, shape, lay, algorithm):
    plan, kernel = kernels[(op, shape, lay, algorithm)]
    problem, layout = plan.problem, LAYOUTS[lay]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{op}{shape}{lay}{algorithm}".encode()))
    specials = shape == "1x1_specials"
    centre = tuple(kk // 2 for kk in problem.kernel)
    w = torch.zeros(problem.weight_shape)
    w[(slice(None), slice(None)) + centre] = torch.randn(problem.weight_shape[:2], generator=gen)
    w = w.bfloat16().contiguous(memory_format=memory_format(layout, w.dim()))
    wc = w[(slice(None), slice(None)) + centre].float()   # [k][c]
    if op is Op.FWD:
        x = _operand(problem.input_shape, layout, gen, specials)
        out = torch.full(problem.output_shape, float("nan"), dtype=torch.bfloat16)
        out = out.contiguous(memory_format=memory_format(layout, out.dim()))
        kernel({"input": x, "weight": w, "bias": None, "output": out}, problem.n, 2)
        exact = x.float() * wc[:, 0].view(1, -1, 1, 1)            # y[b][k] = x[b][0] * w[k][0]
    else:
        gy = _operand(problem.output_shape, layout, gen, specials)
        out = torch.full(problem.input_shape, float("nan"), dtype=torch.bfloat16)
        out = out.contiguous(memory_format=memory_format(layout, out.dim()))
        kernel({"grad_output": gy, "weight": w, "grad_input": out}, problem.n, 2)
        exact = gy.float() * wc[0, :].view(1, -1, 1, 1)          # gx[b][c] = gy[b][0] * w[0][c]
    ref = exact.bfloat16()
    bits = exact.contiguous().view(torch.int32) & 0xFFFF
    assert int((bits == 0x8000).sum()) >= 20, "too few ties to check that they go to even"
    nan = torch.isnan(ref)
    if specials:
        assert nan.any() and torch.isinf(ref).any()
    assert torch.equal(torch.isnan(out), nan), "NaN where torch has none, or a NaN lost (or an output unwritten)"
    got, want = out.float().masked_fill(nan, 0), ref.float().masked_fill(nan, 0)
    wrong = (got.view(torch.int32) != want.view(torch.int32)).nonzero()
    assert wrong.numel() == 0, (f"{wrong.shape[0]} of {got.numel()} outputs differ from the f32 product rounded to "
                                f"nearest even, first at {wrong[0].tolist()}: {got[tuple(wrong[0])].item()!r}, "
                                f"expected {want[tuple(wrong[0])].item()!r} (f32 {exact[tuple(wrong[0])].item()!r})")
