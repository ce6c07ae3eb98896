"""The correctness cases of CASES.md, items 1-22: the curated list, the operands of each run and
the check of one run against ATen in float64 (api/test_cases.py runs them through the CPU kernels;
the GPU tests in the simulator and the vendor compilers' builds take them too).

A run is a case, a dtype and an operand layout variant:

    contiguous            every tensor contiguous
    channels_last         input channels-last (4-D: channels_last, 5-D: channels_last_3d)
    channels_last_weight  weight channels-last
    noncontig_input       input a strided view: repeat_interleave(x, 2, -1)[..., ::2]
    noncontig_grad        grad_output the same kind of view

(3-D tensors have no channels-last format, so the two channels-last variants do not exist for
the 1-D cases.) grad_output otherwise has the memory format of torch's forward output, as it
would coming back through autograd.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import convgen

from support.reference import (Aten, assert_close, assert_same_format, channels_last_format, generator_for,
                               non_contiguous, randn, reduction_terms)


@dataclasses.dataclass(frozen=True)
class Case:
    """One convolution, in CASES.md's notation: input (N, C, *spatial), K output channels, kernel."""

    id: str
    input: tuple[int, ...]
    k: int
    kernel: tuple[int, ...]
    stride: int | tuple[int, ...] = 1
    padding: int | tuple[int, ...] | str = 0
    dilation: int | tuple[int, ...] = 1
    groups: int = 1
    transposed: bool = False
    output_padding: int | tuple[int, ...] = 0

    @property
    def rank(self) -> int:
        return len(self.input) - 2

    @property
    def weight(self) -> tuple[int, ...]:
        c = self.input[1]
        if self.transposed:
            return (c, self.k // self.groups, *self.kernel)
        return (self.k, c // self.groups, *self.kernel)

    def args(self) -> tuple:
        """stride, padding, dilation, transposed, output_padding, groups (ATen's order, minus tensors)."""
        return (self.stride, self.padding, self.dilation, self.transposed, self.output_padding, self.groups)

    def aten(self) -> Aten:
        return Aten(*self.args(), rank=self.rank, kernel=self.kernel)


def chain_layer(i: int, c: int, k: int, size: int) -> Case:
    return Case(f"18{'abc'[i]}-transposed-chain-layer{i + 1}-{c}to{k}-{size}x{size}", (1, c, size, size), k,
                (3, 3), stride=2, padding=1, transposed=True, output_padding=1)


# (channels, spatial size) along case 18's chain of transposed layers: 128 → 64 → 32 → 3.
CHAIN = [(128, 6), (64, 12), (32, 24), (3, 48)]
CHAIN_LAYERS = [chain_layer(i, c, k, size) for i, ((c, size), (k, _)) in enumerate(zip(CHAIN, CHAIN[1:]))]


def resnet(tag: str, c: int, k: int, size: int, kernel: int, stride: int, padding: int, why: str) -> list[Case]:
    """A ResNet-18-like layer (channels cut and spatial sizes kept small), at batch 1 and 2."""
    return [Case(f"21{tag}-resnet-{why}-batch{n}", (n, c, size, size), k, (kernel, kernel), stride=stride,
                 padding=padding) for n in (1, 2)]


CASES = [
    # 1: padding as large as the kernel allows (pad 2 with a 3-wide kernel), stride 2
    Case("01-padding-as-large-as-kernel-allows", (1, 3, 4, 4), 3, (3, 3), stride=2, padding=2),
    # 2: per-axis stride and padding, dilation 4 (dilated kernel 9 on an 8+pad input), 2 groups
    Case("02-mixed-stride-padding-dilation4-groups2", (2, 4, 8, 8), 2, (3, 3), stride=(3, 2), padding=(2, 1),
         dilation=4, groups=2),
    # 3: an even kernel with per-axis dilation
    Case("03-even-kernel-per-axis-dilation", (1, 4, 5, 5), 1, (2, 3), stride=2, padding=1, dilation=(2, 3)),
    # 4: a kernel 4 wide on an input 3 wide: fits only thanks to the padding
    Case("04-kernel-wider-than-input", (1, 2, 4, 3), 4, (3, 4), stride=2, padding=1),
    # 5: 'same' with an even kernel and dilation 3: padding (1, 2) on H, asymmetric
    Case("05-same-padding-even-kernel-asymmetric", (1, 4, 5, 5), 1, (2, 3), padding="same", dilation=3),
    # 6: depthwise (one input channel per group, multiplier 1)
    Case("06-depthwise", (2, 4, 6, 6), 4, (3, 3), groups=4),
    # 7: depthwise with channel multiplier 2
    Case("07-depthwise-multiplier2", (2, 4, 6, 6), 8, (3, 3), groups=4),
    # 8: grouped, non-square kernel and input
    Case("08-grouped-nonsquare", (2, 4, 6, 5), 6, (3, 2), groups=2),
    # 9: few input channels (2) and many output channels (8) per group
    Case("09-few-input-channels-per-group", (2, 4, 6, 6), 16, (3, 3), groups=2),
    # 10: pointwise (1x1, a GEMM over channels)
    Case("10-pointwise", (2, 3, 5, 5), 3, (1, 1)),
    # 11: pointwise depthwise on a larger image (CASES.md names channels-last: a variant below)
    Case("11-pointwise-depthwise", (1, 16, 56, 56), 16, (1, 1), groups=16),
    # 12: dilation 2 with 16 groups of one input and two output channels
    Case("12-dilation2-groups16", (2, 16, 11, 13), 32, (3, 3), dilation=2, groups=16),
    # 13: stride 10 along W, larger than the kernel (5): input columns that no output reads
    Case("13-stride-larger-than-kernel", (2, 2, 4, 20), 2, (3, 5), stride=(1, 10), groups=2),
    # 14: height 1, so contiguous and channels-last strides are ambiguous
    Case("14-height1-ambiguous-format", (4, 2, 1, 8), 4, (1, 1)),
    # 15: empty: zero batch, zero channels, both; shapes as torch's, gradients zero
    Case("15a-empty-batch0", (0, 6, 7, 8), 12, (3, 3), groups=3),
    Case("15b-empty-channels0", (2, 0, 7, 8), 12, (3, 3), groups=3),
    Case("15c-empty-batch0-channels0", (0, 0, 7, 8), 12, (3, 3), groups=3),
    # 16: transposed twin of case 1, with output_padding 1
    Case("16-transposed-output-padding", (1, 3, 4, 4), 3, (3, 3), stride=2, padding=2, transposed=True,
         output_padding=1),
    # 17: transposed depthwise
    Case("17-transposed-groups4", (2, 4, 4, 4), 4, (3, 3), groups=4, transposed=True),
    # 18: each layer of a decoder-like chain of transposed layers (the chain itself: api/test_cases.py)
    *CHAIN_LAYERS,
    # 19: 1-D: strided, padded and dilated; and an audio-like long sequence with dilation 4
    Case("19a-1d-stride2-padding2-dilation2", (4, 8, 50), 16, (5,), stride=2, padding=2, dilation=2),
    Case("19b-1d-audio-long-dilation4", (8, 32, 4096), 32, (3,), dilation=4),
    # 20: 3-D: a 3x1x9 kernel on a 3x1x9 volume with groups, stride 1 and 2; and a dense 3x3x3
    Case("20a-3d-3x1x9-groups3-stride1", (3, 9, 3, 1, 9), 3, (3, 1, 9), stride=1, groups=3),
    Case("20b-3d-3x1x9-groups3-stride2", (3, 9, 3, 1, 9), 3, (3, 1, 9), stride=2, groups=3),
    Case("20c-3d-3x3x3-padding1", (2, 8, 6, 10, 10), 16, (3, 3, 3), stride=1, padding=1),
    # 21: ResNet-like layers at batch 1 and 2 (channels and images kept small)
    *resnet("a", 3, 16, 32, 7, 2, 3, "stem-7x7-stride2"),
    *resnet("b", 64, 64, 14, 3, 1, 1, "block-3x3"),
    *resnet("c", 32, 64, 14, 3, 2, 1, "downsampling-3x3-stride2"),
    *resnet("d", 32, 64, 14, 1, 2, 0, "shortcut-1x1-stride2"),
]
BY_ID = {case.id: case for case in CASES}
assert len(BY_ID) == len(CASES), "case ids must be unique"

# 22: every supported dtype on a few of the cases above (grouped and dilated, depthwise, transposed,
# 1-D, 3-D, a 576-term reduction): bf16 and f16 accumulate in f32.
LOW_PRECISION_CASES = ["02-mixed-stride-padding-dilation4-groups2", "07-depthwise-multiplier2",
                       "16-transposed-output-padding", "19a-1d-stride2-padding2-dilation2", "20c-3d-3x3x3-padding1",
                       "21b-resnet-block-3x3-batch2"]

VARIANTS = ["contiguous", "channels_last", "channels_last_weight", "noncontig_input", "noncontig_grad"]
DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}

# (input, weight, bias) gradients: the 7 non-empty masks; [F, F, F] is checked on its own.
MASKS = [m for m in itertools.product([True, False], repeat=3) if any(m)]
NAMES = ("grad_input", "grad_weight", "grad_bias")


def variants_of(case: Case) -> list[str]:
    if channels_last_format(len(case.input)) is None:   # 1-D: no channels-last format exists
        return [v for v in VARIANTS if not v.startswith("channels_last")]
    return VARIANTS


def runs() -> list:
    """Every run of CASES.md's cases on the CPU, as pytest params (case, dtype, variant): each case
    in f32 and f64, and the low-precision ones also in bf16 and f16, in every variant it has."""
    params = []
    for case in CASES:
        for dtype in ["f32", "f64"] + (["bf16", "f16"] if case.id in LOW_PRECISION_CASES else []):
            for variant in variants_of(case):
                params.append(pytest.param(case, DTYPES[dtype], variant, id=f"{case.id}-{dtype}-{variant}"))
    return params


@dataclasses.dataclass
class Operands:
    x: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor
    gy: torch.Tensor


def operands(case: Case, dtype: torch.dtype, variant: str) -> Operands:
    """Fresh random operands for one test, laid out as `variant` says (same values on every run)."""
    gen = generator_for(f"{case.id}-{dtype}-{variant}")
    cl = channels_last_format(len(case.input))
    x = randn(case.input, dtype, gen, cl if variant == "channels_last" else torch.contiguous_format)
    w = randn(case.weight, dtype, gen, cl if variant == "channels_last_weight" else torch.contiguous_format)
    b = randn((case.k,), dtype, gen)
    if variant == "noncontig_input":
        x = non_contiguous(x)
    native = case.aten().forward(x, w, b)
    # grad_output in the memory format of torch's result, as autograd would hand it back
    gy = torch.empty_like(native).copy_(randn(native.shape, dtype, gen))
    if variant == "noncontig_grad":
        gy = non_contiguous(gy)
    return Operands(x, w, b, gy)


def check_case(case: Case, dtype: torch.dtype, ops: Operands, masks=MASKS, tf32: bool = False) -> None:
    """Forward and the backward `masks` of `case` against the float64 reference and torch's formats;
    the operands must come out unchanged. `tf32`: f32 on tf32 matrix instructions (its bound)."""
    aten = case.aten()
    x, w, b, gy = ops.x, ops.w, ops.b, ops.gy
    before = [t.clone() for t in (x, w, b, gy)]

    y = convgen.convolution(x, w, b, *case.args())
    terms = reduction_terms(x.shape, w.shape, y.shape)
    assert_close(y, aten.forward64(x, w, b), dtype, "forward", terms["forward"], tf32)
    assert_same_format(y, aten.forward(x, w, b), "forward")

    for mask in masks:
        got = convgen.convolution_backward(gy, x, w, [case.k], *case.args(), list(mask))
        ref = aten.backward64(gy, x, w, [case.k], mask)
        native = aten.backward(gy, x, w, [case.k], mask)
        assert isinstance(got, tuple) and len(got) == 3
        for name, wanted, g, r, nat in zip(NAMES, mask, got, ref, native):
            what = f"{name} (output_mask={list(mask)})"
            if not wanted:
                assert g is None, f"{what}: masked off, but convgen returned a tensor"
                continue
            assert_close(g, r, dtype, what, terms[name], tf32)
            assert_same_format(g, nat, what)

    none = convgen.convolution_backward(gy, x, w, [case.k], *case.args(), [False, False, False])
    assert none == (None, None, None)
    for name, t, saved in zip(("input", "weight", "bias", "grad_output"), (x, w, b, gy), before):
        assert torch.equal(t, saved), f"convgen changed its operand {name}"
