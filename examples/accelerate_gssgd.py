"""gs-SGD in a Hugging Face Accelerate script, with checkpoint and resume of the hook state.

Accelerate wraps the model in ``DistributedDataParallel`` itself, and its
``DDPCommunicationHookType`` can only name PyTorch's own hooks (fp16, bf16, PowerSGD). The
recipe for gssgd's hook:

1. ``accelerator.prepare(model, ...)``; the prepared model *is* the DDP module when there
   is more than one process: register the hook on it, ``model.register_comm_hook(state,
   comm_hook)``, with ``HookState(..., model=accelerator.unwrap_model(model))`` so the
   whole-model residual follows the parameter order (a resume then needs no dense step).
2. Register the hook state for checkpointing. Each rank has its *own* residual, while
   ``accelerator.save_state`` writes a registered object once (from the main process), and
   every rank loads that one file. :class:`gssgd.ddp.EveryRankHookState` therefore gathers
   all ranks' states into the saved object and hands each rank its own on load:
   ``accelerator.register_for_checkpointing(EveryRankHookState(state))``, before
   ``accelerator.load_state``.
3. Gradient accumulation: ``with accelerator.accumulate(model):`` runs the micro-batches
   between optimizer steps under DDP's ``no_sync()``; the hook reduces (and counts) once
   per optimizer step, on the summed gradient.

Run it on GPUs with ``accelerate launch --multi_gpu --num_processes 2 examples/...``, or on
CPU with two gloo processes (``accelerate launch --cpu`` starts only one process; Accelerate
uses gloo on CPU when ``ACCELERATE_USE_CPU`` is set under torchrun)::

    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 2 examples/accelerate_gssgd.py \\
        --save-at 20 --out runs/acc
    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 2 examples/accelerate_gssgd.py \\
        --resume runs/acc/checkpoint --out runs/acc-resumed

It writes ``OUT/final_rank{R}.pt`` (parameters and hook state) so a resumed run can be
compared with an uninterrupted one (tests/test_accelerate.py does that).
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from gssgd.ddp import EveryRankHookState, HookState, comm_hook


class Progress:
    """The number of optimizer steps done (checkpointed beside the hook state)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.step = int(sd["step"])


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
    p.add_argument("--steps", type=int, default=40, help="optimizer steps in total")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--batch-size", type=int, default=16, help="per process and micro-batch")
    p.add_argument("--lr", type=float, default=0.2, help="plain SGD (the sparse recipe)")
    p.add_argument("--save-at", type=int, default=None, help="save a checkpoint after this step")
    p.add_argument("--resume", type=Path, default=None, help="a checkpoint folder to resume")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    accelerator = Accelerator(gradient_accumulation_steps=args.accumulate)
    torch.manual_seed(0)  # the same initial weights on every process
    model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)  # no momentum: sparse recipe
    loader = DataLoader(data(), batch_size=args.batch_size, shuffle=False, drop_last=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    # The hook: on the DDP module Accelerate made (one process: no DDP, no hook).
    state = HookState(args.method, density=args.density, model=accelerator.unwrap_model(model))
    if isinstance(model, DistributedDataParallel):
        model.register_comm_hook(state, comm_hook)
    progress = Progress()
    accelerator.register_for_checkpointing(EveryRankHookState(state), progress)
    if args.resume is not None:
        accelerator.load_state(str(args.resume))

    started_at = progress.step
    loss_fn = nn.CrossEntropyLoss()
    batches_done = progress.step * args.accumulate
    micro_batches = _cycle(accelerator, loader, batches_done)
    while progress.step < args.steps:
        for _ in range(args.accumulate):
            x, y = next(micro_batches)
            with accelerator.accumulate(model):
                loss = loss_fn(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        progress.step += 1
        if accelerator.is_main_process and progress.step % 10 == 0:
            print(f"step {progress.step}: loss {loss.item():.4f}, hook iter {state.iter}")
        if progress.step == args.save_at:
            accelerator.save_state(str(args.out / "checkpoint"))

    args.out.mkdir(parents=True, exist_ok=True)
    params = [p.detach().cpu().clone() for p in accelerator.unwrap_model(model).parameters()]
    final = {"params": params, "hook": state.state_dict(), "step": progress.step,
             "started_at": started_at}
    torch.save(final, args.out / f"final_rank{accelerator.process_index}.pt")
    # Leave as a torchrun script should: DDP's reducer holds the process group in a
    # reference cycle; destroyed while that lives, the group can abort the process in C++
    # at exit. So release the prepared objects, collect, then destroy (end_training).
    accelerator.free_memory()
    del model, optimizer, loader
    gc.collect()
    accelerator.end_training()


def _cycle(accelerator: Accelerator, loader: DataLoader, skip: int):
    """Endless micro-batches, starting ``skip`` batches in (on resume)."""
    epoch_len = len(loader)
    first = accelerator.skip_first_batches(loader, skip % epoch_len) if skip else loader
    yield from first
    while True:
        yield from loader


if __name__ == "__main__":
    main()
