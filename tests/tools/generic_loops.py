"""The GPU generic tier's main loops in the machine code: what each issues per tensor-core instruction.

    python tests/tools/generic_loops.py [--target cuda-sm_90] [--dtype bf16] [--layer 8,256,14,14:256,256,3,3]

Renders the generic tier's implicit-GEMM files (codegen/gpu/generic.py) for the target and dtype -- and,
with --layer, the layer kernels of that problem (channels last, padding 1) -- builds each with nvcc
-cubin, and prints every main loop holding tensor instructions (a kernel has one per pair of operand
accesses the launch may pick: 16-byte copies or gathers, hence `copies`): its instructions, tensor
instructions, cp.async copies and non-tensor instructions per 2048 multiply-adds a warp, counted
statically (each instruction of the loop once). Not a test: the figures go to BENCHMARKS.md. Needs
nvcc and nvdisasm (README: the GPU checks).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from convgen.building import machine_code as mc   # noqa: E402
from convgen.codegen.gpu import generic   # noqa: E402
from convgen.codegen.ir import DType, Layout, Op   # noqa: E402
from convgen.codegen.pipeline import lower   # noqa: E402
from convgen.codegen.target import parse_target   # noqa: E402
from support.problems import conv_problem   # noqa: E402


def _loops(sass: str) -> list[tuple[str, int, int, int, float]]:
    """(function, instructions, tensor, copies, non-tensor per 2048 multiply-adds) of each outermost loop
    holding tensor instructions."""
    out = []
    for name, fn in mc.functions(sass).items():
        code, labels = mc.instructions(fn)
        loops = [loop for loop in mc._natural_loops(code, labels) if any(mc.is_tensor(code[i]) for i in loop)]
        for loop in loops:
            if any(loop < other for other in loops):
                continue
            ins = [code[i] for i in sorted(loop)]
            tensor = [x for x in ins if mc.is_tensor(x)]
            macs = sum(mc.multiply_adds(x) for x in tensor)
            copies = sum(1 for x in ins if mc._is_copy(mc._opcode(x)))
            out.append((name, len(ins), len(tensor), copies, (len(ins) - len(tensor)) * 2048 / macs))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cuda-sm_90")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--layer", default="", help="N,C,H,W:K,C,R,S of a layer whose kernels to read too")
    a = ap.parse_args(argv)
    target, dtype = parse_target(a.target), DType(a.dtype)
    sources = [generic.source(kop, dtype, target) for kop in generic.IGEMM_KOPS]
    if a.layer:
        x, w = ([int(v) for v in part.split(",")] for part in a.layer.split(":"))
        for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT):
            problem = conv_problem(x[0], x[1], w[0], tuple(x[2:]), tuple(w[2:]), pad=1, dtype=dtype,
                                   layout=Layout.CHANNELS_LAST, op=op)
            plan = lower(problem, target)
            sources.append(generic.source(plan.kop, dtype, target, layer=plan))
    nvdisasm = mc.cuda_tool("nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        for source in sources:
            cu, cubin = Path(tmp) / f"{source.name}.cu", Path(tmp) / f"{source.name}.cubin"
            cu.write_text(source.text)
            subprocess.run(["nvcc", "-std=c++17", f"-arch={target.isa}", "-cubin", "-o", str(cubin), str(cu)],
                           check=True, capture_output=True)
            sass = subprocess.run([nvdisasm, "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
            for name, total, tensor, copies, per in _loops(sass):
                print(f"{source.name:44s} {name[:48]:48s} instructions {total:5d} tensor {tensor:3d} "
                      f"copies {copies} non-tensor/2048 {per:5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
