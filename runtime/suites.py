"""The problem sets `convgen bench --suite` times: a curated, commented list of shapes per suite.

A `BenchShape` is one convolution as torch takes it (tensor shapes plus aten.convolution's
arguments), with a name and a comment on what it targets. Every shape is timed forward with a
bias and backward with output_mask [True, True, True] (data, weight and bias gradients).

Suites:
  standard  shapes from common networks that a convolution library must do well on;
  weak      shapes where generic libraries (and convgen) are known to be weak: tiny channel
            counts, depthwise and grouped, long 1-D, odd sizes and per-axis parameters;
  smoke     a few very small shapes for the tests (seconds, not minutes);
  all       standard, then weak.
"""

from __future__ import annotations

import dataclasses

from .codegen.errors import ConvSpecError
from .codegen.ir import ConvProblem


@dataclasses.dataclass(frozen=True)
class BenchShape:
    """One benchmark problem: input and weight sizes and aten.convolution's arguments.

    weight is (K, C/groups, *kernel), or for a transposed convolution (C, K/groups, *kernel).
    padding is symmetric per axis (aten.convolution cannot take low/high pairs).
    """

    name: str
    comment: str
    input: tuple[int, ...]
    weight: tuple[int, ...]
    stride: tuple[int, ...] | int = 1
    padding: tuple[int, ...] | int = 0
    dilation: tuple[int, ...] | int = 1
    groups: int = 1
    transposed: bool = False
    output_padding: tuple[int, ...] | int = 0
    bias: bool = True

    @property
    def rank(self) -> int:
        return len(self.input) - 2

    def _axes(self, value) -> list[int]:
        return [value] * self.rank if isinstance(value, int) else list(value)

    def conv_args(self) -> tuple:
        """(stride, padding, dilation, transposed, output_padding, groups), as aten.convolution takes them."""
        return (self._axes(self.stride), self._axes(self.padding), self._axes(self.dilation), self.transposed,
                self._axes(self.output_padding), self.groups)

    @property
    def out_channels(self) -> int:
        return self.weight[1] * self.groups if self.transposed else self.weight[0]

    @classmethod
    def from_problem(cls, problem: ConvProblem, name: str | None = None) -> "BenchShape":
        """The shape of a (forward) ConvProblem, e.g. one given by the CLI's problem flags."""
        if any(lo != hi for lo, hi in problem.padding):
            raise ConvSpecError(f"bench: padding {[list(p) for p in problem.padding]} is asymmetric, which "
                                f"aten.convolution cannot take; give integer padding (or an odd kernel with "
                                f"--padding same)")
        return cls(name=name or problem.name(), comment="given on the command line",
                   input=tuple(problem.input_shape), weight=tuple(problem.weight_shape),
                   stride=tuple(problem.stride), padding=tuple(lo for lo, _ in problem.padding),
                   dilation=tuple(problem.dilation), groups=problem.groups, transposed=problem.transposed,
                   output_padding=tuple(problem.output_padding), bias=problem.bias)

    def describe(self) -> dict:
        stride, padding, dilation, transposed, output_padding, groups = self.conv_args()
        return {"input": list(self.input), "weight": list(self.weight), "stride": stride, "padding": padding,
                "dilation": dilation, "groups": groups, "transposed": transposed,
                "output_padding": output_padding, "bias": self.bias}


S = BenchShape

