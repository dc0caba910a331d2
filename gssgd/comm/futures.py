"""Futures for DDP communication hooks: one completed later, one already done, and a lane
of work that completes its futures in order on a thread of its own."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future as Job
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["BucketLane", "completed_future", "new_future"]


def new_future(device: torch.device) -> torch.futures.Future[torch.Tensor]:
    """A future that may hold tensors on ``device`` (CUDA futures must name their device):
    what a DDP communication hook returns for a bucket it completes later."""
    return torch.futures.Future(devices=[device] if device.type != "cpu" else None)


def completed_future(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A future that already holds ``tensor``."""
    fut = new_future(tensor.device)
    fut.set_result(tensor)
    return fut


class BucketLane:
    """One thread that averages a hook's buckets in the order they arrive (``overlap=
    "buckets"``), so that their collectives reach every rank in the same order while the
    backward pass goes on. After a bucket fails, the later ones fail too without
    communicating (a rank must not issue collectives its peers will not)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gssgd-buckets")
        self._jobs: list[Job] = []
        self._failed: BaseException | None = None

    def submit(self, work: Callable[[], torch.Tensor], device: torch.device
               ) -> torch.futures.Future[torch.Tensor]:
        """Queue ``work``; the returned future completes with its result (or error)."""
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
        """Wait for every queued bucket; re-raise the first failure with its own type (a
        FloatingPointError stays one) and start the next iteration clean."""
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.exception()  # waits
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed
