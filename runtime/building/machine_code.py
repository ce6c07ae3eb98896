"""The GPU kernels' main loops read in their machine code: what `convgen explain --target cuda-...|hip-...`
prints beside the compiler's resource report (DESIGN.md "GPU main loops").

nvdisasm (the CUDA toolkit's, or the `nvidia-cuda-nvdisasm` pip package's) turns the cubin nvcc
built into SASS text; each kernel's main loop is the longest backward branch whose range holds
tensor-core instructions. Its instructions are counted statically, once per k-step: the matrix
instructions (HMMA, HGMMA, DMMA) and the multiply-adds they do a warp, the fragment loads (LDSM),
the asynchronous copies (LDGSTS) and everything else; codegen/gpu/resources.py weighs them against
the arch's issue rate and tensor peak.

HIP: hipcc's device assembly (`-S --cuda-device-only`, AMDGPU mnemonics) is read the same way
(`read_hip`): the matrix instructions are the MFMAs (v_mfma_*, M x N x K multiply-adds a wave), the
fragment loads ds_read_b128, the 16-byte copies global_load_dwordx4 (hip.h stages them through
registers: the loop holding them is the aligned operands' one); branches are s_branch and
s_cbranch_*.
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
    op = _opcode(instruction)
    return op.split(".")[0] in ("HMMA", "HGMMA", "DMMA", "IMMA") or op.startswith("v_mfma")


def _is_fragment_load(op: str) -> bool:
    return op.startswith("LDSM") or op == "ds_read_b128"


def _is_copy(op: str) -> bool:
    return op.startswith("LDGSTS") or op == "global_load_dwordx4"


# --- AMDGPU assembly (hipcc -S) ---------------------------------------------------------------------

def amd_functions(asm: str) -> dict[str, str]:
    """hipcc's device assembly split into its functions: mangled name -> the function's text."""
    out, name, lines = {}, None, []
    for line in asm.splitlines():
        if m := re.match(r"(_Z[\w$.]+):", line):
            name, lines = m.group(1), []
        elif name and line.startswith(".Lfunc_end"):
            out[name] = "\n".join(lines)
            name = None
        elif name:
            lines.append(line)
    return out


def amd_instructions(function: str) -> tuple[list[str], dict[str, int]]:
    """A function's instructions (mnemonic and operands, comments dropped) and its labels' positions."""
    labels, out = {}, []
    for line in function.splitlines():
        text = line.split(";", 1)[0].strip()
        if m := re.match(r"(\.LBB\w+):", text):
            labels[m.group(1)] = len(out)
        elif text and not text.startswith(".") and not text.endswith(":"):
            out.append(text)
    return out, labels


def _amd_successors(code: list[str], labels: dict[str, int]) -> list[list[int]]:
    """Each instruction's successors: s_branch's target, an s_cbranch_*'s target and the next one,
    none after s_endpgm or a return (s_setpc_b64)."""
    out = []
    for i, x in enumerate(code):
        op = _opcode(x)
        target = re.search(r"(\.LBB\w+)", x) if op.startswith(("s_branch", "s_cbranch")) else None
        if target and target.group(1) in labels:
            nexts = [labels[target.group(1)]] + ([] if op == "s_branch" else [i + 1])
        elif op in ("s_endpgm", "s_setpc_b64"):
            nexts = []
        else:
            nexts = [i + 1]
        out.append([j for j in nexts if j < len(code)])
    return out


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


def _retreating(succ: list[list[int]]) -> list[tuple[int, int]]:
    """The edges (tail, head) of a depth-first walk from instruction 0 whose head is on the walk's
    stack (an ancestor of the tail): a reducible graph's back edges."""
    state = [0] * len(succ)   # 0 unseen, 1 on the stack, 2 done
    out, stack = [], [(0, 0)] if succ else []
    if succ:
        state[0] = 1
    while stack:
        node, k = stack[-1]
        if k < len(succ[node]):
            stack[-1] = (node, k + 1)
            nxt = succ[node][k]
            if state[nxt] == 1:
                out.append((node, nxt))
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, 0))
        else:
            state[node] = 2
            stack.pop()
    return out


