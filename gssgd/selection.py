"""Deterministic top-k selection: the same input gives the same set on every process.

``torch.topk`` returns *a* set of k largest values, but which of several equal values it
keeps is unspecified and differs between CPU and CUDA. Every rank of a distributed
aggregator must select the identical set, so ties are broken here by the lower index.

Two ways to the same answer (:data:`METHODS`):

* ``"exact"``: ``torch.topk`` over all ``n`` entries, then the tie rule.
* ``"sampled"``: DGC's trick (Lin et al., ICLR 2018, "Deep Gradient Compression"), kept
  exact: estimate the k-th largest value from a small fixed sample, keep the entries at or
  above a threshold a little below it, and rank only those. If fewer than k survive (the
  sample misled) or too many, fall back to ``"exact"``. With ``ordered=True`` the result
  is identical, element for element, to ``"exact"``.
* ``"auto"`` (the default) picks ``"sampled"`` where it is the faster of the two (CPU,
  ``n >= SAMPLED_MIN_N``, ``k / n <= SAMPLED_MAX_DENSITY``, ``ordered=True``) and
  ``"exact"`` elsewhere.

Balanced selection by chunk (:func:`grouped_topk_indices`, :func:`shares`; gs-SGD's
``chunk`` option, as DeMo and SparseLoCo select): the model's coordinates cut into chunks
of consecutive coordinates, the k shared out over the chunks in proportion to their
lengths (so a chunk never owes more than it has and a step delivers exactly k), and each
chunk keeps its share of largest values. Every rank computes the same shares and, from the
same values, the same set.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from gssgd import kernels

__all__ = [
    "METHODS",
    "SAMPLED_MAX_DENSITY",
    "SAMPLED_MIN_N",
    "exact_topk_indices",
    "grouped_topk_indices",
    "keep_largest",
    "sampled_topk_indices",
    "shares",
    "topk_indices",
]


METHODS: tuple[str, ...] = ("auto", "exact", "sampled")

#: ``"auto"`` samples from this many entries up (below it ``torch.topk`` is faster).
SAMPLED_MIN_N = 100_000
#: ... and up to this ``k / n``; above it the survivors are too many for sampling to pay.
SAMPLED_MAX_DENSITY = 0.05

_SAMPLE_MIN = 1024  # at least this many sample entries ...
_SAMPLE_MAX_FRACTION = 32  # ... and at most n / this
_SAMPLE_SIGMAS = 4.0  # lower the threshold by this many standard deviations of the count
_SAMPLE_SEED = 0x5E1EC7  # fixed: every process draws the same sample (never the global RNG)
_MAX_SURVIVOR_FRACTION = 0.5  # more survivors than n * this: ranking them does not pay


def _check_k(values: torch.Tensor, k: int) -> int:
    n = values.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, {n}]")
    return n


def topk_indices(
    values: torch.Tensor, k: int, ordered: bool = True, method: str = "auto"
) -> torch.Tensor:
    """Indices of the ``k`` largest entries of a 1-D tensor, ties broken by lower index.

    Args:
        values: 1-D tensor (typically ``|x|``); NaN is not allowed.
        k: ``1 <= k <= values.numel()``.
        ordered: sort the result (else the same set in an unspecified order, cheaper).
        method: ``"auto"`` (default), ``"exact"`` or ``"sampled"``; see the module doc.
            All return the same set; with ``ordered=True`` the same tensor. With
            ``ordered=False`` the order may differ between ``"exact"`` and ``"sampled"``,
            so ``"auto"`` then keeps to ``"exact"`` (callers that break ties by position
            in an unordered result see no change).

    Returns:
        int64 tensor of k indices, by decreasing value, ties by increasing index.
    """
    if method == "auto":
        method = "sampled" if _sampling_pays(values, k, ordered) else "exact"
    if method == "exact":
        return exact_topk_indices(values, k, ordered)
    if method == "sampled":
        return sampled_topk_indices(values, k, ordered)[0]
    raise ValueError(f"method={method!r} must be one of {METHODS}")


def _sampling_pays(values: torch.Tensor, k: int, ordered: bool) -> bool:
    """``"auto"``'s choice: a function of shape, k, device and ``ordered`` only, so every
    rank of a job makes the same one."""
    n = values.numel()
    return (
        ordered
        and values.device.type == "cpu"  # elsewhere torch.topk is left to do it
        and n >= SAMPLED_MIN_N
        and k <= SAMPLED_MAX_DENSITY * n
    )


def exact_topk_indices(values: torch.Tensor, k: int, ordered: bool = True) -> torch.Tensor:
    """:func:`topk_indices` by ``torch.topk`` over all entries.

    Steps: (1) ``torch.topk`` finds k largest values and the k-th value ``t``; (2) if fewer
    entries equal ``t`` were picked than exist, re-pick the ties in index order; (3) order
    the result by decreasing value, then increasing index.
    """
    _check_k(values, k)
    top_vals, top_idx = torch.topk(values, k, sorted=False)
    threshold = top_vals.min()
    picked_ties = int(torch.count_nonzero(top_vals == threshold))
    all_ties = int(torch.count_nonzero(values == threshold))
    if all_ties != picked_ties:
        above = torch.nonzero(values > threshold).flatten()
        ties = torch.nonzero(values == threshold).flatten()[: k - above.numel()]
        top_idx = torch.cat([above, ties])
    return _by_value_then_index(values, top_idx) if ordered else top_idx


_SORTABLE_AS_INT32 = (torch.float32, torch.float16, torch.bfloat16)
_LOW32 = 0xFFFFFFFF


def _by_value_then_index(values: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``idx`` ordered by decreasing ``values[idx]``, equal values by increasing index.

    For float32/16/bfloat16 one ascending sort of a unique int64 key: the high half is the
    value's float32 bits made to order as signed integers, then inverted (``~``: larger
    values first), the low half the index. A fraction of the cost of the general route (a
    stable sort by value after sorting by index; CPU sorts int64 ascending far faster than
    floats descending), which other dtypes and over 2**32 entries take. Same tensor.
    """
    if values.dtype in _SORTABLE_AS_INT32 and values.numel() <= _LOW32 + 1:
        # + 0.0 makes -0.0 (equal to 0.0, so a tie) +0.0; float32 holds 16-bit floats exactly.
        bits = (values[idx].float() + 0.0).view(torch.int32)
        # Negative floats order backwards as integers: flip all but the sign bit.
        key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
        key = torch.bitwise_not(key) * (_LOW32 + 1) + idx
        return torch.sort(key).values & _LOW32
    idx = idx.sort().values
    return idx[torch.sort(values[idx], descending=True, stable=True).indices]