# ResNet-50 (N8 at 224x224), a DeepLab atrous layer, a 3-D U-Net layer and a DCGAN generator
# layer: the bread and butter of a convolution library, large enough to be compute-bound.
STANDARD = [
    S("r50_3x3_64", "ResNet-50 stage 1 3x3: 64 channels at 56x56, the classic compute-bound 3x3",
      (8, 64, 56, 56), (64, 64, 3, 3), padding=1),
    S("r50_1x1_64_256", "ResNet-50 stage 1 expansion 1x1: a pointwise GEMM, K 4x C, large image",
      (8, 64, 56, 56), (256, 64, 1, 1)),
    S("r50_3x3_128_s2", "ResNet-50 v1.5 downsampling 3x3 stride 2: strided forward, strided data gradient",
      (8, 128, 56, 56), (128, 128, 3, 3), stride=2, padding=1),
    S("r50_3x3_256", "ResNet-50 stage 3 3x3: more channels, small image (14x14)",
      (8, 256, 14, 14), (256, 256, 3, 3), padding=1),
    S("r50_3x3_512", "ResNet-50 stage 4 3x3: 512 channels at 7x7, where edges dominate the image",
      (8, 512, 7, 7), (512, 512, 3, 3), padding=1),
    S("r50_1x1_2048_512", "ResNet-50 stage 4 reduction 1x1: long channel reduction (2048), tiny image",
      (8, 2048, 7, 7), (512, 2048, 1, 1)),
    S("deeplab_dil2", "DeepLab atrous 3x3 dilation 2 at an odd size (33x33)",
      (4, 256, 33, 33), (256, 256, 3, 3), padding=2, dilation=2),
    S("unet3d", "3-D U-Net 3x3x3 on a 16x32x32 volume: rank 3, 27-tap kernel",
      (2, 32, 16, 32, 32), (32, 32, 3, 3, 3), padding=1),
    S("dcgan_tconv", "DCGAN generator 4x4 stride 2 transposed convolution: 16x16 -> 32x32, 128 -> 64",
      (8, 128, 16, 16), (128, 64, 4, 4), stride=2, padding=1, transposed=True),
]

# Shapes with little arithmetic per byte, or whose geometry defeats the usual blocking.
WEAK = [
    S("r50_stem", "ResNet-50 stem 7x7 stride 2: 3 input channels, a large image, a wide kernel",
      (4, 3, 224, 224), (64, 3, 7, 7), stride=2, padding=3),
    S("mbv2_dw", "MobileNetV2 depthwise 3x3 (144 groups of one channel): memory-bound",
      (8, 144, 56, 56), (144, 1, 3, 3), padding=1, groups=144),
    S("mbv2_dw_s2", "MobileNetV2 depthwise 3x3 stride 2 at 112x112: strided and memory-bound",
      (8, 96, 112, 112), (96, 1, 3, 3), stride=2, padding=1, groups=96),
    S("rnx_grouped", "ResNeXt 32x4d grouped 3x3: 32 groups of 4 channels, GEMMs too thin to block",
      (8, 128, 56, 56), (128, 4, 3, 3), padding=1, groups=32),
    S("wavenet_1d", "WaveNet dilated causal-style 1-D conv: length 4096, kernel 3, dilation 4",
      (8, 128, 4096), (128, 128, 3), padding=4, dilation=4),
    S("odd_asym", "odd everything: 17 -> 31 channels, 37x41, 5x3 kernel, per-axis stride/padding/dilation",
      (3, 17, 37, 41), (31, 17, 5, 3), stride=(2, 1), padding=(2, 1), dilation=(1, 2)),
]

# Seconds, not minutes: one of each kind of path, for tests/test_bench.py.
SMOKE = [
    S("smoke_3x3", "small 2-D 3x3 with padding", (2, 8, 10, 10), (8, 8, 3, 3), padding=1),
    S("smoke_1d_dil", "small 1-D, dilated", (2, 6, 32), (8, 6, 3), padding=2, dilation=2),
    S("smoke_tconv_s2", "small transposed 2-D, stride 2, output padding 1",
      (2, 6, 5, 5), (6, 4, 3, 3), stride=2, padding=1, transposed=True, output_padding=1),
]

SUITES: dict[str, list[BenchShape]] = {"standard": STANDARD, "weak": WEAK, "smoke": SMOKE}
COMMENTS = {
    "standard": "common network layers, compute-bound",
    "weak": "shapes generic kernels handle badly: few channels, depthwise/grouped, 1-D, odd sizes",
    "smoke": "tiny shapes for the tests",
}
CHOICES = ("standard", "weak", "all", "smoke")


def select(name: str) -> list[tuple[str, list[BenchShape]]]:
    """The (suite name, shapes) pairs that `--suite name` runs; 'all' is standard then weak."""
    if name == "all":
        return [("standard", STANDARD), ("weak", WEAK)]
    if name not in SUITES:
        raise ConvSpecError(f"--suite {name}: unknown suite; expected one of {', '.join(CHOICES)}")
    return [(name, SUITES[name])]

