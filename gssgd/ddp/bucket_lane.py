"""The lane of a per-bucket hook that overlaps the backward pass (``HookState(...,
whole_model=False, overlap="buckets")``): the buckets' collectives reach every rank in the
same order whatever the timing, and the iteration ends only when every bucket is in.

PyTorch's DDP hands a hook its buckets in the same order on every rank, on the backward's
thread. A collective started there is in that order; one started from a callback or a
thread of one's own is not, unless one thread issues them all: gloo then fails with
"Received data size doesn't match expected size" (PyTorch's PowerSGD hook did, chaining its
second all-reduce on the first). :class:`BucketLane` keeps the order both ways it can.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future as Job
from concurrent.futures import ThreadPoolExecutor

import torch

from gssgd.comm import chain, new_future

__all__ = ["BucketLane"]


class BucketLane:
    """Where a hook's buckets are averaged while the backward pass goes on (``overlap=
    "buckets"``), so that their collectives reach every rank in the same order whatever the
    timing. Two ways in:

    * :meth:`launch`, for a method whose step is one collective started without waiting
      (:attr:`~gssgd.Aggregator.starts_async`, dense): the step starts on the caller's
      thread, in the order DDP hands the buckets over, and finishes in its collective's
      callback, as DDP's own all-reduce does: no thread, no copy beyond the payload.
    * :meth:`submit`, for every other method: one thread averages the buckets in the order
      they arrive, so rounds that depend on earlier ones are issued in that order too.

    On the thread, after a bucket fails the later ones fail too without communicating (a
    rank must not issue collectives its peers will not); a launched bucket always starts
    its collective (whether an earlier one has failed yet depends on timing, which differs
    between ranks). :meth:`drain` waits for every bucket and re-raises the first failure
    with its own type."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gssgd-buckets")
        self._jobs: list[Job | torch.futures.Future[torch.Tensor]] = []
        self._failed: BaseException | None = None

    def launch(self, start: Callable[[], torch.futures.Future[torch.Tensor]],
               then: Callable[[torch.Tensor], torch.Tensor], device: torch.device
               ) -> torch.futures.Future[torch.Tensor]:
        """Call ``start`` now (it starts the bucket's collective and returns the future of
        its update); ``then`` runs on that update when it completes (on the backend's
        thread). Returns the future of ``then``'s result."""
        fut = chain(start(), then, device)
        self._jobs.append(fut)
        return fut

    def submit(self, work: Callable[[], torch.Tensor], device: torch.device
               ) -> torch.futures.Future[torch.Tensor]:
        """Queue ``work`` on the lane's thread; the returned future completes with its
        result (or error)."""
        fut = new_future(device)

        def guarded() -> torch.Tensor:
            if self._failed is not None:
                raise RuntimeError(f"an earlier bucket failed: {self._failed}")
            try:
                return work()
            except BaseException as exc:
                self._failed = exc
                raise

        def hand_over(job: Job) -> None:
            exc = job.exception()
            if exc is None:
                fut.set_result(job.result())
            else:
                fut.set_exception(exc)

        job = self._pool.submit(guarded)
        job.add_done_callback(hand_over)
        self._jobs.append(job)
        return fut

    def drain(self) -> None:
        """Wait for every bucket; re-raise the first failure with its own type (a
        FloatingPointError stays one) and start the next iteration clean."""
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            if isinstance(job, Job):
                job.exception()  # waits
            else:
                try:
                    job.wait()
                except Exception as exc:  # chain keeps its type
                    if self._failed is None:
                        self._failed = exc
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed
