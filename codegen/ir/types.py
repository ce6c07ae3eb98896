"""The IR's vocabulary: the pass a problem asks for (`Op`), its element type (`DType`, with every
spelling the command line takes) and a tensor's memory layout (`Layout`)."""

from __future__ import annotations

import enum

from ..errors import ConvSpecError


class Op(str, enum.Enum):
    FWD = "fwd"
    BWD_DATA = "bwd_data"
    BWD_WEIGHT = "bwd_weight"   # with `bias=True`, the bias gradient is fused into the same pass
    BWD_BIAS = "bwd_bias"

    @property
    def short(self) -> str:
        return {"fwd": "fwd", "bwd_data": "bwdd", "bwd_weight": "bwdw", "bwd_bias": "bwdb"}[self.value]


class DType(str, enum.Enum):
    F32 = "f32"
    F64 = "f64"
    BF16 = "bf16"
    F16 = "f16"

    @property
    def itemsize(self) -> int:
        return {"f32": 4, "f64": 8, "bf16": 2, "f16": 2}[self.value]

    @property
    def accumulator(self) -> "DType":
        """Low precision accumulates in f32; f64 in f64."""
        return DType.F64 if self is DType.F64 else DType.F32

    @classmethod
    def parse(cls, text: str, parameter: str = "--dtype") -> "DType":
        """A dtype by any name in DTYPE_NAMES: torch's (float32, float, bfloat16, half, ...) or
        convgen's short ones (f32, bf16, ...), in any case; ConvSpecError names the others."""
        found = DTYPE_NAMES.get(text.strip().lower().removeprefix("torch."))
        if found is None:
            raise ConvSpecError(f"{parameter}: {text!r} is not a dtype convgen generates for; use one of "
                                f"{dtype_names()}")
        return found


# Every spelling of each dtype that the command line takes (DType.parse): torch's names first.
DTYPE_NAMES: dict[str, DType] = {
    "float32": DType.F32, "float": DType.F32, "f32": DType.F32,
    "float64": DType.F64, "double": DType.F64, "f64": DType.F64,
    "bfloat16": DType.BF16, "bf16": DType.BF16,
    "float16": DType.F16, "half": DType.F16, "f16": DType.F16,
}


def dtype_names() -> str:
    """The accepted names, grouped by dtype, for help texts and messages:
    'float32|float|f32, float64|double|f64, bfloat16|bf16, float16|half|f16'."""
    return ", ".join("|".join(n for n, d in DTYPE_NAMES.items() if d is dtype) for dtype in DType)


class Layout(str, enum.Enum):
    CONTIGUOUS = "contiguous"        # N, C, *spatial
    CHANNELS_LAST = "channels_last"  # N, *spatial, C

    def short(self, rank: int) -> str:
        spatial = "dhw"[3 - rank:]
        if self is Layout.CONTIGUOUS:
            return "nc" + spatial
        return "n" + spatial + "c"
