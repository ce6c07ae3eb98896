"""The layout of the runtime (runtime/README.md: one room per concern) and of the compiler
(codegen/README.md: floors, a module per kernel family), imports flowing one way.

The imports of every module under runtime/ are read with ast (module level and inside functions
alike; nothing is imported) and checked against the declared order of the rooms below:

- every module lives in a declared room (a new room or top-level module must be declared here
  and in runtime/README.md);
- a module imports only from its own room or from rooms below it, never from a room above;
- no two modules import each other, directly or through others (no circle, also inside a room);
- no intra-package import hides inside a function: an import deferred for its cost would have to
  be listed in DEFERRED with the reason, and today none is;
- the compiler (codegen/) imports nothing of the runtime but the settings (knobs.py);
- codegen/'s modules likewise, by floor (CODEGEN_FLOORS): no import upward, none between two rooms
  of one floor (the CPU and GPU families), no circle, none inside a function;
- no file of either longer than SOURCE_LINES, no function longer than FUNCTION_LINES.

Each check also runs against a small made-up package with the faults it must find, so a checker
that finds nothing cannot pass silently.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUNTIME = REPO / "runtime"
CODEGEN = REPO / "codegen"

# The rooms, top first: a module may import from its own room and from any room after it.
# "" is the package itself (convgen: the public API and `python -m convgen`) with convgen.nn,
# whose classes are pickled under that name; "knobs" and "stats" are leaves every room may use.
ROOMS = ("", "cli", "bench", "aot", "api", "dispatch", "devices", "building", "knobs", "stats")
TOP_LEVEL = {"__init__": "", "__main__": "", "nn": "", "knobs": "knobs", "stats": "stats"}

# Intra-package imports inside functions, allowed only for their import cost: {(module, imported): reason}.
DEFERRED: dict[tuple[str, str], str] = {}

# What the compiler may import from the runtime: the settings, read when used (codegen/target.py host_cpu).
CODEGEN_MAY_IMPORT = {"knobs"}


@dataclasses.dataclass(frozen=True)
class Import:
    source: str      # importing module, dotted under the package ("api.ops", "__init__" for the package)
    target: str      # imported module, dotted the same way
    line: int
    deferred: bool   # inside a function or method


def module_names(root: Path) -> dict[str, Path]:
    """Dotted names (relative to the package) of every module under `root`; a package is its
    __init__ ("api.__init__"), the root package "__init__"."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        names[".".join(rel.parts)] = path
    return names


def _package_of(name: str) -> list[str]:
    parts = name.split(".")
    return parts[:-1]   # "api.ops" -> ["api"]; "api.__init__" -> ["api"]; "__init__" -> []


def _resolve(parts: list[str], known: set[str]) -> str | None:
    """The module that `parts` (dotted under the package) names: a module, or a package's __init__."""
    dotted = ".".join(parts)
    if dotted in known:
        return dotted
    init = ".".join([*parts, "__init__"])
    return init if init in known else None


def imports(root: Path, package: str = "convgen", skip: tuple[str, ...] = ("codegen", "templates")) -> list[Import]:
    """Every import of a module of the package by a module under `root`, resolved to module names.
    Imports of `skip` (the compiler and the templates, packages of their own) are left out."""
    names = module_names(root)
    known = set(names)
    found = []
    for name, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deferred_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                          for n in ast.walk(f)}
        for node in ast.walk(tree):
            targets: list[list[str]] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == package:
                        targets.append(parts[1:])
            elif isinstance(node, ast.ImportFrom):
                if node.level > len(_package_of(name)) + 1:
                    continue   # past the root: codegen's `from .. import knobs` (the runtime's settings)
                if node.level:
                    base = _package_of(name)
                    if node.level > 1:
                        base = base[:len(base) - (node.level - 1)]
                    base = base + (node.module.split(".") if node.module else [])
                elif node.module and node.module.split(".")[0] == package:
                    base = node.module.split(".")[1:]
                else:
                    continue
                for alias in node.names:   # `from . import x`: a submodule x, else a name of the package
                    targets.append([*base, alias.name] if _resolve([*base, alias.name], known) else base)
            for parts in targets:
                if parts and parts[0] in skip:
                    continue
                target = _resolve(parts, known) if parts else "__init__"
                assert target is not None, f"{path}:{node.lineno}: imports {'.'.join(parts)}, which is not a module here"
                if target != name:
                    found.append(Import(name, target, node.lineno, id(node) in deferred_nodes))
    return found


def room_of(name: str) -> str:
    first = name.split(".")[0]
    if "." not in name:
        if name not in TOP_LEVEL:
            raise AssertionError(f"runtime/{name}.py is not in a room: put it in one (runtime/README.md), or "
                                 f"declare it in tests/test_layout.py TOP_LEVEL")
        return TOP_LEVEL[name]
    if first not in ROOMS:
        raise AssertionError(f"runtime/{first}/ is not a declared room: add it to ROOMS in tests/test_layout.py "
                             f"(in its place in the order) and to runtime/README.md")
    return first


