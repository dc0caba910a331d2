"""gs-SGD in a PyTorch Lightning script, through ``DDPStrategy``'s comm-hook arguments.

Lightning takes a DDP communication hook and its state in its DDP strategy::

    strategy = DDPStrategy(ddp_comm_state=state, ddp_comm_hook=comm_hook)

but registers it only when the model runs on CUDA (``DDPStrategy`` skips the hook on
other devices, silently). On CPU (gloo) the :class:`RegisterHookOnCpu` callback below
registers the same hook on the DDP module Lightning made, at ``on_fit_start``, without
patching Lightning; on CUDA it does nothing, since the strategy already did it.

Notes:

* Bind the model for whole-model mode: ``state.bind(module)`` (the callback does it), so
  the residual follows the LightningModule's parameter order.
* Gradient accumulation (``Trainer(accumulate_grad_batches=N)``) runs the micro-batches
  under DDP's ``no_sync()``; the hook reduces once per optimizer step.
* Checkpoints: each rank owns its residual, and Lightning saves a checkpoint from rank 0
  only; save ``state.state_dict()`` per rank yourself (as ``OUT/final_rank{R}.pt`` here)
  if a run must resume exactly. Without it, a resumed run restarts the residuals at zero.

Run it on CPU with two gloo processes::

    torchrun --nproc_per_node 2 examples/lightning_gssgd.py --out runs/lightning

(``python examples/lightning_gssgd.py`` also works: Lightning then starts the second
process itself.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from gssgd.ddp import HookState, comm_hook


class RegisterHookOnCpu(L.Callback):
    """Register ``state`` with :func:`gssgd.ddp.comm_hook` where Lightning does not (CPU).

    Args:
        state: the hook state also given to ``DDPStrategy(ddp_comm_state=...)``.
    """

    def __init__(self, state: HookState) -> None:
        self.state = state

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.state.bind(pl_module)  # whole-model order = the module's parameter order
        ddp = trainer.strategy.model
        if trainer.strategy.root_device.type != "cuda" and isinstance(
            ddp, DistributedDataParallel
        ):
            ddp.register_comm_hook(self.state, comm_hook)


class Classifier(L.LightningModule):
    """A small MLP on a fixed synthetic task, trained with plain SGD (the sparse recipe)."""

    def __init__(self, lr: float) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same initial weights on every process
        self.net = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 10))
        self.lr = lr

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def data(n: int = 1024, dim: int = 20, classes: int = 10) -> TensorDataset:
    """A fixed synthetic classification task (a random linear teacher)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=gen)
    y = (x @ torch.randn(dim, classes, generator=gen)).argmax(1)
    return TensorDataset(x, y)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="gs", help="a gssgd method (dense, topk, gtopk, gs, ...)")
    p.add_argument("--density", type=float, default=0.01, help="fraction of coordinates sent")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--devices", type=int, default=2, help="processes")
    p.add_argument("--lr", type=float, default=0.2, help="plain SGD learning rate")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    state = HookState(args.method, density=args.density, whole_model=True)
    trainer = L.Trainer(
        accelerator="cpu" if not torch.cuda.is_available() else "gpu",
        devices=args.devices,
        strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=comm_hook),
        callbacks=[RegisterHookOnCpu(state)],
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = Classifier(args.lr)
    loader = DataLoader(data(), batch_size=16, shuffle=False, drop_last=True)
    trainer.fit(module, loader)

    args.out.mkdir(parents=True, exist_ok=True)
    final = {
        "params": [p.detach().cpu().clone() for p in module.parameters()],
        "hook": state.state_dict(),
        "bytes_sent": state.last_stats.bytes_sent,
        "steps": trainer.global_step,
    }
    torch.save(final, args.out / f"final_rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main()
