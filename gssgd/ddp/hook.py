"""The DDP communication hook itself: :func:`comm_hook` hands each bucket to its state
(:meth:`~gssgd.ddp.HookState.average`), which routes it to the dense warm-up or to the
per-bucket, whole-model or streaming mode (:class:`~gssgd.ddp.core.HookCore`); the
algorithm is described in :mod:`gssgd.ddp`.
"""

# No ``from __future__ import annotations`` here: DDP's register_comm_hook compares the
# hook's ``bucket`` and return annotations with dist.GradBucket and
# torch.futures.Future[torch.Tensor] as objects, and rejects them as strings.
import torch
import torch.distributed as dist

from gssgd.ddp.state import HookState

__all__ = ["comm_hook"]


def comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    r"""DDP communication hook that averages gradients with a gssgd aggregator.

    Runs the aggregator ``state.method`` (dense all-reduce, local Top-k, global Top-k,
    Sketched-SGD, gs-SGD or PowerSGD; see :mod:`gssgd.aggregators`) inside DDP's backward
    pass:

    1. For ``state.iter < state.start_iter``: average the bucket with a plain all-reduce.
    2. Per-bucket mode: ``update = agg.step(bucket.buffer())`` with the bucket's own
       aggregator (error feedback per bucket).
    3. Whole-model mode: defer buckets until the last one, then run one ``agg.step`` on
       the concatenated gradient in model order and hand each bucket its part.
    4. At the last bucket, count the iteration and publish ``state.last_stats``.

    Every rank gets bitwise the same update, so the replicas stay identical.

    Args:
        state: the :class:`HookState` holding the settings, residuals and statistics.
        bucket: the gradient bucket DDP hands over (a flat 1-D buffer of several
            parameters' gradients).

    Returns:
        A future holding the averaged gradient of the bucket (in whole-model mode, the
        futures of buckets before the last complete at the last bucket).

    Raises:
        ValueError: a bucket is smaller than an explicit ``k``, its layout differs from the
            one a loaded residual was saved for, or the ranks disagree on the settings.
        FloatingPointError: a non-finite gradient under ``nonfinite="raise"``, or
            ``max_consecutive_skips`` skipped steps in a row (without a scaler, the message
            says how to give the hook a GradScaler).

    Example::
        >>> # xdoctest: +SKIP
        >>> from gssgd.ddp import HookState, comm_hook
        >>> state = HookState("gs", density=0.01, start_iter=10)
        >>> ddp_model.register_comm_hook(state, comm_hook)
        >>> for x, y in loader:
        ...     optimizer.zero_grad()
        ...     loss_fn(ddp_model(x), y).backward()  # grads are gs-SGD's averaged update
        ...     optimizer.step()
    """
    return state.average(bucket)
