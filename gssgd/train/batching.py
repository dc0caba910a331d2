"""Deterministic batching: :func:`batch_indices` (images) and :func:`lm_batch` (text).

Batches are pure functions of their arguments, so a resumed run draws exactly the
batches the interrupted run would have drawn without storing any sampler state, and
no function here touches the global random number generator.
"""

from __future__ import annotations

import hashlib

import torch

from gssgd.validate import check_int

__all__ = ["batch_indices", "lm_batch"]


def _check_rank(rank: int, world_size: int) -> None:
    check_int("world_size", world_size, 1)
    check_int("rank", rank, 0, world_size - 1, f"world_size is {world_size}.")


def batch_indices(
    step: int, rank: int, world_size: int, batch_size: int, n: int, seed: int
) -> torch.Tensor:
    """The sample indices this rank trains on at ``step``.

    1. ``epoch, i = divmod(step, steps_per_epoch)`` with
       ``steps_per_epoch = (n // world_size) // batch_size``.
    2. Permute ``range(n)`` with an owned generator seeded with ``seed + epoch``.
    3. Rank ``r`` owns every ``world_size``-th entry of the permutation starting at
       ``r`` (the last ``n % world_size`` entries are dropped, so shards are equal and
       disjoint); its ``i``-th batch is the ``i``-th run of ``batch_size`` entries of
       its shard (a trailing partial batch is dropped, like ``drop_last=True``).

    The result depends on the arguments only, so a resumed run needs no sampler
    state, and the global RNG is never touched.

    Args:
        step: the global step, ``>= 0``.
        rank: this rank, ``0 <= rank < world_size``.
        world_size: the number of ranks, ``>= 1``.
        batch_size: samples per rank per step, ``>= 1``.
        n: the number of training samples, ``>= world_size * batch_size``.
        seed: the run's data seed, ``>= 0``.

    Returns:
        int64 tensor of ``batch_size`` distinct indices in ``[0, n)``.

    Raises:
        ValueError: an argument is not an integer in its range (the message says the range).

    Example::

        >>> batch_indices(step=0, rank=1, world_size=2, batch_size=4, n=100, seed=0).shape
        torch.Size([4])
    """
    check_int("step", step, 0)
    _check_rank(rank, world_size)
    check_int("batch_size", batch_size, 1)
    check_int("seed", seed, 0)
    check_int("n", n, world_size * batch_size,
              fix=f"It must hold world_size {world_size} * batch_size {batch_size}: lower the "
              "batch size or the number of workers.")
    steps_per_epoch = (n // world_size) // batch_size
    epoch, i = divmod(step, steps_per_epoch)
    generator = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(n, generator=generator)
    shard = order[rank : world_size * (n // world_size) : world_size]
    return shard[i * batch_size : (i + 1) * batch_size]


def _mixed_seed(*parts: int) -> int:
    """A 64-bit seed that depends on every part (no collisions like ``seed + step``)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def lm_batch(
    data: torch.Tensor,
    step: int,
    rank: int,
    world_size: int,
    batch_size: int,
    seq_len: int,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of a character stream for next-character prediction.

    Window starts are drawn uniformly from an owned generator seeded from
    ``(seed, step, rank)``, so the batch is a pure function of the arguments (exact
    resume, global RNG untouched) and ranks draw independent windows.

    Args:
        data: 1-D int64 character ids (``TextData.train`` or ``.test``), longer than
            ``seq_len``.
        step: the global step, ``>= 0``.
        rank: this rank, ``0 <= rank < world_size``.
        world_size: the number of ranks, ``>= 1``.
        batch_size: windows per rank per step, ``>= 1``.
        seq_len: characters per window, ``>= 1``.
        seed: the run's data seed, ``>= 0``.

    ``world_size`` only bounds ``rank``: windows are drawn independently per rank, not
    from disjoint shards (with millions of characters, overlaps are rare and harmless).

    Returns:
        ``(inputs, targets)``, both int64 of shape ``(batch_size, seq_len)``;
        ``targets[b, t]`` is the character after ``inputs[b, t]``.

    Raises:
        ValueError: an argument is not an integer in its range, or ``data`` is not 1-D or too
            short.
    """
    check_int("step", step, 0)
    _check_rank(rank, world_size)
    check_int("batch_size", batch_size, 1)
    check_int("seq_len", seq_len, 1)
    check_int("seed", seed, 0)
    if data.dim() != 1:
        raise ValueError(
            f"data must be a 1-D tensor of character ids, got shape {tuple(data.shape)}"
        )
    if len(data) <= seq_len:
        raise ValueError(
            f"seq_len must be < len(data) = {len(data)}, got {seq_len}; use a shorter seq_len or more text"
        )
    generator = torch.Generator().manual_seed(_mixed_seed(seed, step, rank))
    starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=generator)
    windows = data[starts[:, None] + torch.arange(seq_len + 1)]
    return windows[:, :-1], windows[:, 1:]
