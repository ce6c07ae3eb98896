"""The GPU emitter: a finished `Plan` for a CUDA or HIP target → one self-contained `KernelSource`.

ALGORITHMS maps each GPU algorithm to its template and its context function. A GPU algorithm's
template renders, for one user-level problem (transposed or not), `extern "C"` entries per pass
with pointers by role (see codegen/gpu_direct.py):

    <prefix>_fwd(input, weight, bias, output, batch, stream)
    <prefix>_bwd_data(grad_output, weight, grad_input, batch, stream)
    <prefix>_bwd_weight(grad_output, input, grad_weight, batch, stream)
    <prefix>_bwd_weight_bias(grad_output, input, grad_weight, grad_bias, batch, stream)
    <prefix>_bwd_bias(grad_output, grad_bias, batch, stream)

(`bwd_weight_bias`: the weight gradient with the bias gradient fused into its launches, for a weight
gradient whose problem asks for the bias too; `bwd_bias` serves the bias gradient asked alone.)

and its context function is `context(problem, target, prefix, *, threads, entries)`. The emitted
file is the plan's header comment (problem, key, reasons), the algorithm's source (which inlines
the vendor wrappers: no include outside the vendor's own headers) and one plan entry
`cg_<name>(pointers of the plan's operands by role, batch, stream)` that calls the pass's entry
(for a weight gradient with a bias, the fused `bwd_weight_bias`), returning its status. An entry
that needs scratch memory (the split-K weight gradients of igemm, depthwise and stem) is listed
in its algorithm's `workspace`: the plan entry asks `<prefix>_<entry>_workspace_bytes(batch)`,
allocates that on the stream through the wrappers' `convgen_malloc_async` (cudaMallocAsync,
hipMallocAsync, malloc in the simulator), passes it after the pointers and frees it with
`convgen_free_async` behind the launches; a failed allocation returns the vendor's status. A new GPU
algorithm is one ALGORITHMS entry plus a rule in codegen/passes/gpu_algorithms.py.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .errors import ConvgenError, ConvSpecError
from .gpu_depthwise import THREADS as DEPTHWISE_THREADS
from .gpu_depthwise import depthwise_context
from .gpu_direct import direct_context
from .gpu_igemm import igemm_context
from .gpu_stem import stem_context
from .ir import Op
from .plan import Plan
from .source import KernelSource
from .version import generator_version


@dataclasses.dataclass(frozen=True)
class GpuAlgorithm:
    template: str
    context: Callable   # (problem, target, prefix, *, threads, entries) -> the template's context `c`
    # entries that take a scratch workspace: `<prefix>_<entry>(pointers..., float* workspace, batch,
    # stream)` with `<prefix>_<entry>_workspace_bytes(batch)`; the plan entry allocates it on the stream
    workspace: tuple[str, ...] = ()


def _fixed_threads(context: Callable, threads_of_kernel: int, entries_taken: tuple[str, ...]) -> Callable:
    """A context function for kernels whose block size is fixed and that render all their entries
    (depthwise, stem): checks `threads` and `entries` against them."""
    def context_for(problem, target, prefix, *, threads, entries):
        if threads != threads_of_kernel:
            raise ConvSpecError(f"threads={threads}: this kernel's block is {threads_of_kernel} threads")
        if not entries or any(e not in entries_taken for e in entries):
            raise ConvSpecError(f"entries {list(entries)}: expected a non-empty subset of {list(entries_taken)}")
        return context(problem, target, prefix)
    return context_for


ALGORITHMS: dict[str, GpuAlgorithm] = {
    "direct": GpuAlgorithm("gpu/direct.cu.j2", direct_context),
    "igemm": GpuAlgorithm("gpu/igemm.cu.j2", igemm_context, workspace=("bwd_weight", "bwd_weight_bias")),
    "depthwise": GpuAlgorithm("gpu/depthwise.cu.j2",
                              _fixed_threads(depthwise_context, DEPTHWISE_THREADS,
                                             ("fwd", "bwd_data", "bwd_weight", "bwd_weight_bias", "bwd_bias")),
                              workspace=("bwd_weight", "bwd_weight_bias")),
    "stem": GpuAlgorithm("gpu/stem_wgrad.cu.j2",
                         _fixed_threads(stem_context, DEPTHWISE_THREADS, ("bwd_weight", "bwd_weight_bias", "bwd_bias")),
                         workspace=("bwd_weight", "bwd_weight_bias")),
}

# the entries a user-level pass calls, in order, and their pointer parameters by role
ENTRY_ROLES = {
    "fwd": ("input", "weight", "bias", "output"),
    "bwd_data": ("grad_output", "weight", "grad_input"),
    "bwd_weight": ("grad_output", "input", "grad_weight"),
    "bwd_weight_bias": ("grad_output", "input", "grad_weight", "grad_bias"),
    "bwd_bias": ("grad_output", "grad_bias"),
}


def pass_entries(plan: Plan) -> tuple[str, ...]:
    p = plan.problem
    if p.op is Op.FWD:
        return ("fwd",)
    if p.op is Op.BWD_DATA:
        return ("bwd_data",)
    if p.op is Op.BWD_WEIGHT:
        return ("bwd_weight_bias",) if p.bias else ("bwd_weight",)
    return ("bwd_bias",)


def gpu_signature(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The plan entry's parameters: one pointer per operand (by caller role), the batch, a stream."""
    return tuple(("ptr", op.role) for op in plan.operands) + (("i64", "n"), ("stream", "stream"))


def staged_kinds(plan: Plan) -> tuple[str, ...]:
    """The operand kinds the plan's kernel reads from a converted copy (the layout pass's decision:
    igemm's staging, codegen/gpu_staging.py)."""
    return tuple(sorted(plan.staged))