@lru_cache(maxsize=4)
def _sample_positions(n: int, stride: int, device: torch.device) -> torch.Tensor:
    """One position in each block of ``stride`` entries, at a fixed pseudo-random offset.

    Stratified (no repeats, even coverage) and jittered (no alignment with the rows of a
    flattened matrix, which a plain stride would sample in the same columns every time).
    Drawn from a private generator with a fixed seed: the global RNG is never touched.
    """
    blocks = n // stride
    gen = torch.Generator().manual_seed(_SAMPLE_SEED)
    offsets = torch.randint(0, stride, (blocks,), generator=gen)
    return (torch.arange(blocks) * stride + offsets).to(device)


def _sample_plan(n: int, k: int) -> tuple[int, int]:
    """``(stride, rank)``: sample one entry in ``stride``; the threshold is the ``rank``-th
    largest sampled value, a few standard deviations below the k-th largest of all.

    Sample size ``s`` trades its own cost (one gather and a small top-k each) against the
    surplus survivors, about ``4 * sqrt(k * n / s) + 2 * n / s``; both are balanced near
    ``max(sqrt(2n), 2 * (k * n) ** (1/3))``.
    """
    size = max(_SAMPLE_MIN, math.ceil(math.sqrt(2 * n)), math.ceil(2 * (k * n) ** (1 / 3)))
    size = min(size, max(1, n // _SAMPLE_MAX_FRACTION))
    stride = max(1, n // size)
    size = n // stride
    hits = k * size / n  # expected sampled entries among the top k
    rank = min(size, math.ceil(hits + _SAMPLE_SIGMAS * math.sqrt(hits)) + 2)
    return stride, rank


def _at_least(values: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """``torch.nonzero(values >= threshold)``, flat, ascending, at about a third of its cost.

    The mask is read as 8-byte words: only the few nonzero words are expanded to bytes.
    Where :func:`gssgd.kernels.use_kernels` says so (CUDA with Triton), one Triton
    count/compact kernel does it instead (:func:`gssgd.kernels.at_least`, same result).
    """
    if kernels.use_kernels(values):
        return kernels.at_least(values, threshold)
    n = values.numel()
    pad = -n % 8
    mask = torch.empty(n + pad, dtype=torch.bool, device=values.device)
    if pad:
        mask[n:] = False
    torch.ge(values, threshold, out=mask[:n])
    words = mask.view(torch.int64)
    hit = torch.nonzero(words).flatten()
    where = torch.nonzero(words[hit].view(torch.bool).view(-1, 8))
    return hit[where[:, 0]] * 8 + where[:, 1]


def sampled_topk_indices(
    values: torch.Tensor, k: int, ordered: bool = True
) -> tuple[torch.Tensor, str]:
    """:func:`topk_indices` by a sampled threshold, and which path produced it.

    1. Take a fixed stratified sample of ``s`` entries (``max(sqrt(2n), 2 (kn)^(1/3))``,
       at least 1024, at most ``n / 32``) and its ``r``-th largest value ``tau``, with
       ``r`` four standard deviations (plus 2) above the sample's expected share of the top k.
    2. Keep the entries ``>= tau`` (ascending indices).
    3. If at least k survive, ``tau`` is at or below the k-th largest value ``t``, so every
       entry above ``t`` and *every* entry equal to ``t`` survived: the exact selection
       among the survivors (ties to the lower survivor position, i.e. the lower index) is
       the exact selection among all. With ``ordered=True`` it is the same tensor as
       :func:`exact_topk_indices`; unordered, the same set in another order.

    Correctness never depends on the sample; only speed does.

    Returns:
        ``(indices, path)``; ``path`` is ``"sampled"``, or the reason for falling back to
        :func:`exact_topk_indices`: ``"small"`` (nothing to gain: k near n or a tiny n),
        ``"few"`` (fewer than k survivors: the sample misled) or ``"many"`` (more than half
        of the entries survived, e.g. many ties at the threshold).
    """
    n = _check_k(values, k)
    stride, rank = _sample_plan(n, k)
    if stride < 2 or k > _MAX_SURVIVOR_FRACTION * n:
        return exact_topk_indices(values, k, ordered), "small"
    sample = values.reshape(-1)[_sample_positions(n, stride, values.device)]
    tau = torch.topk(sample, rank, sorted=False).values.min()
    survivors = _at_least(values, tau)
    count = survivors.numel()
    if count < k:
        return exact_topk_indices(values, k, ordered), "few"
    if count > _MAX_SURVIVOR_FRACTION * n:
        return exact_topk_indices(values, k, ordered), "many"
    keep = exact_topk_indices(values[survivors], k, ordered)
    return survivors[keep], "sampled"


def keep_largest(values: torch.Tensor, n: int) -> torch.Tensor:
    """``values`` with all but its ``n`` largest ``|values|`` set to zero (ties to the lower
    index): a sketching method's local pre-filter (``prefilter``). ``n >= values.numel()``
    returns ``values`` itself."""
    if n >= values.numel():
        return values
    keep = topk_indices(values.abs(), n)
    out = torch.zeros_like(values)
    out[keep] = values[keep]
    return out


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
