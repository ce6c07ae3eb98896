"""The committed ahead-of-time sources under generated/ are exactly what convgen generates today.

Each generated/NAME/manifest.json records where its problems came from (a model and input
shapes, or a shape list) and the target they were generated for. Regenerating from that origin
for that target must reproduce every file byte for byte; only the manifest's toolchain entry
(the compiler of whoever generated it) may differ. When this fails after a change to the
generator, regenerate with the command in the manifest's origin and commit the result.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from convgen.aot import aot
from convgen.cli import aot as aot_cli
from convgen.api.shapes import collect, problems_from_json

from support.paths import REPO as ROOT
BUNDLES = sorted(p.parent for p in (ROOT / "generated").glob("*/manifest.json"))


def test_resnet18_sources_are_committed():
    assert ROOT / "generated" / "resnet18" in BUNDLES


def _files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text(encoding="utf-8") for p in sorted(directory.rglob("*"))
            if p.is_file() and "build" not in p.relative_to(directory).parts}


@pytest.mark.parametrize("committed", BUNDLES, ids=[p.name for p in BUNDLES])
def test_regenerating_changes_nothing(committed, tmp_path, monkeypatch):
    manifest = json.loads((committed / "manifest.json").read_text(encoding="utf-8"))
    origin = manifest["origin"]
    monkeypatch.chdir(ROOT)  # origins name files relative to the project root
    if "model" in origin:
        model, _ = aot_cli.load_model(origin["model"])
        inputs = aot_cli.example_inputs([",".join(map(str, s)) for s in origin["input_shapes"]], origin["dtype"],
                                        origin["layout"], origin["input_grad"])
        problems = collect(aot_cli.prepare_model(model, origin["dtype"], origin["layout"]), *inputs)
    else:
        problems = problems_from_json(Path(origin["shapes"]))
    out = tmp_path / committed.name
    aot.generate(problems, out, name=manifest["name"], target=aot.target_from_dict(manifest["target"]),
                 origin=origin)
    before, after = _files(committed), _files(out)
    assert sorted(after) == sorted(before)
    for name in before:
        if name == "manifest.json":
            old, new = json.loads(before[name]), json.loads(after[name])
            old.pop("toolchain"), new.pop("toolchain")
            assert new == old, "manifest.json differs beyond its toolchain entry"
        else:
            assert after[name] == before[name], f"{committed.name}/{name} differs from what convgen generates now"
