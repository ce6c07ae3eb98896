"""Two-process DistributedDataParallel training over one shared kernel cache, of a converted model
and of a plain torch model inside `convgen.enabled()`.

Issue 4 item 5: two processes (gloo backend, CPU, world size 2) each train the same converted
small CNN, wrapped in DistributedDataParallel, for two SGD steps on their own half of a fixed
synthetic batch. Both point CONVGEN_CACHE_DIR at one fresh directory of their own (not the test
session's), so they race for the same kernels. The test checks that

- after DDP's allreduce, every rank's gradients (at both steps) and losses match torch's
  float64 reference computed in this process on the whole batch (relative L2 error < 1e-4:
  the model runs in float32);
- each kernel was built exactly once: the builds of both ranks add up to the number of entries
  in the shared cache, and each rank got every kernel it did not build itself from the disk.

The same holds for a plain torch model trained inside `with convgen.enabled():` (issue 18),
whose counters must show that convgen served its forward and backward convolutions.

This file is also the worker: the test starts `python tests/api/test_ddp.py RANK STORE OUT WAY`
twice (WAY: convert or enabled). Each worker saves its losses, gradients and `convgen.stats()` to OUT with torch.save.
Rendezvous goes through a file store (`file://` init method), so no port has to be found free.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

WORLD_SIZE = 2
BATCH = 8            # the whole batch; each rank trains on BATCH // WORLD_SIZE of it
STEPS = 2
LR = 0.1
TOLERANCE = 1e-4     # relative L2 error, float32 model against the float64 reference
TIMEOUT_S = 180      # for both workers together; they normally finish in well under a minute


def make_model() -> nn.Sequential:
    """A small CNN: biased and bias-free convs, a stride-2 and a depthwise conv, a transposed conv."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),                        # stem, with bias
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),  # downsampling, no bias
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16),           # depthwise
        nn.ReLU(),
        nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1),    # upsampling back to 16x16
        nn.ReLU(),
        nn.Conv2d(8, 4, 1),                                   # pointwise head
    )


