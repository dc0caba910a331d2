"""Timing one GPU (or CPU) operation: the median of repeated runs, with the kernels
switched on or off around it (``GSSGD_KERNELS``)."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator

import torch

from gssgd import kernels
from gssgd_lab.kernel_config import KernelBenchConfig

__all__ = ["kernel_mode", "median_ms", "no_setup", "timing_entry"]


@contextlib.contextmanager
def kernel_mode(value: str) -> Iterator[None]:
    """``GSSGD_KERNELS=value`` inside the block (restored after)."""
    old = os.environ.get(kernels.MODE_ENV)
    os.environ[kernels.MODE_ENV] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(kernels.MODE_ENV, None)
        else:
            os.environ[kernels.MODE_ENV] = old


def median_ms(
    fn: Callable[[int], object], prepare: Callable[[int], None], cfg: KernelBenchConfig
) -> float:
    """Median milliseconds of ``fn(i)`` over ``cfg.repeats`` runs after ``cfg.warmup``
    untimed ones; ``prepare(i)`` (untimed) sets up run ``i``. CUDA events time it on
    CUDA, ``time.perf_counter`` on the CPU."""
    cuda = cfg.device == "cuda"
    times = []
    for i in range(cfg.warmup + cfg.repeats):
        prepare(i)
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn(i)
            elapsed = 1e3 * (time.perf_counter() - t0)
        if i >= cfg.warmup:
            times.append(elapsed)
    return statistics.median(times)


def no_setup(i: int) -> None:
    """The ``prepare`` of an operation that needs none."""
    return None


def timing_entry(torch_ms: float, kernel_ms: float | None, nbytes: float, check: str) -> dict:
    """One operation's report entry: both times, the kernel's speed-up, the bytes it must
    move, the effective GB/s of the faster path, and the check of its output."""
    best = torch_ms if kernel_ms is None else kernel_ms
    return {
        "torch_ms": torch_ms,
        "kernel_ms": kernel_ms,
        "speedup": None if kernel_ms is None else torch_ms / kernel_ms,
        "bytes": int(nbytes),
        "GBps": nbytes / (best * 1e6),
        "check": check,
    }
