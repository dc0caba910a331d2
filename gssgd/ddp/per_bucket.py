"""Per-bucket mode (``whole_model=False``): bucket ``i`` has its own aggregator with
``d = bucket.numel()`` (k is resolved per bucket from ``density``), created the first time
the bucket is compressed, and its residual stays in that aggregator.

:func:`step` averages a bucket as soon as DDP hands it over, before it returns: the
backward waits. With ``overlap="buckets"`` (:func:`overlapped_step`) it does not: every
bucket but the last goes to the hook's :class:`~gssgd.comm.futures.BucketLane`, one
thread that averages the buckets in bucket order while the backward pass goes on, and the
hook returns a future the lane completes, as PyTorch's own all-reduce does. DDP launches
buckets in bucket order on every rank and one thread issues their collectives in that
order, so every rank sees the same sequence of collectives whatever the timing. The last
bucket (ready when the backward is done: nothing left to overlap) waits for the lane,
which re-raises a bucket's error with its own type, then is averaged in the hook: the
results are bitwise the synchronous path's. Under ``nonfinite="propagate"`` (the default
with a GradScaler) the buckets wait for the last one instead
(:meth:`~gssgd.ddp.core.HookCore._defer`) and :func:`iteration` steps them all, so no
bucket's state moves on a step the scaler skips.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gssgd.comm import completed_future
from gssgd.ddp.core import HookCore, Pending

__all__ = ["iteration", "overlapped_step", "step"]


def step(state: HookCore, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Per-bucket mode: the bucket's own aggregator averages it (before returning)."""
    return completed_future(_average(state, bucket.index(), bucket.parameters(),
                                     bucket.gradients(), bucket.buffer()))


def _average(state: HookCore, index: int, params: list[torch.Tensor],
             grads: list[torch.Tensor], buffer: torch.Tensor) -> torch.Tensor:
    """Bucket ``index``'s update from its own aggregator (its parameters, gradients and
    flat buffer as DDP handed them over)."""
    layout = state._layout(params)
    agg = state._aggregator(index, layout, buffer.numel(), f"bucket {index}", params)
    update = agg.step(buffer)
    state._hand_over_unused(params, grads, update)
    state._add_step(agg.last_stats, params)
    return update


def overlapped_step(state: HookCore, bucket: dist.GradBucket
                    ) -> torch.futures.Future[torch.Tensor]:
    """``overlap="buckets"``: every bucket but the last is averaged on the hook's lane while
    the backward goes on; the last waits for the lane, then is averaged here."""
    lane = state.bucket_lane()
    args = (state, bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer())
    if bucket.is_last():
        lane.drain()
        return completed_future(_average(*args))
    return lane.submit(lambda: _average(*args), bucket.buffer().device)


def iteration(state: HookCore, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Per-bucket mode under ``nonfinite="propagate"``, the last bucket.

    Steps: (1) every rank learns whether any bucket of the iteration is non-finite on
    any rank; (2) if so, every bucket's aggregator applies its non-finite policy (an
    all-NaN bucket, state untouched); else each steps in bucket order; (3) the updates
    go into the buckets' buffers and every pending future completes.
    """
    this = Pending(bucket.index(), bucket.parameters(), bucket.gradients(), bucket.buffer(), None)
    entries = sorted([*state._pending, this], key=lambda p: p.index)
    try:
        aggs = [
            state._aggregator(
                e.index, state._layout(e.params), e.buffer.numel(), f"bucket {e.index}",
                e.params,
            )
            for e in entries
        ]
        bad_ranks = state._nonfinite_ranks([e.buffer for e in entries])
        for e, agg in zip(entries, aggs, strict=True):
            update = agg.nonfinite_step(e.buffer, bad_ranks) if bad_ranks else agg.step(e.buffer)
            state._add_step(agg.last_stats, e.params)
            e.buffer.copy_(update)
            state._hand_over_unused(e.params, e.grads, update)
    except BaseException as exc:
        state._fail_pending(exc)
        raise
    state._complete_pending()
    return completed_future(this.buffer)
