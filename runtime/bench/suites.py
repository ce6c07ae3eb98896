"""The problem sets `convgen bench --suite` times: a curated, commented list of shapes per suite.

A `BenchShape` is one convolution as torch takes it (tensor shapes plus aten.convolution's
arguments), with a name and a comment on what it targets. Every shape is timed forward with a
bias and backward with output_mask [True, True, True] (data, weight and bias gradients).

Suites:
  standard  shapes from common networks that a convolution library must do well on;
  weak      shapes where generic libraries (and convgen) are known to be weak: tiny channel
            counts, depthwise and grouped, long 1-D, odd sizes and per-axis parameters;
  more      layers of other common networks (ResNet-18, VGG, MobileNet, Inception, 1-D, 3-D, ...):
            a check that the heuristics hold beyond the shapes they were tuned on;
  smoke     a few very small shapes for the tests (seconds, not minutes);
  all       standard, then weak.
"""

from __future__ import annotations

import dataclasses

from ..codegen.errors import ConvSpecError
from ..codegen.ir import ConvProblem


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

# Layers of other common networks, beyond the targets: a check that the heuristics hold
# on shapes they were not tuned on (one row each of ResNet, VGG, MobileNet, EfficientNet,
# Inception, AlexNet, ShuffleNet, RegNet, 1-D audio, 3-D video and U-Net layers, plus odd cases).
MORE = [
    S("r18_3x3_128", "ResNet-18 stage 2 3x3: 128 channels at 28x28", (8, 128, 28, 28), (128, 128, 3, 3), padding=1),
    S("r18_3x3_64_s2", "ResNet-18 downsampling 3x3 stride 2, 64 -> 128", (8, 64, 56, 56), (128, 64, 3, 3),
      stride=2, padding=1),
    S("r18_ds_1x1_s2", "ResNet-18 shortcut 1x1 stride 2, 64 -> 128", (8, 64, 56, 56), (128, 64, 1, 1), stride=2),
    S("r18_3x3_512_n1", "ResNet-18 stage 4 3x3 at batch 1", (1, 512, 7, 7), (512, 512, 3, 3), padding=1),
    S("r50_1x1_256_64", "ResNet-50 bottleneck reduction 1x1, 256 -> 64 at 56x56", (8, 256, 56, 56), (64, 256, 1, 1)),
    S("r50_1x1_512_128", "ResNet-50 bottleneck reduction 1x1, 512 -> 128 at 28x28", (8, 512, 28, 28),
      (128, 512, 1, 1)),
    S("r50_1x1_128_512", "ResNet-50 bottleneck expansion 1x1, 128 -> 512 at 28x28", (8, 128, 28, 28),
      (512, 128, 1, 1)),
    S("r50_1x1_1024_256", "ResNet-50 bottleneck reduction 1x1, 1024 -> 256 at 14x14", (8, 1024, 14, 14),
      (256, 1024, 1, 1)),
    S("r50_1x1_256_1024", "ResNet-50 bottleneck expansion 1x1, 256 -> 1024 at 14x14", (8, 256, 14, 14),
      (1024, 256, 1, 1)),
    S("r50_1x1_512_2048", "ResNet-50 stage 4 expansion 1x1, 512 -> 2048 at 7x7", (8, 512, 7, 7), (2048, 512, 1, 1)),
    S("r50_ds_256_512_s2", "ResNet-50 shortcut 1x1 stride 2, 256 -> 512 at 56x56", (8, 256, 56, 56),
      (512, 256, 1, 1), stride=2),
    S("r50_3x3_128", "ResNet-50 stage 2 3x3: 128 channels at 28x28", (8, 128, 28, 28), (128, 128, 3, 3), padding=1),
    S("vgg_3_64", "VGG first layer: 3 -> 64 at 224x224", (2, 3, 224, 224), (64, 3, 3, 3), padding=1),
    S("vgg_64_64", "VGG 3x3, 64 channels at 224x224", (2, 64, 224, 224), (64, 64, 3, 3), padding=1),
    S("vgg_256_256", "VGG 3x3, 256 channels at 56x56", (4, 256, 56, 56), (256, 256, 3, 3), padding=1),
    S("vgg_512_512", "VGG 3x3, 512 channels at 28x28", (4, 512, 28, 28), (512, 512, 3, 3), padding=1),
    S("mb_pw_16_96", "MobileNetV2 expansion 1x1, 16 -> 96 at 112x112: few input channels", (8, 16, 112, 112),
      (96, 16, 1, 1)),
    S("mb_pw_144_24", "MobileNetV2 projection 1x1, 144 -> 24 at 56x56", (8, 144, 56, 56), (24, 144, 1, 1)),
    S("mb_pw_960_160", "MobileNetV2 projection 1x1, 960 -> 160 at 7x7", (8, 960, 7, 7), (160, 960, 1, 1)),
    S("mb_dw_32_112", "MobileNetV2 depthwise 3x3, 32 channels at 112x112", (8, 32, 112, 112), (32, 1, 3, 3),
      padding=1, groups=32),
    S("mb_dw_576_14", "MobileNetV2 depthwise 3x3, 576 channels at 14x14", (8, 576, 14, 14), (576, 1, 3, 3),
      padding=1, groups=576),
    S("mb_dw_960_7", "MobileNetV2 depthwise 3x3, 960 channels at 7x7: rows shorter than a vector",
      (8, 960, 7, 7), (960, 1, 3, 3), padding=1, groups=960),
    S("eff_dw5_240", "EfficientNet depthwise 5x5, 240 channels at 28x28", (8, 240, 28, 28), (240, 1, 5, 5),
      padding=2, groups=240),
    S("eff_dw5_s2", "EfficientNet depthwise 5x5 stride 2, 144 channels at 56x56", (8, 144, 56, 56),
      (144, 1, 5, 5), stride=2, padding=2, groups=144),
    S("mb_stem_s2", "MobileNet stem 3x3 stride 2, 3 -> 32 at 224x224", (8, 3, 224, 224), (32, 3, 3, 3),
      stride=2, padding=1),
    S("incep_1x7", "Inception 1x7, 128 channels at 17x17", (8, 128, 17, 17), (128, 128, 1, 7), padding=(0, 3)),
    S("incep_7x1", "Inception 7x1, 128 -> 192 at 17x17", (8, 128, 17, 17), (192, 128, 7, 1), padding=(3, 0)),
    S("incep_5x5", "Inception 5x5, 48 -> 64 at 35x35", (8, 48, 35, 35), (64, 48, 5, 5), padding=2),
    S("alexnet_g2", "AlexNet 5x5 in 2 groups, 96 -> 256 at 27x27", (8, 96, 27, 27), (256, 48, 5, 5),
      padding=2, groups=2),
    S("rnx_g32_256", "ResNeXt grouped 3x3, 32 groups of 8 channels at 28x28", (8, 256, 28, 28), (256, 8, 3, 3),
      padding=1, groups=32),
    S("shuffle_g3", "ShuffleNet grouped 1x1, 3 groups of 80 channels", (8, 240, 28, 28), (240, 80, 1, 1), groups=3),
    S("regnet_g8", "RegNet grouped 3x3, 8 groups of 8 channels at 56x56", (8, 64, 56, 56), (64, 8, 3, 3),
      padding=1, groups=8),
    S("c1d_64_k5", "1-D conv, 64 channels, kernel 5, length 1024", (16, 64, 1024), (64, 64, 5), padding=2),
    S("c1d_256_k1", "1-D pointwise, 256 channels, length 512", (16, 256, 512), (256, 256, 1)),
    S("c1d_stride2", "1-D kernel 4 stride 2, 128 -> 256, length 2048", (8, 128, 2048), (256, 128, 4),
      stride=2, padding=1),
    S("c1d_small_c", "1-D raw-audio front end: 1 -> 16 channels, kernel 80 stride 4, length 16000",
      (32, 1, 16000), (16, 1, 80), stride=4),
    S("c1d_tconv", "1-D transposed kernel 4 stride 2 (an upsampler), 128 -> 64", (8, 128, 1024), (128, 64, 4),
      stride=2, padding=1, transposed=True),
    S("c1d_dw_k31", "1-D depthwise kernel 31, 256 channels, length 512", (8, 256, 512), (256, 1, 31),
      padding=15, groups=256),
    S("c3d_64", "3-D 3x3x3, 64 channels at 8x28x28 (video)", (2, 64, 8, 28, 28), (64, 64, 3, 3, 3), padding=1),
    S("c3d_1x1", "3-D pointwise, 128 -> 64 at 8x28x28", (2, 128, 8, 28, 28), (64, 128, 1, 1, 1)),
    S("c3d_s2", "3-D 3x3x3 stride 2, 32 -> 64 at 16x56x56", (2, 32, 16, 56, 56), (64, 32, 3, 3, 3),
      stride=2, padding=1),
    S("c3d_stem", "3-D video stem 3x7x7 stride (1,2,2), 3 -> 64 at 16x112x112", (1, 3, 16, 112, 112),
      (64, 3, 3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3)),
    S("unet_up_2x2", "U-Net up-convolution 2x2 stride 2 (transposed), 256 -> 128 at 28x28", (8, 256, 28, 28),
      (256, 128, 2, 2), stride=2, transposed=True),
    S("tconv_3x3_s2_op", "transposed 3x3 stride 2 with output padding, 64 -> 32 at 32x32", (8, 64, 32, 32),
      (64, 32, 3, 3), stride=2, padding=1, output_padding=1, transposed=True),
    S("tconv_s1", "transposed 3x3 stride 1, 64 channels at 28x28", (8, 64, 28, 28), (64, 64, 3, 3), padding=1,
      transposed=True),
    S("tconv_to_rgb", "generator output: transposed 4x4 stride 2, 64 -> 3 at 64x64", (8, 64, 64, 64),
      (64, 3, 4, 4), stride=2, padding=1, transposed=True),
    S("odd_k3_s3", "3x3 stride 3 (no overlap), 32 -> 48 at 99x99", (4, 32, 99, 99), (48, 32, 3, 3), stride=3),
    S("odd_dil3", "3x3 dilation 3, 64 channels at 45x45", (4, 64, 45, 45), (64, 64, 3, 3), padding=3, dilation=3),
    S("odd_nobias", "3x3 without a bias, 64 -> 96 at 30x30", (8, 64, 30, 30), (96, 64, 3, 3), padding=1, bias=False),
    S("small_all", "everything small: 8 channels at 16x16, batch 2", (2, 8, 16, 16), (8, 8, 3, 3), padding=1),
    S("n1_big", "batch 1, 64 channels at 128x128", (1, 64, 128, 128), (64, 64, 3, 3), padding=1),
    S("c_odd_7_13", "odd channel counts 7 -> 13 at 64x64", (4, 7, 64, 64), (13, 7, 3, 3), padding=1),
    S("k1_c3", "1x1 from 3 channels to 16 at 128x128", (4, 3, 128, 128), (16, 3, 1, 1)),
    # added with the strided 1x1, patch and depthwise-plane kernels (2026-11-22)
    S("r50_ds_1024_2048_s2", "ResNet-50 last shortcut 1x1 stride 2, 1024 -> 2048 at 14x14", (8, 1024, 14, 14),
      (2048, 1024, 1, 1), stride=2),
    S("vit_b16_embed", "ViT-B/16 patch embedding 16x16 stride 16, 3 -> 768 at 224x224", (8, 3, 224, 224),
      (768, 3, 16, 16), stride=16),
    S("swin_patch4", "Swin / ConvNeXt stem 4x4 stride 4, 3 -> 96 at 224x224", (8, 3, 224, 224), (96, 3, 4, 4),
      stride=4),
    S("cnx_down_2x2", "ConvNeXt downsampling 2x2 stride 2, 96 -> 192 at 56x56", (8, 96, 56, 56), (192, 96, 2, 2),
      stride=2),
    S("eff_dw5_1152_7", "EfficientNet depthwise 5x5, 1152 channels at 7x7", (8, 1152, 7, 7), (1152, 1, 5, 5),
      padding=2, groups=1152),
]