def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed synthetic batch (inputs and regression targets), the same in every process."""
    gen = torch.Generator().manual_seed(1234)
    return torch.randn(BATCH, 3, 16, 16, generator=gen), torch.randn(BATCH, 4, 16, 16, generator=gen)


def train(model: nn.Module, params: list[nn.Parameter], x: torch.Tensor, y: torch.Tensor):
    """STEPS SGD steps of mean-squared error; the losses and the gradients seen at every step."""
    optimizer = torch.optim.SGD(params, lr=LR)
    losses, grads = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.detach().double())
        grads.append([p.grad.detach().double().clone() for p in params])
        optimizer.step()
    return losses, grads


# ---------------------------------------------------------------------------------- worker


def worker(rank: int, store: str, out: str, way: str) -> None:
    """One DDP rank: train the model on this rank's shard, converted (way "convert") or plain inside
    convgen.enabled() (way "enabled"); save what happened to `out`."""
    import contextlib

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import convgen

    torch.set_num_threads(1)  # two ranks on a small machine: one thread each
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD_SIZE)
    try:
        model = convgen.convert(make_model()) if way == "convert" else make_model()
        ddp = DistributedDataParallel(model)
        x, y = make_batch()
        shard = BATCH // WORLD_SIZE
        x, y = x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
        with convgen.enabled() if way == "enabled" else contextlib.nullcontext():
            losses, grads = train(ddp, list(ddp.parameters()), x, y)
        # DDP averages gradients, not losses: average the shard losses to compare with the whole batch's
        losses = torch.stack([loss.float() for loss in losses])
        dist.all_reduce(losses)
        torch.save({"losses": losses.double() / WORLD_SIZE, "grads": grads, "stats": convgen.stats(),
                    "converted": sorted({type(m).__module__ for m in model.modules() if "Conv" in type(m).__name__})},
                   out)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------- test


def run_workers(tmp_path: Path, way: str) -> list[dict]:
    """Start both ranks sharing one fresh cache directory; their saved results, in rank order."""
    cache_dir = tmp_path / "shared-cache"
    env = dict(os.environ, CONVGEN_CACHE_DIR=str(cache_dir), OMP_NUM_THREADS="1")
    env.pop("CONVGEN_TUNE", None)
    outs = [tmp_path / f"rank{r}.pt" for r in range(WORLD_SIZE)]
    logs = [tmp_path / f"rank{r}.log" for r in range(WORLD_SIZE)]
    procs = []
    try:
        for r in range(WORLD_SIZE):
            with open(logs[r], "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, str(r), str(tmp_path / "store"), str(outs[r]), way],
                    env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        # poll both: when one rank fails, the other would wait for it in a collective until the timeout
        deadline = time.monotonic() + TIMEOUT_S
        while any(proc.poll() is None for proc in procs):
            if any(proc.returncode not in (None, 0) for proc in procs):
                break
            if time.monotonic() > deadline:
                waiting = [r for r, proc in enumerate(procs) if proc.returncode is None]
                raise AssertionError(f"rank(s) {waiting} did not finish within {TIMEOUT_S} s; their output:\n"
                                     + "\n".join(logs[r].read_text()[-4000:] for r in waiting))
            time.sleep(0.1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [r for r, proc in enumerate(procs) if proc.returncode != 0]
    assert not failed, "\n".join(describe_exit(r, procs[r].returncode, logs[r]) for r in failed)
    return [torch.load(out) for out in outs]


def describe_exit(rank: int, status: int, log: Path) -> str:
    how = f"was killed (signal {-status})" if status < 0 else f"exited with status {status}"
    return f"rank {rank} {how}; its output:\n{log.read_text()[-4000:]}"


def cache_entries(cache_dir: Path) -> list[Path]:
    """Complete entries (their meta.json, the commit marker, is there) in a cache directory."""
    return sorted(p.parent for p in (cache_dir / "kernels").glob("*/*/meta.json"))


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).norm() / ref.norm().clamp_min(1e-300))


@pytest.mark.parametrize("way", ["convert", "enabled"])
def test_ddp_two_processes_one_shared_cache(tmp_path, way):
    results = run_workers(tmp_path, way)

    # the reference: torch alone, float64, the whole batch, same initial weights and steps
    reference = make_model().double()
    x, y = make_batch()
    ref_losses, ref_grads = train(reference, list(reference.parameters()), x.double(), y.double())
    names = [name for name, _ in reference.named_parameters()]

    for rank, result in enumerate(results):
        if way == "convert":
            assert result["converted"] == ["convgen.nn"], \
                f"rank {rank}: the model was not converted: {result['converted']}"
        else:   # 5 convolutions per forward, STEPS steps, every one with a backward call; none left to torch
            s = result["stats"]
            assert result["converted"] == ["torch.nn.modules.conv"], f"rank {rank}: {result['converted']}"
            assert (s["aten_forward"], s["aten_backward"], s["aten_fallbacks"]) == (5 * STEPS, 5 * STEPS, 0), s
        for step in range(STEPS):
            loss_err = rel_err(result["losses"][step], ref_losses[step])
            assert loss_err < TOLERANCE, f"rank {rank} step {step}: loss relative error {loss_err:.2e}"
            for name, got, ref in zip(names, result["grads"][step], ref_grads[step], strict=True):
                err = rel_err(got, ref)
                assert err < TOLERANCE, f"rank {rank} step {step}: gradient of {name}: relative error {err:.2e}"

    # each kernel built exactly once, by one rank or the other; the other found it on disk
    entries = cache_entries(tmp_path / "shared-cache")
    stats = [result["stats"] for result in results]
    summary = f"{len(entries)} cache entries; counters per rank: {stats}"
    assert entries, summary
    assert all(s["build_failures"] == 0 and s["corrupt_rebuilt"] == 0 for s in stats), summary
    assert sum(s["builds"] for s in stats) == len(entries), summary
    for rank, s in enumerate(stats):
        assert s["builds"] + s["disk_hits"] == len(entries), f"rank {rank} did not use every kernel once: {summary}"


if __name__ == "__main__":
    worker(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
