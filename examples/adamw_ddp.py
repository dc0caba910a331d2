"""AdamW with a compressing hook in a plain torchrun script: the README's recipe, literally.

One call builds the optimizer and the hook with matching settings (1-bit Adam's recipe:
``freeze_step`` dense AdamW steps, then the variance frozen and the momentum compressed)::

    run = compressed_adamw(ddp_model, "gs", lr=1e-3, weight_decay=0.01, density=0.01,
                           freeze_step=30, total_steps=300)
    ...
    run.optimizer.step()

Run it on two local gloo processes (an MLP of 76,330 parameters on MNIST, 32 samples a
worker, 300 steps) and compare with dense AdamW, whose averaging is
DDP's own all-reduce::

    torchrun --nproc_per_node 2 examples/adamw_ddp.py --method dense --out runs/adamw/dense.json
    torchrun --nproc_per_node 2 examples/adamw_ddp.py --method gs --out runs/adamw/gs.json

Each run prints, and with ``--out`` writes as JSON, the final loss on the whole training
set and on the test set, and the bytes this rank sent. ``--save-at N`` checkpoints every
rank's state after step N (``OUT_DIR/ckpt.rankR.pt``) and ``--resume DIR`` continues from
it; tests/ddp/test_adamw.py checks the resumed run against an independent reference.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gssgd.ddp import compressed_adamw


def mnist() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MNIST, flattened and normalised, from gssgd's offline copy (``pip install
    'gssgd[data]'``): 60,000 images to train, 10,000 to test."""
    from gssgd.train.data import load_dataset

    data = load_dataset("mnist")
    return (data.x_train.flatten(1), data.y_train, data.x_test.flatten(1), data.y_test)


def make_model(seed: int = 0) -> nn.Module:
    """An MLP of 76,330 parameters (784-96-10), the same on every rank."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(784, 96), nn.ReLU(), nn.Linear(96, 10))


def batch(step: int, rank: int, world: int, size: int, n: int, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s sample indices at ``step``: a pure function of (seed, step, rank)."""
    gen = torch.Generator().manual_seed(1_000_003 * seed + step)
    order = torch.randperm(n, generator=gen)[: size * world]
    return order[rank * size : (rank + 1) * size]


def train(args: argparse.Namespace) -> dict[str, Any]:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = mnist()
    model = make_model(args.seed)
    ddp_model = DistributedDataParallel(model)
    if args.method == "dense":  # dense AdamW: DDP's own all-reduce
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        run = None
    else:  # the recipe: one call, matching values
        run = compressed_adamw(ddp_model, args.method, lr=args.lr,
                               weight_decay=args.weight_decay, density=args.density,
                               freeze_step=args.freeze_step, total_steps=args.steps)
        optimizer = run.optimizer
    start = 0
    if args.resume:
        saved = torch.load(Path(args.resume) / f"ckpt.rank{rank}.pt", weights_only=True)
        model.load_state_dict(saved["model"])
        if run is not None:
            run.load_state_dict(saved["run"])
        else:
            optimizer.load_state_dict(saved["optimizer"])
        start = saved["step"]
    loss_fn = nn.CrossEntropyLoss()
    sent = 0
    for step in range(start, args.steps):
        idx = batch(step, rank, world, args.batch, len(y_train), args.seed)
        optimizer.zero_grad()
        loss_fn(ddp_model(x_train[idx]), y_train[idx]).backward()
        optimizer.step()
        if run is not None:
            sent += run.hook.last_stats.bytes_sent
        if args.save_at is not None and step + 1 == args.save_at and args.out:
            state = ({"run": run.state_dict()} if run is not None
                     else {"optimizer": optimizer.state_dict()})
            torch.save({"model": model.state_dict(), "step": step + 1, **state},
                       Path(args.out).parent / f"ckpt.rank{rank}.pt")
    with torch.no_grad():
        result = {
            "method": args.method,
            "train_loss": float(loss_fn(model(x_train), y_train)),
            "test_loss": float(loss_fn(model(x_test), y_test)),
            "bytes_sent": sent,
            "params": [p.detach().clone() for p in model.parameters()],
        }
    if rank == 0:
        print(f"{args.method}: train loss {result['train_loss']:.4f}, test loss "
              f"{result['test_loss']:.4f}, {sent:,} bytes sent by rank 0")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        torch.save(result, f"{args.out}.rank{rank}.pt")
        if rank == 0:
            summary = {k: v for k, v in result.items() if k != "params"}
            Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    del ddp_model, run, optimizer
    dist.destroy_process_group()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="gs", help="dense, or a compressing method")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--freeze-step", type=int, default=30, help="dense AdamW steps first")
    parser.add_argument("--batch", type=int, default=32, help="samples per worker per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0, help="initial model and batch order")
    parser.add_argument("--save-at", type=int, default=None, help="checkpoint after this step")
    parser.add_argument("--resume", default=None, help="the folder of a --save-at checkpoint")
    parser.add_argument("--out", default=None, help="summary JSON (and per-rank .pt) path")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    train(args)


if __name__ == "__main__":
    main()