def _natural_loops(code: list[str], labels: dict[str, int], amd: bool = False) -> list[set[int]]:
    """The natural loops of the function's control flow (a back edge's header and every
    instruction that reaches the edge without passing the header), one per header; an edge back to
    an instruction that does not dominate it is no loop. `amd`: hipcc's assembly."""
    succ = (_amd_successors if amd else _successors)(code, labels)
    preds: list[list[int]] = [[] for _ in code]
    for i, nexts in enumerate(succ):
        for j in nexts:
            preds[j].append(i)
    # back-edge candidates: jumps backwards in SASS (nvdisasm lays a loop out from its header);
    # hipcc rotates loops (a header may sit after blocks of its body), so there the retreating edges
    # of a depth-first walk from the entry
    edges = (_retreating(succ) if amd else
             [(tail, head) for tail, nexts in enumerate(succ) for head in nexts if head <= tail])
    loops: dict[int, set[int]] = {}
    for tail, head in edges:
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


def _is_wait(op: str) -> bool:
    """An mbarrier's phase check (mbarrier.try_wait / test_wait: SYNCS.PHASECHK), which a wait retries."""
    return op.startswith("SYNCS.PHASECHK")


def _main_and_nested(code: list[str], labels: dict[str, int], amd: bool = False) -> tuple[list[int], list[int]]:
    """The main loop's instruction positions outside the loops nested in it, and those inside."""
    loops = _natural_loops(code, labels, amd)
    tensor = [b for b in loops if any(is_tensor(code[i]) for i in b)]
    # a kernel with 16-byte copies has a second main loop, gathering elements, for unaligned
    # pointers (templates/gpu/igemm.cu.j2 block_gemm): the copies' loop is the one that runs
    copying = [b for b in tensor if any(_is_copy(_opcode(code[i])) for i in b)]
    if not tensor:
        return _unrolled(code), []
    main = max(copying or tensor, key=len)
    inner = set()
    for b in loops:
        if b is not main and b <= main:
            inner |= b
    return sorted(main - inner), sorted(inner)


def _unrolled(code: list[str]) -> list[int]:
    """Where every k-step is unrolled: from the first 16-byte copy (the copies' instantiation of
    block_gemm, where the kernel has one; else the start) to the last tensor instruction before the
    first global store after one (the epilogue, and the other instantiation, left out)."""
    tensor = [i for i, x in enumerate(code) if is_tensor(x)]
    if not tensor:
        return list(range(len(code)))
    start = next((i for i, x in enumerate(code) if _is_copy(_opcode(x))), 0)
    if not any(t >= start for t in tensor):
        start = 0
    first = min(t for t in tensor if t >= start)
    end = next((i for i in range(first, len(code)) if _is_global_store(_opcode(code[i]))), len(code))
    return list(range(start, max(t for t in tensor if first <= t < end) + 1))


def _is_global_store(op: str) -> bool:
    return op.startswith(("STG", "global_store", "buffer_store", "flat_store"))


def main_loop(function: str) -> list[str]:
    """The instructions of a kernel's main loop in nvdisasm's text of its function: the largest
    natural loop holding tensor-core instructions (and cp.async copies, where a loop does: the
    aligned operands' loop, not the gathering one), with the loops nested in it, in address order;
    where the reduction's steps are so few that ptxas unrolled them all, the unrolled steps from the
    first copy to the last tensor instruction (_unrolled: the epilogue left out).
    (A never-executed `@!PT LDS RZ, [RZ]` that ptxas puts after cp.async keeps its `@!PT`.)"""
    code, labels = instructions(function)
    outer, inner = _main_and_nested(code, labels)
    return [code[i] for i in sorted(outer + inner)]


def main_loop_parts(function: str, amd: bool = False) -> tuple[list[str], list[str]]:
    """The main loop's instructions outside the loops nested in it, and those inside them (element
    gathers: of an operand moved element by element, every k-step; of unaligned operands, only in
    the gathering loop; an mbarrier wait's retries: wait_loops). `amd`: the function is hipcc's
    assembly, not nvdisasm's SASS."""
    code, labels = (amd_instructions if amd else instructions)(function)
    outer, inner = _main_and_nested(code, labels, amd)
    return [code[i] for i in outer], [code[i] for i in inner]


def _waits(code: list[str], labels: dict[str, int], inner: list[int]) -> list[int]:
    """The positions among `inner` (the main loop's nested loops) of the loops that retry an
    mbarrier's phase check."""
    nested, waits = set(inner), set()
    for body in _natural_loops(code, labels):
        if body <= nested and any(_is_wait(_opcode(code[i])) for i in body):
            waits |= body
    return sorted(waits)


