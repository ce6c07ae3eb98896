"""The GPU kernels' main loops read in their machine code: what `convgen explain --target cuda-...`
prints beside the compiler's resource report (DESIGN.md "GPU main loops").

nvdisasm (the CUDA toolkit's, or the `nvidia-cuda-nvdisasm` pip package's) turns the cubin nvcc
built into SASS text; each kernel's main loop is the longest backward branch whose range holds
tensor-core instructions. Its instructions are counted statically, once per k-step: the matrix
instructions (HMMA, HGMMA, DMMA) and the multiply-adds they do a warp, the fragment loads (LDSM),
the asynchronous copies (LDGSTS) and everything else; codegen/gpu/resources.py weighs them against
the arch's issue rate and tensor peak.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

# Multiply-adds of the matrix shapes SASS spells without separators (PTX ISA: mma m16n8k16, the
# tf32 m16n8k8 and m16n8k4, the f64 m8n8k4).
_SHAPES = {"16816": 16 * 8 * 16, "1688": 16 * 8 * 8, "1684": 16 * 8 * 4, "884": 8 * 8 * 4}


def nvdisasm() -> str | None:
    """nvdisasm's path: on PATH, beside nvcc, under CUDA_HOME, or in the nvidia-cuda-nvdisasm wheel."""
    return cuda_tool("nvdisasm")


def cuda_tool(name: str) -> str | None:
    """A CUDA binary tool (nvdisasm, cuobjdump) from PATH, nvcc's directory, CUDA_HOME/bin or the
    nvidia-cuda-* pip packages' bin directories; None where none is found."""
    found = shutil.which(name)
    if found:
        return found
    places = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        places.append(Path(nvcc).resolve().parent)
    if os.environ.get("CUDA_HOME"):
        places.append(Path(os.environ["CUDA_HOME"]) / "bin")
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        places += [p.parent for p in Path(root).glob(f"*/bin/{name}")]
    for place in places:
        candidate = place / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def functions(sass: str) -> dict[str, str]:
    """nvdisasm's text split into its functions: mangled name -> the function's text."""
    out = {}
    for part in re.split(r"\n\s*\.text\.", sass)[1:]:
        name = re.match(r"[\w$.]+", part)
        if name:
            out[name.group(0).rstrip(":")] = part
    return out


def instructions(function: str) -> tuple[list[str], dict[str, int]]:
    """A function's instructions (predicate, opcode and operands), and its labels' positions."""
    labels, out = {}, []
    for line in function.splitlines():
        if m := re.match(r"\s*(\.L_x_\d+):", line):
            labels[m.group(1)] = len(out)
        elif m := re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line):
            out.append(m.group(1))
    return out, labels


def _opcode(instruction: str) -> str:
    """`HMMA.16816.F32.BF16` from `@P0 HMMA.16816.F32.BF16 R4, ...` (the predicate dropped)."""
    words = instruction.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def is_tensor(instruction: str) -> bool:
    return _opcode(instruction).split(".")[0] in ("HMMA", "HGMMA", "DMMA", "IMMA")


def _successors(code: list[str], labels: dict[str, int]) -> list[list[int]]:
    """Each instruction's successors: the next one, a branch's target, both for a predicated branch
    (`@PT` always, `@!PT` never); none after an unconditional EXIT or RET."""
    out = []
    for i, x in enumerate(code):
        guard = x.split()[0] if x.startswith("@") else None
        always, never = guard in (None, "@PT"), guard == "@!PT"
        op = _opcode(x)
        m = re.search(r"(\.L_x_\d+)", x) if op.startswith("BRA") else None
        nexts = []
        if m and m.group(1) in labels:
            if not never:
                nexts.append(labels[m.group(1)])
            if not always:
                nexts.append(i + 1)
        elif op.startswith(("EXIT", "RET")):
            if not always:
                nexts.append(i + 1)
        else:
            nexts.append(i + 1)
        out.append([j for j in nexts if j < len(code)])
    return out


def _natural_loops(code: list[str], labels: dict[str, int]) -> list[set[int]]:
    """The natural loops of the function's control flow (a back edge's header and every
    instruction that reaches the edge without passing the header), one per header; an edge back to
    an instruction that does not dominate it is no loop."""
    succ = _successors(code, labels)
    preds: list[list[int]] = [[] for _ in code]
    for i, nexts in enumerate(succ):
        for j in nexts:
            preds[j].append(i)
    loops: dict[int, set[int]] = {}
    for tail, nexts in enumerate(succ):
        for head in nexts:
            if head > tail:
                continue
            body, stack = {head}, [tail]
            while stack:
                n = stack.pop()
                if n not in body:
                    body.add(n)
                    stack.extend(preds[n])
            # the entry reaches the tail around the head: a jump back from out-of-line code (a
            # shuffle's divergent path rejoining), not a loop the head dominates
            if head == 0 or 0 not in body:
                loops[head] = loops.get(head, set()) | body
    return list(loops.values())