def wrong_direction(found: list[Import]) -> list[str]:
    rank = {room: i for i, room in enumerate(ROOMS)}
    bad = []
    for imp in found:
        src, dst = room_of(imp.source), room_of(imp.target)
        if src != dst and rank[dst] <= rank[src]:
            bad.append(f"{imp.source} (room {src or 'convgen'}) imports {imp.target} (room {dst or 'convgen'}, "
                       f"above it) at line {imp.line}")
    return bad


def circles(found: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def hidden(found: list[Import]) -> list[str]:
    return [f"{imp.source} imports {imp.target} inside a function (line {imp.line})" for imp in found
            if imp.deferred and (imp.source, imp.target) not in DEFERRED]


# ---------------------------------------------------------------------------------- the checks


@pytest.fixture(scope="module")
def runtime_imports() -> list[Import]:
    return imports(RUNTIME)


def test_every_module_is_in_a_room(runtime_imports):
    for name in module_names(RUNTIME):
        room_of(name)


def test_imports_flow_down_the_rooms(runtime_imports):
    bad = wrong_direction(runtime_imports)
    assert not bad, "imports against the declared direction (runtime/README.md):\n" + "\n".join(bad)


def test_no_import_circle(runtime_imports):
    found = circles(runtime_imports)
    assert not found, "modules that import each other (directly or through others): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_no_import_hidden_in_a_function(runtime_imports):
    bad = hidden(runtime_imports)
    assert not bad, ("an import inside a function hides a dependency (or a circle); import at the top, or list it "
                     "in DEFERRED with the import cost it saves:\n" + "\n".join(bad))


def test_the_compiler_imports_only_the_settings():
    runtime = {name.split(".")[0] for name in module_names(RUNTIME)}
    names = module_names(CODEGEN)
    bad = []
    for name, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        depth = len(name.split("."))   # codegen/x.py and codegen/__init__.py: `..` is the convgen package
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == depth + 1:
                for alias in node.names:
                    target = ".".join(filter(None, [node.module, alias.name]))
                    if target.split(".")[0] in runtime and target.split(".")[0] not in CODEGEN_MAY_IMPORT:
                        bad.append(f"codegen/{name}.py imports the runtime's {target}")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("convgen."):
                first = node.module.split(".")[1]
                if first not in ("codegen", "templates") and first not in CODEGEN_MAY_IMPORT:
                    bad.append(f"codegen/{name}.py imports {node.module}")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------------- the compiler's floors

# codegen/ by floor, top first (codegen/README.md): a module imports from its own room and from the
# floors below; two rooms of one floor do not import each other (the CPU and GPU kernel families).
CODEGEN_FLOORS = (
    ("pipeline", "emit"),                        # lower(problem, target) -> plan; emit(plan) -> source
    ("passes",),                                 # the passes, which ask the families
    ("cpu", "gpu"),                              # a module per kernel family: fit, rules, tile, context, template
    ("sizes",),                                  # the shape-generic tiers' size array (CPU and GPU alike)
    ("render",),                                 # the Jinja environment, operand strides
    ("plan", "source"),                          # the plan the passes build; the source emit returns
    ("target",),                                 # a code-generation target
    ("arch",),                                   # machines as data: ISA levels, GPU archs and their tiles
    ("ir",),                                     # the problem IR and its rules
    ("errors", "keys", "version", "__init__"),   # leaves
)
SOURCE_LINES = 500     # no file of the compiler or the runtime longer
FUNCTION_LINES = 80    # nor a function


def floor_of(name: str, floors=CODEGEN_FLOORS) -> tuple[int, str]:
    """(floor, room) of a codegen module, the floor counted from the top."""
    room = name.split(".")[0]
    for i, rooms in enumerate(floors):
        if room in rooms:
            return i, room
    raise AssertionError(f"codegen/{name.replace('.', '/')}.py is in no floor: add its room to CODEGEN_FLOORS in "
                         f"tests/test_layout.py (in its place) and to codegen/README.md")


def wrong_floor(found: list[Import], floors=CODEGEN_FLOORS) -> list[str]:
    bad = []
    for imp in found:
        (src_floor, src), (dst_floor, dst) = floor_of(imp.source, floors), floor_of(imp.target, floors)
        if src != dst and dst_floor <= src_floor:
            where = "beside it" if dst_floor == src_floor else "above it"
            bad.append(f"{imp.source} (room {src}) imports {imp.target} (room {dst}, {where}) at line {imp.line}")
    return bad


@pytest.fixture(scope="module")
def codegen_imports() -> list[Import]:
    return imports(CODEGEN, package="convgen.codegen")


def test_every_compiler_module_is_on_a_floor(codegen_imports):
    for name in module_names(CODEGEN):
        floor_of(name)


def test_the_compiler_imports_flow_down_its_floors(codegen_imports):
    bad = wrong_floor(codegen_imports)
    assert not bad, "imports against codegen's floors (codegen/README.md):\n" + "\n".join(bad)


def test_no_import_circle_in_the_compiler(codegen_imports):
    found = circles(codegen_imports)
    assert not found, "compiler modules that import each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_compiler_import_hidden_in_a_function(codegen_imports):
    bad = [f"{imp.source} imports {imp.target} inside a function (line {imp.line})" for imp in codegen_imports
           if imp.deferred]
    assert not bad, "an import inside a function hides a dependency (or a circle):\n" + "\n".join(bad)


def too_long(root: Path, source_lines: int = SOURCE_LINES, function_lines: int = FUNCTION_LINES) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > source_lines:
            bad.append(f"{path.relative_to(root)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > function_lines:
                    bad.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {length} lines")
    return bad


def test_files_and_functions_stay_short():
    bad = too_long(CODEGEN) + too_long(RUNTIME)
    assert not bad, (f"split these (files of at most {SOURCE_LINES} lines, functions of at most {FUNCTION_LINES}):\n"
                     + "\n".join(bad))


# ---------------------------------------------------------------------------------- the checker itself


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checker_finds_a_circle_an_upward_import_and_a_hidden_one(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from .api import functional\n",
        "api/__init__.py": "",
        "api/functional.py": "from . import ops\n",
        "api/ops.py": "from ..dispatch import dispatch\nfrom convgen.api import eager\n",
        "api/eager.py": "def grads():\n    from . import functional\n",
        "dispatch/__init__.py": "",
        "dispatch/dispatch.py": "from ..building import build\nfrom .. import knobs\n",
        "building/__init__.py": "",
        "building/build.py": "from ..api.ops import Forward\n",
        "knobs.py": "",
    })
    found = imports(root)
    assert {(i.source, i.target) for i in found} >= {("__init__", "api.functional"), ("api.functional", "api.ops"),
                                                     ("api.ops", "dispatch.dispatch"), ("api.ops", "api.eager"),
                                                     ("api.eager", "api.functional"), ("building.build", "api.ops"),
                                                     ("dispatch.dispatch", "knobs")}
    assert wrong_direction(found) == ["building.build (room building) imports api.ops (room api, above it) at line 1"]
    # two circles through api.ops (eager -> functional -> ops -> eager, ops -> dispatch -> build -> ops): one knot
    assert circles(found) == [["api.eager", "api.functional", "api.ops", "building.build", "dispatch.dispatch"]]
    assert hidden(found) == ["api.eager imports api.functional inside a function (line 2)"]


def test_the_old_flat_layout_fails(tmp_path):
    """The runtime before it was laid out by concern (two of its circles, flat modules): refused."""
    root = _package(tmp_path, {
        "__init__.py": "from .functional import conv2d\n",
        "functional.py": "from . import library, ops\n",
        "library.py": "from . import ops\n",
        "ops.py": "from . import dispatch, eager\n",
        "eager.py": "def _grads():\n    from . import functional\n",
        "dispatch.py": "from . import bundle, tuning\n",
        "bundle.py": "from . import aot\n",
        "aot.py": "from . import dispatch\n",
        "tuning.py": "def tune():\n    from . import dispatch\n",
    })
    found = imports(root)
    assert sorted(circles(found)) == [["aot", "bundle", "dispatch", "tuning"], ["eager", "functional", "library", "ops"]]
    assert len(hidden(found)) == 2
    with pytest.raises(AssertionError, match="not in a room"):
        for name in module_names(root):
            room_of(name)


def test_the_floor_checker_finds_the_old_flat_compiler(tmp_path):
    """The compiler before its floors: emit and the GPU family modules importing each other (lazily,
    inside functions), ir and its rules, a family beside the other device's, a long file."""
    root = _package(tmp_path, {
        "__init__.py": "",
        "ir/__init__.py": "", "ir/problem.py": "def validate():\n    from .rules import check\n",
        "ir/rules.py": "from .problem import ConvProblem\n",
        "render.py": "",
        "emit.py": "from .gpu import igemm\n",
        "gpu/__init__.py": "", "gpu/igemm.py": "def context():\n    from ..emit import environment\n",
        "cpu/__init__.py": "", "cpu/lanes.py": "from ..gpu.igemm import context\n",
        "passes/__init__.py": "", "passes/tiling.py": "from ..pipeline import Pass\n",
        "pipeline.py": "from .passes import tiling\n",
        "plan.py": "from .render import environment\n" + "\n" * SOURCE_LINES,
    })
    found = imports(root, package="convgen.codegen")
    assert sorted(wrong_floor(found)) == [
        "cpu.lanes (room cpu) imports gpu.igemm (room gpu, beside it) at line 1",
        "gpu.igemm (room gpu) imports emit (room emit, above it) at line 2",
        "passes.tiling (room passes) imports pipeline (room pipeline, above it) at line 1",
        "plan (room plan) imports render (room render, above it) at line 1"]
    assert sorted(circles(found)) == [["emit", "gpu.igemm"], ["ir.problem", "ir.rules"], ["passes.tiling", "pipeline"]]
    assert len([i for i in found if i.deferred]) == 2
    assert too_long(root) == [f"plan.py: {SOURCE_LINES + 1} lines"]
