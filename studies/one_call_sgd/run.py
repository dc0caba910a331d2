"""A new user's momentum SGD on their own CNN: the hand-built pair against compressed_sgd.

The question (issue 45): a user keeps their dense recipe, momentum SGD at their learning
rate, and adds the README's one-line hook (``HookState(method, model=ddp_model)``). Does a
compressed method then train? Does :func:`gssgd.ddp.compressed_sgd`, which puts the
momentum where each method needs it at the same learning rate, bring every method within
2x dense's final training loss?

Setup: a small CNN (three 3x3 convolutions of 16/32/64 channels with or without batch
norm, global average pooling, a linear classifier; about 24k parameters) on synthetic
32x32 RGB images of 10 classes (each class a smooth random template; a sample is its
class's template shifted by up to 4 pixels, plus Gaussian noise: 3.0 for the batch-norm
CNN, 1.0 for the plain one, so that dense learns in 200 steps without finishing), 2 gloo
worker processes, 32 images a worker a step, 200 steps, SGD momentum 0.9, density 0.01
(PowerSGD rank 2), whole-model selection, the hook's start_iter 2. The learning rate is
dense's best of ``--lrs`` at seed 0 (the user's tuned dense lr); every method then runs at
it, by hand and by compressed_sgd, over ``--seeds`` (the model's initial weights, the
templates and the batches). "final loss": the training loss averaged over the last 20
steps and both workers.

    python studies/one_call_sgd/run.py --out studies/one_call_sgd/summary.json
    python studies/one_call_sgd/report.py studies/one_call_sgd/summary.json

About 8 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gssgd.ddp import HookState, comm_hook, compressed_sgd

METHODS = ("dense", "topk", "gs", "powersgd")
HOWS = ("hand-built", "compressed_sgd")
#: Each method's compression level: density 0.01, PowerSGD rank 2.
LEVEL: dict[str, dict[str, Any]] = {
    "dense": {}, "topk": {"density": 0.01}, "gs": {"density": 0.01}, "powersgd": {"rank": 2},
}
#: name -> (batch norm, the images' pixel noise): noise sized so dense learns in 200 steps
#: without finishing (the plain CNN does not learn at all under the batch-norm one's 3.0)
MODELS = {"bn": (True, 3.0), "plain": (False, 1.0)}
TAIL = 20  # steps the final loss averages over


def make_model(norm: bool) -> nn.Module:
    """The user's CNN: three 3x3 convolutions (16/32/64 channels), each with batch norm
    (``norm``) or without, global average pooling, a linear classifier."""
    layers: list[nn.Module] = []
    for c_in, c_out in ((3, 16), (16, 32), (32, 64)):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1)]
        layers += [nn.BatchNorm2d(c_out)] if norm else []
        layers += [nn.ReLU()] + ([nn.MaxPool2d(2)] if c_out < 64 else [])
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def templates(seed: int) -> torch.Tensor:
    """Ten smooth 3x32x32 class templates (random 8x8 patterns, upsampled)."""
    gen = torch.Generator().manual_seed(seed)
    small = torch.randn(10, 3, 8, 8, generator=gen)
    return nn.functional.interpolate(small, size=32, mode="bilinear", align_corners=False)


def batch(temps: torch.Tensor, gen: torch.Generator, n: int, noise: float
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images: a random class's template, shifted by up to 4 pixels, plus noise."""
    y = torch.randint(0, 10, (n,), generator=gen)
    shifts = torch.randint(-4, 5, (n, 2), generator=gen)
    x = torch.stack([torch.roll(temps[c], (int(s[0]), int(s[1])), dims=(1, 2))
                     for c, s in zip(y.tolist(), shifts, strict=True)])
    return x + noise * torch.randn(x.shape, generator=gen), y


def train_one(rank: int, run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One run on this rank; ``run``: model, method, how, lr, seed."""
    torch.manual_seed(run["seed"])
    norm, noise = MODELS[run["model"]]
    model = make_model(norm)
    ddp = DDP(model)
    method, level = run["method"], dict(LEVEL[run["method"]])
    if run["how"] == "compressed_sgd":
        one = compressed_sgd(ddp, method, lr=run["lr"], momentum=0.9, **level)
        optimizer, hook, placement = one.optimizer, one.hook, one.placement
    else:
        hook = HookState(method, model=ddp, **level)
        ddp.register_comm_hook(hook, comm_hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=run["lr"], momentum=0.9)
        placement = "optimizer"
    temps = templates(run["seed"])
    gen = torch.Generator().manual_seed(1000 * (run["seed"] + 1) + rank)
    losses = []
    for _ in range(args.steps):
        x, y = batch(temps, gen, args.batch, noise)
        loss = nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        try:
            loss.backward()
        except FloatingPointError:  # diverged: the hook skipped 100 non-finite steps
            losses.append(float("inf"))
            break
        optimizer.step()
        losses.append(loss.item())
    tail = torch.tensor([sum(losses[-TAIL:]) / len(losses[-TAIL:])])
    dist.all_reduce(tail)
    out = {**run, "final_loss": float(tail) / dist.get_world_size(), "placement": placement,
           "curve": [round(sum(losses[i:i + 20]) / 20, 4) for i in range(0, len(losses), 20)],
           "bytes_sent_per_step": hook.totals.bytes_sent / max(1, hook.totals.iterations)}
    del ddp
    return out


def worker(rank: int, world: int, init: str, args: argparse.Namespace, queue: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    runs = []
    for model in args.models.split(","):
        sweep = [train_one(rank, {"model": model, "method": "dense", "how": "hand-built",
                                  "lr": lr, "seed": 0}, args) for lr in args.lrs]
        runs += [{**r, "role": "lr sweep"} for r in sweep]
        lr = min(sweep, key=lambda r: r["final_loss"])["lr"]
        for seed in range(args.seeds):
            for method in METHODS:
                for how in HOWS:
                    runs.append(train_one(rank, {"model": model, "method": method, "how": how,
                                                 "lr": lr, "seed": seed}, args))
    if rank == 0:
        queue.put(runs)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bn,plain", help="comma-separated: bn, plain")
    p.add_argument("--lrs", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.2, 0.4, 0.8],
                   help="dense's learning rates to sweep (seed 0)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32, help="images per worker and step")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, required=True, help="the JSON summary to write")
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        procs = [ctx.Process(target=worker, args=(r, args.workers, init, args, queue))
                 for r in range(args.workers)]
        for proc in procs:
            proc.start()
        runs = queue.get()
        for proc in procs:
            proc.join()
    if any(proc.exitcode for proc in procs):
        sys.exit("a worker failed")
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    args.out.write_text(json.dumps({"settings": settings, "runs": runs}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
