"""Ahead-of-time kernels for a ResNet-18-style model: generate, build once, train with zero compiles.

    python examples/resnet18_aot.py                      # 8 x 3 x 224 x 224, bundle in generated/resnet18
    python examples/resnet18_aot.py --batch 2 --size 64 --out /tmp/r18

What it does:
1. collects every convolution of one training step (forward, data, weight and bias gradients)
   and runs `convgen aot` on them: one readable source per kernel and a manifest under --out
   (the default one, generated/resnet18/, is committed), built in one ninja run into a module;
2. times the first training step in a fresh process with the JIT (empty cache: every kernel is
   compiled on first use) and in a fresh process with the bundle and no compiler reachable
   (CXX points nowhere), and checks that the bundle built nothing and that its gradients are
   bit-for-bit the JIT's, and close to torch's own.

The same bundle from the command line:
    convgen aot examples/resnet18_aot.py:resnet18 --input-shape 8,3,224,224 --out generated/resnet18
and in a training script: `convgen.load_bundle("generated/resnet18")`, or CONVGEN_BUNDLES=generated/resnet18.
(torchvision has no CPU build here, so the model is defined below, after torchvision's ResNet-18.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
NETWORK_TOLERANCE = 1e-2   # relative, for a whole gradient after a float32 training step (see main)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        self.layers = nn.Sequential(*(nn.Sequential(BasicBlock(cin, cout, s), BasicBlock(cout, cout))
                                      for cin, cout, s in widths))
        self.head = nn.Linear(512, classes)

    def forward(self, x):
        y = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def resnet18() -> ResNet18:
    torch.manual_seed(0)
    return ResNet18()


def training_step(bundle: str | None, batch: int, size: int) -> dict:
    """One SGD step's forward and backward of a converted ResNet-18, timed; run in a fresh process."""
    import convgen

    if bundle:
        convgen.load_bundle(bundle, strict=True)
    model = convgen.convert(resnet18()).train()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen)
    labels = torch.randint(0, 1000, (batch,), generator=gen)
    start = time.perf_counter()
    loss = nn.functional.cross_entropy(model(x), labels)
    loss.backward()
    seconds = time.perf_counter() - start
    grads = {n: p.grad for n, p in model.named_parameters() if "conv" in n or "stem.0" in n or "down.0" in n}
    return {"seconds": seconds, "loss": loss.item(), "stats": convgen.stats(), "grads": grads}


def torch_gradients(batch: int, size: int, dtype: torch.dtype) -> dict:
    """torch's own gradients for the same step, in `dtype`."""
    model = resnet18().to(dtype).train()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen).to(dtype)
    labels = torch.randint(0, 1000, (batch,), generator=gen)
    nn.functional.cross_entropy(model(x), labels).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def relative_error(g: torch.Tensor, reference: torch.Tensor) -> float:
    return ((g.double() - reference).norm() / reference.norm()).item()


def fresh_process(mode: str, batch: int, size: int, out: Path, result: Path) -> dict:
    """Run `training_step` in a new Python: mode 'jit' (an empty cache) or 'bundle' (no compiler)."""
    code = (f"import sys, torch; sys.path.insert(0, {str(Path(__file__).parent)!r}); import resnet18_aot as r; "
            f"torch.save(r.training_step({str(out) if mode == 'bundle' else None!r}, {batch}, {size}), {str(result)!r})")
    with tempfile.TemporaryDirectory(prefix=f"convgen-{mode}-") as cache:
        # the JIT as it compiles on first use (CONVGEN_JIT=eager): the specialised kernels the bundle holds
        env = {**os.environ, "CONVGEN_CACHE_DIR": cache, "CONVGEN_JIT": "eager"}
        if mode == "bundle":
            env["CXX"] = "/nonexistent/c++"  # the bundle must not need a compiler
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return torch.load(result)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--out", default=str(ROOT / "generated" / "resnet18"), help="bundle directory")
    args = parser.parse_args(argv)

    from convgen.aot import aot
    from convgen.api.shapes import collect

    print(f"1. convgen aot: ResNet-18, input {args.batch}x3x{args.size}x{args.size} -> {args.out}")
    start = time.perf_counter()
    x = torch.randn(args.batch, 3, args.size, args.size)
    problems = collect(resnet18().train(), x)
    origin = {"model": "examples/resnet18_aot.py:resnet18", "input_shapes": [list(x.shape)], "dtype": "f32",
              "layout": "nchw", "input_grad": False}
    generated = aot.generate(problems, args.out, name="resnet18", origin=origin)
    built = aot.build(args.out, progress=sys.stderr)
    total = time.perf_counter() - start
    print(f"   {len(problems)} problems, {len(generated.manifest['kernels'])} kernels; "
          f"{generated.written} file(s) written; build: {built.compiled} step(s) in {built.seconds:.1f} s "
          f"(collect + generate + build {total:.1f} s)")

    with tempfile.TemporaryDirectory() as tmp:
        print("2. first training step, each in a fresh process")
        jit = fresh_process("jit", args.batch, args.size, args.out, Path(tmp) / "jit.pt")
        print(f"   JIT:    {jit['seconds']:.2f} s  (builds {jit['stats']['builds']})")
        bundled = fresh_process("bundle", args.batch, args.size, args.out, Path(tmp) / "bundle.pt")
        print(f"   bundle: {bundled['seconds']:.2f} s  (builds {bundled['stats']['builds']}, "
              f"served by the bundle {bundled['stats']['bundle_hits']}, no compiler reachable)")

    # A deep network's float32 gradients are judged beside torch's own float32 run, parameter by
    # parameter: rounding differences in the forward pass flip the occasional ReLU or max-pool
    # decision on an element that is zero within rounding, which changes that element's gradient
    # outright and a whole gradient by about 1/sqrt(its size), ~1e-3 (torch float32 shows up to
    # 4e-3 here itself, on other layers). A broken kernel is off by far more than NETWORK_TOLERANCE.
    exact, single = torch_gradients(args.batch, args.size, torch.float64), torch_gradients(args.batch, args.size,
                                                                                             torch.float32)
    same = all(torch.equal(jit["grads"][n], bundled["grads"][n]) for n in jit["grads"])
    ours = {n: relative_error(g, exact[n]) for n, g in bundled["grads"].items()}
    theirs = {n: relative_error(single[n], exact[n]) for n in ours}
    close = all(ours[n] <= max(2 * theirs[n], NETWORK_TOLERANCE) for n in ours)
    print(f"3. conv weight gradients: bundle == JIT bit for bit: {same}; relative error against torch float64: "
          f"convgen f32 worst {max(ours.values()):.1e}, torch f32 worst {max(theirs.values()):.1e}")
    if not close:
        for n in sorted(ours, key=lambda n: theirs[n] / ours[n])[:3]:
            print(f"   {n}: convgen {ours[n]:.1e}, torch {theirs[n]:.1e}")
    ok = same and bundled["stats"]["builds"] == 0 and close
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
