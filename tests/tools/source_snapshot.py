"""Every generated kernel source of a checkout, hashed: proof that a move of the compiler's code
changed no generated text.

    python tests/tools/source_snapshot.py --against HEAD~3      # this tree against a revision
    python tests/tools/source_snapshot.py --write snap.json      # this tree's hashes to a file
    python tests/tools/source_snapshot.py --compare snap.json    # this tree against such a file

The problems: the correctness cases of CASES.md (tests/support/cases.py), the bench suites (standard,
weak, more, smoke), each as a training call (forward with bias, data, weight and bias gradients)
in f32, f64, bf16 and f16, in NCHW and channels-last. The targets: the CPU code shapes (AVX-512
with and without AMX and bf16 pairs, AVX2 with and without bf16 pairs, generic), cuda-sm_80,
cuda-sm_90 and hip-gfx90a. Each problem is lowered with the heuristic's choice and with every other
candidate algorithm; what is hashed is the emitted text, entry and signature, or the error's type
and message where lowering or emitting refuses.

A revision is read from a temporary `git worktree` and imported in a child process under the
`convgen` name (an import hook maps the package as pyproject.toml does), so both sides run the
same code of this script against their own compiler.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
DTYPES = ("f32", "f64", "bf16", "f16")


class _MapPackage(importlib.abc.MetaPathFinder):
    """Import `convgen` from `root`/runtime, `convgen.codegen` from `root`/codegen and
    `convgen.templates` from `root`/templates, as the package's install does."""

    def __init__(self, root: Path):
        self.places = {"convgen": root / "runtime", "convgen.codegen": root / "codegen",
                       "convgen.templates": root / "templates"}

    def find_spec(self, fullname, path=None, target=None):
        place = self.places.get(fullname)
        if place is None:
            return None
        return importlib.util.spec_from_file_location(fullname, place / "__init__.py",
                                                      submodule_search_locations=[str(place)])


def _case_entries(root: Path) -> list[dict]:
    """The tests' CASES.md cases as shape-list entries (tests/support/cases.py; in older trees
    tests/test_cases.py)."""
    found = [path for path in (root / "tests/support/cases.py", root / "tests/test_cases.py") if path.exists()]
    if not found:
        raise SystemExit(f"no tests/support/cases.py or tests/test_cases.py under {root}")
    spec = importlib.util.spec_from_file_location("snapshot_cases", found[0])
    sys.path.insert(0, str(found[0].parent))
    sys.path.insert(0, str(root / "tests"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up
    spec.loader.exec_module(module)
    entries = []
    for case in module.CASES:
        stride, padding, dilation, transposed, output_padding, groups = case.args()
        entries.append({"input": list(case.input), "weight": list(case.weight), "bias": True, "stride": stride,
                        "padding": padding, "dilation": dilation, "groups": groups, "transposed": transposed,
                        "output_padding": output_padding})
    return entries


def _suite_entries() -> list[dict]:
    from convgen.bench.suites import select

    entries = []
    for suite in ("all", "more", "smoke"):
        for _, shapes in select(suite):
            for s in shapes:
                stride, padding, dilation, transposed, output_padding, groups = s.conv_args()
                entries.append({"input": list(s.input), "weight": list(s.weight), "bias": s.bias, "stride": stride,
                                "padding": padding, "dilation": dilation, "groups": groups,
                                "transposed": transposed, "output_padding": output_padding})
    return entries


def _targets():
    from convgen.codegen.target import cpu_target, parse_target

    return [cpu_target("avx512"), cpu_target("avx512", amx_bf16=True), cpu_target("avx512", bf16_dot=True),
            cpu_target("avx2"), cpu_target("avx2", bf16_dot=True), cpu_target("generic"),
            parse_target("cuda-sm_80"), parse_target("cuda-sm_90"), parse_target("hip-gfx90a")]


def _digest(lower, emit, problem, target, algorithm):
    try:
        plan = lower(problem, target, algorithm)
        source = emit(plan)
    except Exception as e:   # a refusal is part of what the compiler does: its message must not change
        return None, f"error {type(e).__name__}: {e}"
    if source is None:
        return plan, "no kernel: " + plan.algorithm
    text = json.dumps([source.name, source.entry, source.signature, source.language, source.text])
    return plan, hashlib.sha256(text.encode()).hexdigest()


def snapshot(root: Path) -> dict[str, str]:
    """{problem | target | algorithm: hash of the emitted source or the refusal} for the tree at `root`."""
    from convgen.api.shapes import problems_from_json
    from convgen.codegen.emit import emit
    from convgen.codegen.pipeline import lower

    entries = _case_entries(root) + _suite_entries()
    problems = {}
    for entry in entries:
        rank = len(entry["input"]) - 2
        for dtype in DTYPES:
            for layout in ("nchw", "channels_last") if rank >= 2 else ("nchw",):
                try:
                    found = problems_from_json([{**entry, "dtype": dtype, "layout": layout}])
                except Exception as e:
                    problems[f"refused {entry} {dtype} {layout}"] = f"{type(e).__name__}: {e}"
                    continue
                for p in found:
                    problems.setdefault(p.key(), p)
    out = {}
    for target in _targets():
        for key, problem in problems.items():
            if isinstance(problem, str):
                out[f"{key} | {target.name()}"] = problem
                continue
            label = f"{problem.name()} {key[:12]} | {target.name()}"
            plan, digest = _digest(lower, emit, problem, target, None)
            out[f"{label} | default"] = digest
            for algorithm in (plan.candidates if plan is not None else ()):
                out[f"{label} | {algorithm}"] = _digest(lower, emit, problem, target, algorithm)[1]
    return out


def _snapshot_of_revision(revision: str) -> dict[str, str]:
    repo = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=HERE.parent, check=True,
                               capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="convgen-snapshot-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), revision], cwd=repo, check=True)
        try:
            out = Path(tmp) / "snapshot.json"
            subprocess.run([sys.executable, str(HERE), "--root", str(tree), "--write", str(out)], check=True)
            return json.loads(out.read_text())
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=repo, check=True)


def compare(old: dict[str, str], new: dict[str, str]) -> int:
    changed = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
    gone, added = sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())
    for title, keys in (("changed", changed), ("only before", gone), ("only after", added)):
        for k in keys[:20]:
            print(f"{title}: {k}\n    before: {old.get(k)}\n    after:  {new.get(k)}")
        if len(keys) > 20:
            print(f"{title}: ... and {len(keys) - 20} more")
    kernels = sum(1 for v in new.values() if not v.startswith(("error", "no kernel")))
    print(f"{len(new)} (problem, target, algorithm) triples, {kernels} kernel sources: {len(changed)} changed, "
          f"{len(gone)} only before, {len(added)} only after")
    return 1 if changed or gone or added else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, help="the tree to import (default: this checkout, as installed)")
    parser.add_argument("--write", type=Path, help="write the snapshot to this JSON file")
    parser.add_argument("--compare", type=Path, help="compare with a snapshot written by --write")
    parser.add_argument("--against", help="compare with the snapshot of this git revision")
    args = parser.parse_args(argv)
    root = args.root or HERE.parents[2]
    if args.root:
        sys.meta_path.insert(0, _MapPackage(args.root))
    new = snapshot(root)
    if args.write:
        args.write.write_text(json.dumps(new, indent=0, sort_keys=True))
    if args.compare:
        return compare(json.loads(args.compare.read_text()), new)
    if args.against:
        return compare(_snapshot_of_revision(args.against), new)
    if not args.write:
        parser.error("say --write, --compare or --against")
    return 0


if __name__ == "__main__":
    sys.exit(main())