# Seconds, not minutes: one of each kind of path, for tests/cli/test_bench.py.
SMOKE = [
    S("smoke_3x3", "small 2-D 3x3 with padding", (2, 8, 10, 10), (8, 8, 3, 3), padding=1),
    S("smoke_1d_dil", "small 1-D, dilated", (2, 6, 32), (8, 6, 3), padding=2, dilation=2),
    S("smoke_tconv_s2", "small transposed 2-D, stride 2, output padding 1",
      (2, 6, 5, 5), (6, 4, 3, 3), stride=2, padding=1, transposed=True, output_padding=1),
]

SUITES: dict[str, list[BenchShape]] = {"standard": STANDARD, "weak": WEAK, "more": MORE, "smoke": SMOKE}
COMMENTS = {
    "standard": "common network layers, compute-bound",
    "weak": "shapes generic kernels handle badly: few channels, depthwise/grouped, 1-D, odd sizes",
    "more": "layers of other common networks: do the heuristics hold beyond the targets",
    "smoke": "tiny shapes for the tests",
}
CHOICES = ("standard", "weak", "all", "more", "smoke")


def select(name: str, batch: int | None = None) -> list[tuple[str, list[BenchShape]]]:
    """The (suite name, shapes) pairs that `--suite name` runs; 'all' is standard then weak. `batch`
    (--batch) replaces every shape's batch size: a GPU runs the suites' batch-8 layers in less time
    than a host takes to issue the calls, so its kernels are timed at larger batches."""
    if batch is not None and batch < 1:
        raise ConvSpecError(f"--batch {batch}: need a batch of at least 1")
    if name == "all":
        chosen = [("standard", STANDARD), ("weak", WEAK)]
    elif name in SUITES:
        chosen = [(name, SUITES[name])]
    else:
        raise ConvSpecError(f"--suite {name}: unknown suite; expected one of {', '.join(CHOICES)}")
    if batch is None:
        return chosen
    return [(suite, [dataclasses.replace(s, input=(batch, *s.input[1:])) for s in shapes]) for suite, shapes in chosen]