def _main_and_nested(code: list[str], labels: dict[str, int]) -> tuple[list[int], list[int]]:
    """The main loop's instruction positions outside the loops nested in it, and those inside."""
    loops = _natural_loops(code, labels)
    tensor = [b for b in loops if any(is_tensor(code[i]) for i in b)]
    # a kernel with 16-byte copies has a second main loop, gathering elements, for unaligned
    # pointers (templates/gpu/igemm.cu.j2 block_gemm): the copies' loop is the one that runs
    copying = [b for b in tensor if any(_opcode(code[i]).startswith("LDGSTS") for i in b)]
    if not tensor:
        return list(range(len(code))), []
    main = max(copying or tensor, key=len)
    inner = set()
    for b in loops:
        if b is not main and b <= main:
            inner |= b
    return sorted(main - inner), sorted(inner)


def main_loop(function: str) -> list[str]:
    """The instructions of a kernel's main loop in nvdisasm's text of its function: the largest
    natural loop holding tensor-core instructions (and cp.async copies, where a loop does: the
    aligned operands' loop, not the gathering one), with the loops nested in it, in address order;
    the whole function where the reduction's steps are so few that ptxas unrolled them all.
    (A never-executed `@!PT LDS RZ, [RZ]` that ptxas puts after cp.async keeps its `@!PT`.)"""
    code, labels = instructions(function)
    outer, inner = _main_and_nested(code, labels)
    return [code[i] for i in sorted(outer + inner)]


def main_loop_parts(function: str) -> tuple[list[str], list[str]]:
    """The main loop's instructions outside the loops nested in it, and those inside them (element
    gathers: of an operand moved element by element, every k-step; of unaligned operands, only in
    the gathering loop)."""
    code, labels = instructions(function)
    outer, inner = _main_and_nested(code, labels)
    return [code[i] for i in outer], [code[i] for i in inner]


def multiply_adds(instruction: str) -> int:
    """Multiply-adds a warp does in one tensor instruction (0 for others): its shape spelled
    `16816` (HMMA.16816: m16 n8 k16) or `8x8x4` (DMMA.8x8x4); HGMMA.64xNx16 is a warpgroup's, a
    quarter of it a warp's."""
    parts = _opcode(instruction).split(".")
    if parts[0] not in ("HMMA", "HGMMA", "DMMA", "IMMA") or len(parts) < 2:
        return 0
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", parts[1])
    macs = int(m.group(1)) * int(m.group(2)) * int(m.group(3)) if m else _SHAPES.get(parts[1], 0)
    return macs // 4 if parts[0] == "HGMMA" else macs


@dataclasses.dataclass(frozen=True)
class LoopMix:
    """A main loop's instructions outside the loops nested in it, counted statically (each once, as
    one k-step issues them), and how many sit in nested loops (not counted: see main_loop_parts)."""

    total: int
    tensor: int          # HMMA / HGMMA / DMMA
    multiply_adds: int   # what those do, a warp
    ldsm: int            # ldmatrix fragment loads
    ldgsts: int          # cp.async copies
    nested: int          # instructions in loops nested in it

    @property
    def other(self) -> int:
        return self.total - self.tensor

    @property
    def per_2048(self) -> float:
        """Non-tensor instructions per 2048 multiply-adds a warp (one HMMA.16816's worth)."""
        return self.other * 2048 / self.multiply_adds if self.multiply_adds else float("inf")


def loop_mix(function: str) -> LoopMix | None:
    """The mix of a function's main loop; None where it issues no tensor instruction."""
    loop, nested = main_loop_parts(function)
    tensor = [x for x in loop if is_tensor(x)]
    if not tensor:
        return None
    return LoopMix(len(loop), len(tensor), sum(multiply_adds(x) for x in tensor),
                   sum(1 for x in loop if _opcode(x).startswith("LDSM")),
                   sum(1 for x in loop if _opcode(x).startswith("LDGSTS")), len(nested))


def read_cubin(cubin: Path) -> dict[str, LoopMix]:
    """Each kernel of `cubin` that uses the tensor cores: its mangled name -> its main loop's mix.
    Raises OSError or subprocess.CalledProcessError where nvdisasm is missing or fails."""
    tool = nvdisasm()
    if tool is None:
        raise FileNotFoundError("nvdisasm not found (the CUDA toolkit, or pip install nvidia-cuda-nvdisasm)")
    sass = subprocess.run([tool, str(cubin)], capture_output=True, text=True, check=True, timeout=300).stdout
    mixes = {name: loop_mix(body) for name, body in functions(sass).items()}
    return {name: mix for name, mix in mixes.items() if mix is not None}

