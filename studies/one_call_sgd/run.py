"""A new user's momentum SGD on their own CNN: the hand-built pair against compressed_sgd.

The question (issue 45): a user keeps their dense recipe, momentum SGD at their learning
rate, and adds the README's one-line hook (``HookState(method, model=ddp_model)``). Does a
compressed method then train? Does :func:`gssgd.ddp.compressed_sgd`, which puts the
momentum where each method needs it at the same learning rate, bring every method within
2x dense's final training loss?

Setup: three small CNNs (three 3x3 convolutions, global average pooling, a linear
classifier; ``MODELS``: with or without batch norm, 24-40k parameters) on synthetic RGB
images of 10 classes (each class a smooth random template; a sample is its class's
template shifted by up to 4 pixels, plus Gaussian noise sized so dense learns without
finishing), 2 gloo worker processes, 32 images a worker a step, SGD momentum 0.9, density
0.01 (PowerSGD rank 2), whole-model selection, the hook's start_iter 2. The learning rate
is dense's best of ``--lrs`` at seed 0 (the user's tuned dense lr); every method then runs
at it, by hand and by compressed_sgd over the first of ``--steps`` (200), and by
compressed_sgd alone over the others (600 = 6 / density: the horizon), over ``--seeds``
(the model's initial weights, the templates and the batches). compressed_sgd is given the
run's length (``total_steps``). "final loss": the training loss averaged over the last 20
steps and both workers.

    python studies/one_call_sgd/run.py --out studies/one_call_sgd/summary.json
    python studies/one_call_sgd/report.py studies/one_call_sgd/summary.json

About 25 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass
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
@dataclass(frozen=True)
class UserModel:
    """One user's CNN and images: batch norm or not, the convolutions' channels, the
    images' side in pixels and their pixel noise (sized so dense learns in the run without
    finishing)."""

    norm: bool
    channels: tuple[int, int, int]
    size: int
    noise: float


MODELS = {
    "bn": UserModel(True, (16, 32, 64), 32, 3.0),
    # the plain CNN does not learn at all under the batch-norm one's noise
    "plain": UserModel(False, (16, 32, 64), 32, 1.0),
    # issue 60's harder one: about 39k parameters on noisy 16x16 images
    "hard": UserModel(True, (24, 48, 64), 16, 2.0),
}
TAIL = 20  # steps the final loss averages over


def make_model(user: UserModel) -> nn.Module:
    """The user's CNN: three 3x3 convolutions (``user.channels``), each with batch norm
    (``user.norm``) or without, a 2x2 max pool after the first two, global average
    pooling, a linear classifier."""
    layers: list[nn.Module] = []
    c_in = 3
    for i, c_out in enumerate(user.channels):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1)]
        layers += [nn.BatchNorm2d(c_out)] if user.norm else []
        layers += [nn.ReLU()] + ([nn.MaxPool2d(2)] if i < 2 else [])
        c_in = c_out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, 10))


def templates(seed: int, size: int) -> torch.Tensor:
    """Ten smooth 3 x size x size class templates (random 8x8 patterns, upsampled)."""
    gen = torch.Generator().manual_seed(seed)
    small = torch.randn(10, 3, 8, 8, generator=gen)
    return nn.functional.interpolate(small, size=size, mode="bilinear", align_corners=False)


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
    user = MODELS[run["model"]]
    model = make_model(user)
    ddp = DDP(model)
    method, level = run["method"], dict(LEVEL[run["method"]])
    if run["how"] == "compressed_sgd":
        with warnings.catch_warnings():  # the report says where the one call warns
            warnings.simplefilter("ignore")
            one = compressed_sgd(ddp, method, lr=run["lr"], momentum=0.9,
                                 total_steps=run["steps"], **level, **run.get("options", {}))
        optimizer, hook, placement = one.optimizer, one.hook, one.placement
    else:
        hook = HookState(method, model=ddp, **level)
        ddp.register_comm_hook(hook, comm_hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=run["lr"], momentum=0.9)
        placement = "optimizer"
    temps = templates(run["seed"], user.size)
    gen = torch.Generator().manual_seed(1000 * (run["seed"] + 1) + rank)
    losses = []
    for _ in range(run["steps"]):
        x, y = batch(temps, gen, args.batch, user.noise)
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
           "bytes_sent_per_step": hook.totals.bytes_sent / max(1, hook.totals.iterations)}
    del ddp
    return out


def worker(rank: int, world: int, init: str, args: argparse.Namespace, queue: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    runs = []
    short, *longer = args.steps
    for model in args.models.split(","):
        sweep = [train_one(rank, {"model": model, "method": "dense", "how": "hand-built",
                                  "lr": lr, "seed": 0, "steps": short}, args)
                 for lr in args.lrs]
        runs += [{**r, "role": "lr sweep"} for r in sweep]
        lr = min(sweep, key=lambda r: r["final_loss"])["lr"]
        for seed in range(args.seeds):
            for method in METHODS:
                for how in HOWS:
                    runs.append(train_one(rank, {"model": model, "method": method, "how": how,
                                                 "lr": lr, "seed": seed, "steps": short},
                                          args))
                for steps in longer:  # the longer horizons: the one call alone
                    runs.append(train_one(rank, {"model": model, "method": method,
                                                 "how": "compressed_sgd", "lr": lr,
                                                 "seed": seed, "steps": steps}, args))
    if rank == 0:
        queue.put(runs)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bn,plain,hard", help="comma-separated: bn, plain, hard")
    p.add_argument("--lrs", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.2, 0.4, 0.8],
                   help="dense's learning rates to sweep (seed 0)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, nargs="+", default=[200, 600],
                   help="run lengths: the first for the lr sweep and both recipes, the "
                        "others for compressed_sgd alone (its horizon)")
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
