"""The emitter: a finished `Plan` -> one `KernelSource`, rendered from the Jinja templates.

Decisions live in the plan; for a CPU target the plan's kernel family (codegen/cpu/families.py)
names the template and builds its one context object, so the templates stay short; everything
renders in one strict Jinja environment (render.py). Plans for CUDA and HIP targets are emitted by
codegen/gpu/ (its own table of GPU algorithms). Also here: the sources of ahead-of-time bundles and
of the eager launcher.
"""

from __future__ import annotations

import dataclasses

from .cpu.context import conversion, entry_signature
from .cpu.families import find
from .errors import ConvgenError
from .gpu.entry import emit_gpu
from .plan import Plan
from .render import render
from .source import KernelSource
from .target import TargetKind
from .version import generator_version

__all__ = ["emit", "emit_bundle_module", "emit_launcher", "entry_signature"]


def emit(plan: Plan) -> KernelSource | None:
    """The source for `plan`, or None when the plan needs no kernel (algorithm 'empty')."""
    if plan.algorithm == "empty":
        return None
    if plan.target.kind is not TargetKind.CPU:
        return emit_gpu(plan)
    family = find(plan.kop, plan.algorithm)
    if family is None:
        raise ConvgenError(f"emit: no template for target {plan.target.kind.value}, kernel op "
                           f"{plan.kop.value}, algorithm {plan.algorithm}")
    name = plan.name()
    entry = f"cg_{name}"
    header = {
        "version": generator_version(), "problem_name": plan.problem.name(), "problem_key": plan.problem.kernel_key(),
        "target": plan.target.name(), "kernel": plan.kop.value, "algorithm": plan.algorithm, "entry": entry,
        "reasons": plan.reasons,
    }
    text = render(family.templates[plan.kop], h=header, c=family.context(plan, entry))
    if plan.conversions:
        text = _converting(text, plan, entry)
    return KernelSource(name=name, text=text, entry=entry, signature=entry_signature(plan), target=plan.target)


def _converting(text: str, plan: Plan, entry: str) -> str:
    """The kernel's source with its entry renamed `entry`_in_layouts and an entry `entry` appended that
    converts the caller's activations to the plan's layouts and the result back (the layout pass's
    choice), so callers pass their tensors as they hold them."""
    head = f'extern "C" int {entry}('
    if text.count(head) != 1:
        raise ConvgenError(f"emit: the {plan.algorithm} {plan.kop.value} template does not define its entry "
                           f"{entry} once; it cannot be wrapped by a layout conversion")
    text = text.replace(head, f"static int {entry}_in_layouts(")
    return text + render("cpu/convert_layouts.j2", c=conversion(plan, entry))


# ---------------------------------------------------------------------------------- bundles

_PARAMETER_TYPES = {"ptr": "void*", "i64": "std::int64_t", "i32": "int"}


@dataclasses.dataclass(frozen=True)
class BundleKernel:
    entry: str
    parameters: str  # the entry's C parameter list


@dataclasses.dataclass(frozen=True)
class BundleContext:
    name: str
    module: str
    version: str
    target: str
    kernel_set: str
    kernels: tuple[BundleKernel, ...]


def emit_bundle_module(name: str, module: str, sources: list[KernelSource], kernel_set: str) -> str:
    """The pybind11 module source of an ahead-of-time bundle serving `sources` (all one target)."""
    kernels = tuple(BundleKernel(s.entry, ", ".join(_PARAMETER_TYPES[kind] for kind, _ in s.signature))
                    for s in sources)
    target = sources[0].target.name() if sources else "cpu"
    context = BundleContext(name=name, module=module, version=generator_version(), target=target,
                            kernel_set=kernel_set, kernels=kernels)
    return render("bundle/module.cpp.j2", b=context)


def emit_launcher(module: str, torch_version: str, huge_output_bytes: int) -> str:
    """The source of the eager launcher (runtime/api/eager.py), the Python extension module `module`
    for torch `torch_version`; outputs of `huge_output_bytes` or more ask for huge pages."""
    return render("eager/launcher.cpp.j2", version=generator_version(), module=module,
                  torch_version=torch_version, huge_output_bytes=huge_output_bytes)
