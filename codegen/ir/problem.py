"""The problem IR: `ConvProblem`, a frozen description of one convolution pass.

Shapes follow the caller's view of the convolution: the input x is (n, c, *in_size); the weight
is (k, c/groups, *kernel) for a normal convolution and (c, k/groups, *kernel) for a transposed
one; the output is (n, k, *out_size). Padding is stored as (low, high) pairs per spatial axis.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import ConvSpecError
from ..keys import canonical_json, canonical_key, to_jsonable
from .rules import check_problem
from .types import DType, Layout, Op


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    op: Op
    n: int
    c: int
    k: int
    in_size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    groups: int = 1
    transposed: bool = False
    output_padding: tuple[int, ...] = ()
    dtype: DType = DType.F32
    input_layout: Layout = Layout.CONTIGUOUS
    weight_layout: Layout = Layout.CONTIGUOUS
    output_layout: Layout = Layout.CONTIGUOUS
    bias: bool = False   # FWD: add a bias; BWD_WEIGHT: also produce the bias gradient
    # f32 on a GPU's tf32 matrix instructions (operands rounded to tf32, f32 accumulation): set at
    # dispatch from torch.backends.cudnn.allow_tf32 for GPU targets only; never on a CPU problem.
    # Left out of the canonical form while False, so every key from before it existed stays.
    tf32: bool = False

    def __post_init__(self):
        # no checks here: validate() reports ill-typed fields with a ConvSpecError
        rank = len(self.in_size) if isinstance(self.in_size, tuple) else 0
        if self.output_padding == () and rank:
            object.__setattr__(self, "output_padding", (0,) * rank)

    # --- derived -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.in_size)

    @property
    def out_size(self) -> tuple[int, ...]:
        out = []
        for i, kr, s, (pl, ph), d, op in zip(self.in_size, self.kernel, self.stride, self.padding,
                                             self.dilation, self.output_padding):
            if self.transposed:
                out.append((i - 1) * s - pl - ph + d * (kr - 1) + op + 1)
            else:
                out.append((i + pl + ph - d * (kr - 1) - 1) // s + 1)
        return tuple(out)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        if self.transposed:
            return (self.c, self.k // self.groups, *self.kernel)
        return (self.k, self.c // self.groups, *self.kernel)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.n, self.c, *self.in_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        # ATen's rule for an input with zero channels (normal convolution): the output has zero
        # channels too, whatever the weight says; its gradients are empty or zero.
        k = 0 if self.c == 0 and not self.transposed else self.k
        return (self.n, k, *self.out_size)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the convolution (the same for each of fwd, bwd_data, bwd_weight)."""
        spatial = self.in_size if self.transposed else self.out_size
        cin = self.k if self.transposed else self.c
        cout = self.c if self.transposed else self.k
        return self.n * cout * (cin // max(self.groups, 1)) * math.prod(spatial) * math.prod(self.kernel)

    @property
    def flops(self) -> int:
        if self.op is Op.BWD_BIAS:
            return self.n * self.k * math.prod(self.out_size)
        return 2 * self.macs

    @property
    def bytes_moved(self) -> int:
        """Compulsory traffic: each operand read once, each result written once."""
        x = math.prod(self.input_shape)
        w = math.prod(self.weight_shape)
        y = math.prod(self.output_shape)
        bias = self.k if self.bias else 0
        elems = {Op.FWD: x + w + y + bias, Op.BWD_DATA: y + w + x,
                 Op.BWD_WEIGHT: y + x + w + bias, Op.BWD_BIAS: y + self.k}[self.op]
        return elems * self.dtype.itemsize

    # --- identity ------------------------------------------------------------------------
    def _identity(self) -> dict:
        """The canonical form's fields: all of them, less `tf32` while it is False."""
        fields = to_jsonable(self)
        if not self.tf32:
            del fields["tf32"]
        return fields

    def validate(self) -> "ConvProblem":
        check_problem(self)
        return self

    def to_json(self) -> str:
        return canonical_json(self._identity())

    @classmethod
    def from_dict(cls, d: dict) -> "ConvProblem":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConvSpecError(f"problem: unknown keys {sorted(unknown)}; known keys are {sorted(known)}")
        tup = lambda v: tuple(tuple(x) if isinstance(x, list) else x for x in v)
        return cls(
            op=Op(d["op"]), n=int(d["n"]), c=int(d["c"]), k=int(d["k"]),
            in_size=tup(d["in_size"]), kernel=tup(d["kernel"]), stride=tup(d["stride"]),
            padding=tup(d["padding"]), dilation=tup(d["dilation"]), groups=int(d.get("groups", 1)),
            transposed=bool(d.get("transposed", False)), output_padding=tup(d.get("output_padding", ())),
            dtype=DType(d.get("dtype", "f32")), input_layout=Layout(d.get("input_layout", "contiguous")),
            weight_layout=Layout(d.get("weight_layout", "contiguous")),
            output_layout=Layout(d.get("output_layout", "contiguous")), bias=bool(d.get("bias", False)),
            tf32=bool(d.get("tf32", False)),
        )

    def key(self) -> str:
        # computed once per instance (the runtime asks a problem for its key several times a call;
        # the instance is frozen, so the key cannot go stale)
        key = self.__dict__.get("_key")
        if key is None:
            key = canonical_key(self._identity())
            object.__setattr__(self, "_key", key)
        return key

    def with_batch(self, n: int) -> "ConvProblem":
        return dataclasses.replace(self, n=n)

    def kernel_key(self) -> str:
        """The key of the problem at any batch size: the batch is a run-time argument of kernels."""
        return self.with_batch(-1).key()

    def name(self) -> str:
        """Readable and symbol-safe, e.g. conv2d_bwdw_c64_k128_56x56_r3x3_s2_p1_f32_nhwc."""
        def axes(v):
            return "x".join(str(x) for x in v)

        def uniform(v):
            return str(v[0]) if len(set(v)) == 1 else axes(v)

        kind = "convT" if self.transposed else "conv"
        parts = [f"{kind}{self.rank}d", self.op.short + ("b" if self.bias and self.op in (Op.FWD, Op.BWD_WEIGHT) else ""),
                 f"c{self.c}", f"k{self.k}", axes(self.in_size), f"r{axes(self.kernel)}"]
        if any(s != 1 for s in self.stride):
            parts.append(f"s{uniform(self.stride)}")
        flat = [p for pair in self.padding for p in pair]
        if any(flat):
            sym = all(lo == hi for lo, hi in self.padding)
            parts.append("p" + (uniform([lo for lo, _ in self.padding]) if sym else axes(flat)))
        if any(d != 1 for d in self.dilation):
            parts.append(f"d{uniform(self.dilation)}")
        if self.groups != 1:
            parts.append(f"g{self.groups}")
        if any(self.output_padding):
            parts.append(f"op{uniform(self.output_padding)}")
        parts.append(self.dtype.value + ("_tf32" if self.tf32 else ""))
        layouts = {self.input_layout, self.weight_layout, self.output_layout}
        if layouts != {Layout.CONTIGUOUS}:
            parts.append("".join(lay.short(self.rank) if lay is Layout.CHANNELS_LAST else "c"
                                 for lay in (self.input_layout, self.weight_layout, self.output_layout))
                         if len(layouts) > 1 else self.input_layout.short(self.rank))
        return "_".join(parts)
