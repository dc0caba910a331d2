"""Balanced selection by chunk: every part of the model gets its share of the k coordinates.

DeMo (Peng et al. 2024) and SparseLoCo (2025) do not take the k largest coordinates of the
whole model: they cut it into chunks (DeMo: 64×64 DCT blocks; SparseLoCo: 4096 consecutive
elements) and take the largest of each chunk, so a layer whose gradient is small next to
another's still moves every step. gs-SGD can select the same way from its summed sketch
(its ``chunk`` option): the model's d coordinates are cut into chunks of ``chunk``
consecutive coordinates (the last one shorter); the m·k candidates are shared out over the
chunks in proportion to their lengths, the k delivered in proportion to the candidates
each chunk holds (:func:`shares`: so a chunk never owes more than it has and a step
delivers exactly k), and each chunk keeps its share of largest values
(:func:`grouped_topk_indices`). Every rank computes the same shares and, from the same
values, the same set, so the selection still needs no indices on the wire.
"""

from __future__ import annotations

import torch

__all__ = ["grouped_topk_indices", "shares"]


def shares(total: int, sizes: torch.Tensor) -> torch.Tensor:
    """``total`` selections shared out over groups in proportion to their ``sizes``.

    Group c of size n_c gets ``floor(total * n_c / N)`` (N the sizes' sum), and the
    ``total`` minus their sum left over go one each to the groups with the largest
    remainders ``total * n_c mod N`` (ties: the lower group). So the shares add up to
    ``total`` exactly and none exceeds its group's size: a group whose remainder is nonzero
    has ``floor(total * n_c / N) < n_c``.

    Args:
        total: the selections, in [0, N].
        sizes: int64 sizes of the groups (>= 0), N = their sum >= 1.

    Returns:
        int64 shares, one per group.

    Raises:
        ValueError: ``total`` outside [0, N].
    """
    n = int(sizes.sum())
    if not 0 <= total <= n:
        raise ValueError(f"total={total} is invalid: it must be in [0, {n}]")
    exact = total * sizes.to(torch.int64)  # exact integers: d * total fits int64
    quotas = exact // n
    left = total - int(quotas.sum())
    if left:
        by_remainder = torch.argsort(-(exact % n), stable=True)  # ties: the lower group
        quotas[by_remainder[:left]] += 1
    return quotas


def grouped_topk_indices(
    values: torch.Tensor, groups: torch.Tensor, quotas: torch.Tensor
) -> torch.Tensor:
    """Positions of each group's ``quotas[g]`` largest values, sorted.

    Ties go to the lower position, NaN and ±Inf count as the largest (an overflowed float16
    sketch's heaviest coordinates, as :meth:`gssgd.CountSketch.heavy_hitters` ranks them),
    so every rank holding the same ``values`` selects the same set. A group with fewer
    entries than its quota keeps them all.

    Steps (no sort of all the values: per group a partial top-k, as
    :func:`gssgd.selection.exact_topk_indices` does for one group):

    1. Lay the values out as a table, a row per group, in position order (groups given in
       any other order are first sorted stably by group, which keeps position order within
       a group); the unused cells of a short row hold -inf and are never taken. The
       table has ``len(quotas)`` rows as long as the largest group: for gs's chunks of C
       consecutive coordinates at most d + C cells.
    2. Each row's threshold ``t_g``: its ``quotas[g]``-th largest value (one ``torch.topk``
       of the largest quota over all rows).
    3. A row keeps every value above ``t_g`` and, of those equal to it, the lowest
       positions until its quota is met: exactly the first ``quotas[g]`` of a stable sort
       by decreasing value.

    Args:
        values: 1-D scores (typically ``|estimate|`` or ``|exact sum|``).
        groups: the group of each entry (an integer tensor, any order), in
            ``[0, len(quotas))``.
        quotas: how many to keep per group (int64).

    Returns:
        int64 positions into ``values``, ascending.
    """
    device = values.device
    scores = torch.nan_to_num(values, nan=torch.inf, posinf=torch.inf, neginf=torch.inf)
    groups = groups.to(torch.int64)
    n = scores.numel()
    by_group = None  # the stable sort by group, where the groups are not in position order
    if n > 1 and not bool((groups[1:] >= groups[:-1]).all()):
        by_group = torch.argsort(groups, stable=True)
        scores, groups = scores[by_group], groups[by_group]
    counts = torch.bincount(groups, minlength=quotas.numel())
    keep = torch.minimum(quotas.to(device=device, dtype=torch.int64), counts)
    most = int(keep.max()) if n else 0
    if most == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    starts = torch.cumsum(counts, 0) - counts
    cols = torch.arange(int(counts.max()), device=device)
    table = torch.full((counts.numel(), cols.numel()), -torch.inf, dtype=scores.dtype,
                       device=device)
    table[groups, torch.arange(n, device=device) - starts[groups]] = scores
    chosen = _each_rows_largest(table, cols < counts[:, None], keep, most)
    positions = (starts[:, None] + cols)[chosen]  # row by row: ascending
    return positions if by_group is None else by_group[positions].sort().values


def _each_rows_largest(table: torch.Tensor, real: torch.Tensor, keep: torch.Tensor,
                       most: int) -> torch.Tensor:
    """Steps 2-3 of :func:`grouped_topk_indices`: the mask of each row's ``keep[g]``
    largest cells among its ``real`` ones, ties to the lower column (``most``: the largest
    ``keep``)."""
    threshold = table.topk(most, dim=1).values.gather(1, (keep - 1).clamp(min=0)[:, None])
    above = (table > threshold) & real
    tied = (table == threshold) & real
    owed = keep - above.sum(1)  # in [1, ties] for a row with a quota
    if bool((tied.sum(1) > owed).any()):  # more ties than owed: the lowest positions
        tied &= tied.cumsum(1) <= owed[:, None]
    return (above | tied) & (keep > 0)[:, None]