def _header(plan: Plan, algorithm: str) -> str:
    lines = [f"// Generated by convgen {generator_version()} -- do not edit.",
             f"// problem: {plan.problem.name()}", f"// key:     {plan.problem.kernel_key()}",
             f"// target:  {plan.target.name()}", f"// kernel:  {plan.kop.value}, algorithm {algorithm}",
             "// decisions:"]
    lines += [f"//   [{name}] {reason}" for name, reason in plan.reasons]
    return "\n".join(lines) + "\n"


def _allocator(entry: str) -> str:
    """Where the plan's scratch memory comes from: the caller's allocator once it set one through
    `<entry>_set_allocator` (convgen's runtime sets torch's caching allocator, so that workspaces come
    out of the memory torch holds and go back to it, stream-ordered), else the vendor's stream-ordered
    convgen_malloc_async (cudaMallocAsync, hipMallocAsync; malloc in the simulator)."""
    return ("\n// The plan's scratch memory: the caller's allocator (set by " + entry + "_set_allocator: a null\n"
            "// result is out of memory), else the vendor's stream-ordered one.\n"
            "typedef void* (*convgen_alloc_fn)(unsigned long long bytes, void* stream);\n"
            "typedef void (*convgen_release_fn)(void* p, void* stream);\n"
            f"static convgen_alloc_fn {entry}_alloc = nullptr;\n"
            f"static convgen_release_fn {entry}_release = nullptr;\n"
            f"extern \"C\" void {entry}_set_allocator(void* alloc, void* release) {{\n"
            f"    {entry}_alloc = reinterpret_cast<convgen_alloc_fn>(alloc);\n"
            f"    {entry}_release = alloc ? reinterpret_cast<convgen_release_fn>(release) : nullptr;\n"
            "}\n"
            f"static int {entry}_workspace(void** p, unsigned long long bytes, void* stream) {{\n"
            f"    if (!{entry}_alloc) return convgen_malloc_async(p, bytes, (convgen_stream_t)stream);\n"
            f"    *p = {entry}_alloc(bytes, stream);\n"
            "    return *p ? 0 : 2;   // cudaErrorMemoryAllocation, hipErrorOutOfMemory\n"
            "}\n"
            f"static int {entry}_free(void* p, void* stream) {{\n"
            f"    if (!{entry}_release) return convgen_free_async(p, (convgen_stream_t)stream);\n"
            f"    {entry}_release(p, stream);\n"
            "    return 0;\n"
            "}\n")


def _plan_entry(plan: Plan, prefix: str, entry: str, entries: tuple[str, ...], workspace: tuple[str, ...]) -> str:
    roles = [op.role for op in plan.operands]
    params = ", ".join(f"void* {role}" for role in roles)
    calls = []
    for name in entries:
        args = ", ".join(f"convgen_pointer{{{role if role in roles else 'nullptr'}}}" for role in ENTRY_ROLES[name])
        if name not in workspace:
            calls.append(f"    if (int status = {prefix}_{name}({args}, batch, stream)) return status;")
            continue
        calls.append(   # scratch memory on the caller's stream, freed behind the launches that use it
            f"    {{  // {name}'s workspace\n"
            f"        unsigned long long bytes = {prefix}_{name}_workspace_bytes(batch);\n"
            "        void* workspace = nullptr;\n"
            "        if (bytes != 0) {\n"
            f"            if (int status = {entry}_workspace(&workspace, bytes, stream)) return status;\n"
            "        }\n"
            f"        int status = {prefix}_{name}({args}, static_cast<float*>(workspace), batch, stream);\n"
            f"        int freed = bytes != 0 ? {entry}_free(workspace, stream) : 0;\n"
            "        if (status != 0) return status;\n"
            "        if (freed != 0) return freed;\n"
            "    }")
    uses_workspace = any(name in workspace for name in entries)
    return ((_allocator(entry) if uses_workspace else "") +
            "\n// The plan's entry: the caller's pointers by role, the batch size, a stream; 0 when launched.\n"
            "struct convgen_pointer {  // a pointer by role, for an entry's parameter of any element type\n"
            "    void* p;\n    template <class U> operator U*() const { return static_cast<U*>(p); }\n};\n"
            f"extern \"C\" int {entry}({params}, long long batch, void* stream) {{\n" + "\n".join(calls) +
            "\n    return 0;\n}\n")


def emit_gpu(plan: Plan) -> KernelSource:
    """The self-contained CUDA or HIP source of `plan` (not an 'empty' one)."""
    from .emit import environment

    algorithm = ALGORITHMS.get(plan.algorithm)
    if algorithm is None:
        raise ConvgenError(f"emit: no GPU template for algorithm {plan.algorithm!r} (target {plan.target.name()}); "
                           f"GPU algorithms: {sorted(ALGORITHMS)}")
    name = plan.name()
    entry, prefix = f"cg_{name}", f"cgk_{name}"
    entries = pass_entries(plan)
    staged = staged_kinds(plan)
    context = algorithm.context(plan.problem, plan.target, prefix, threads=plan.tiling.threads_per_block,
                                entries=entries, **({"staged": staged} if plan.algorithm == "igemm" else {}))
    body = environment().get_template(algorithm.template).render(c=context)
    workspace = algorithm.workspace + tuple(getattr(context, "staged_entries", ()))   # igemm's conversions
    text = _header(plan, plan.algorithm) + "\n" + body + _plan_entry(plan, prefix, entry, entries, workspace)
    return KernelSource(name=name, text=text, entry=entry, signature=gpu_signature(plan), target=plan.target,
                        language=plan.target.kind.value)