def wait_loops(function: str) -> list[str]:
    """The instructions of the loops nested in the main loop that retry an mbarrier's phase check (a
    warp-specialised kernel's wait for its stage: run again only while the stage is not ready, not a
    k-step's work)."""
    code, labels = instructions(function)
    return [code[i] for i in _waits(code, labels, _main_and_nested(code, labels)[1])]


def multiply_adds(instruction: str) -> int:
    """Multiply-adds a warp does in one tensor instruction (0 for others): its shape spelled
    `16816` (HMMA.16816: m16 n8 k16) or `8x8x4` (DMMA.8x8x4); HGMMA.64xNx16 is a warpgroup's, a
    quarter of it a warp's."""
    op = _opcode(instruction)
    if op.startswith("v_mfma"):   # v_mfma_f32_16x16x16bf16_1k, v_mfma_f64_16x16x4f64: M x N x K, a wave's
        m = re.search(r"_(\d+)x(\d+)x(\d+)", op)
        return int(m.group(1)) * int(m.group(2)) * int(m.group(3)) if m else 0
    parts = op.split(".")
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
    tensor: int          # HMMA / HGMMA / DMMA (HIP: v_mfma)
    multiply_adds: int   # what those do, a warp (a wave)
    ldsm: int            # ldmatrix fragment loads (HIP: ds_read_b128)
    ldgsts: int          # cp.async copies (HIP: global_load_dwordx4, the copies' global half)
    nested: int          # instructions in loops nested in it (element gathers; not the waits')
    waits: int = 0       # instructions in nested loops that retry an mbarrier wait (wait_loops)

    @property
    def other(self) -> int:
        return self.total - self.tensor

    @property
    def per_2048(self) -> float:
        """Non-tensor instructions per 2048 multiply-adds a warp (one HMMA.16816's worth)."""
        return self.other * 2048 / self.multiply_adds if self.multiply_adds else float("inf")


def loop_mix(function: str, amd: bool = False) -> LoopMix | None:
    """The mix of a function's main loop; None where it issues no tensor instruction. `amd`: hipcc's
    assembly."""
    code, labels = (amd_instructions if amd else instructions)(function)
    outer, inner = _main_and_nested(code, labels, amd)
    loop = [code[i] for i in outer]
    tensor = [x for x in loop if is_tensor(x)]
    if not tensor:
        return None
    waits = 0 if amd else len(_waits(code, labels, inner))
    return LoopMix(len(loop), len(tensor), sum(multiply_adds(x) for x in tensor),
                   sum(1 for x in loop if _is_fragment_load(_opcode(x))),
                   sum(1 for x in loop if _is_copy(_opcode(x))), len(inner) - waits, waits)


def read_cubin(cubin: Path) -> dict[str, LoopMix]:
    """Each kernel of `cubin` that uses the tensor cores: its mangled name -> its main loop's mix.
    Raises OSError or subprocess.CalledProcessError where nvdisasm is missing or fails."""
    tool = nvdisasm()
    if tool is None:
        raise FileNotFoundError("nvdisasm not found (the CUDA toolkit, or pip install nvidia-cuda-nvdisasm)")
    sass = subprocess.run([tool, str(cubin)], capture_output=True, text=True, check=True, timeout=300).stdout
    mixes = {name: loop_mix(body) for name, body in functions(sass).items()}
    return {name: mix for name, mix in mixes.items() if mix is not None}


def hip_assembly_command(hipcc: str, arch: str, src: str, out: str) -> list[str]:
    """hipcc's device assembly of a kernel file for `arch`, as the artifact's build optimises it."""
    return [hipcc, "-x", "hip", f"--offload-arch={arch}", "-O3", "-S", "--cuda-device-only", src, "-o", out]


def read_hip(source_text: str, arch: str, hipcc: str, workdir: Path) -> dict[str, LoopMix]:
    """Each kernel of a HIP source that uses the matrix cores: its mangled name -> its main loop's mix,
    read from hipcc's assembly for `arch` (written under `workdir`). Raises OSError or
    subprocess.CalledProcessError where hipcc fails."""
    src, out = workdir / "kernel.hip", workdir / "kernel.s"
    src.write_text(source_text, encoding="utf-8")
    env = dict(os.environ, HIP_PLATFORM="amd")
    subprocess.run(hip_assembly_command(hipcc, arch, str(src), str(out)), capture_output=True, text=True, check=True,
                   timeout=600, env=env, stdin=subprocess.DEVNULL)
    mixes = {name: loop_mix(body, amd=True) for name, body in amd_functions(out.read_text(encoding="utf-8")).items()}
    return {name: mix for name, mix in mixes.items() if mix is not None}
