"""Every rank's hook state in one object, for checkpointing tools that save once.

Each rank of a compressed run has its own error-feedback residual, so each must save its
own hook state. Tools such as Hugging Face Accelerate (``accelerator.save_state`` with
``register_for_checkpointing``) or a script that writes one checkpoint from rank 0 save a
registered object once and load that one file on every rank. :class:`EveryRankHookState`
makes that work: ``state_dict()`` (called on every rank) gathers all ranks' hook states,
and ``load_state_dict()`` (every rank loads the same object) hands each rank its own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gssgd.ddp.paired import PairedRun
from gssgd.ddp.state import HookState

__all__ = ["EveryRankHookState", "to_cpu"]


class EveryRankHookState:
    """A hook state (or a one-call run's) as a save-once checkpointer needs it.

    ``state_dict()`` is a collective: every rank must call it (Accelerate's ``save_state``
    does). Tensors travel on the CPU.

    Args:
        state: this rank's :class:`~gssgd.ddp.HookState`, or the
            :class:`~gssgd.ddp.paired.PairedRun` of :func:`~gssgd.ddp.compressed_sgd` /
            :func:`~gssgd.ddp.compressed_adamw` (then its optimizer's state travels too).

    Example::
        >>> # xdoctest: +SKIP
        >>> accelerator.register_for_checkpointing(EveryRankHookState(state))
        >>> accelerator.save_state("ckpt")   # on every rank
        >>> accelerator.load_state("ckpt")   # each rank gets its own residual back
    """

    def __init__(self, state: HookState | PairedRun) -> None:
        if not isinstance(state, (HookState, PairedRun)):
            raise ValueError(
                f"state={type(state).__name__} is invalid: it must be a gssgd.ddp.HookState "
                "or what compressed_sgd / compressed_adamw returned."
            )
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        """``{"world_size": P, "ranks": [rank 0's state_dict(), ...]}`` (a collective)."""
        mine = to_cpu(self.state.state_dict())
        if not dist.is_initialized():
            return {"world_size": 1, "ranks": [mine]}
        ranks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        return {"world_size": len(ranks), "ranks": ranks}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Load this rank's part of :meth:`state_dict`.

        Raises:
            ValueError: not such a state, or saved by another number of processes.
        """
        if not isinstance(sd, dict) or not {"world_size", "ranks"} <= set(sd):
            raise ValueError(
                "not an EveryRankHookState state_dict: it needs the keys world_size and "
                "ranks; pass what EveryRankHookState.state_dict() returned."
            )
        world = dist.get_world_size() if dist.is_initialized() else 1
        if sd["world_size"] != world:
            raise ValueError(
                f"the hook state was saved by {sd['world_size']} processes, but {world} are "
                f"running; resume with {sd['world_size']} processes (accelerate launch "
                f"--num_processes {sd['world_size']}, or torchrun --nproc_per_node "
                f"{sd['world_size']}): each process owns its residual."
            )
        self.state.load_state_dict(sd["ranks"][dist.get_rank() if world > 1 else 0])


def to_cpu(tree: Any) -> Any:
    """``tree`` with every tensor detached and on the CPU, its dicts, lists and tuples
    rebuilt (what ``all_gather_object`` and a checkpoint of every rank carry)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_cpu(v) for v in tree)
    return tree
