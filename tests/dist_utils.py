"""Run a function on real gloo processes (file rendezvous, so tests never collide).

The processes are forked from a server process that has already imported torch and gssgd
(multiprocessing's ``forkserver`` start method with those modules preloaded): a fresh
interpreter per rank (``spawn``) spent about 5 s of a 2-core machine's time importing torch
for every group of three ranks, against about 0.6 s forked. Each rank is still a separate
process with its own gloo group, started from a clean import (not from the test process's
state, as ``fork`` would be), and it gets the test process's environment as it is when the
group starts, as a spawned one would.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gssgd.train.launch import leave_process_group

#: What the fork server imports once for every rank it forks (the test module of ``fn`` is
#: imported in each rank when ``fn`` is unpickled, as under ``spawn``).
PRELOAD = ["torch", "torch.distributed", "numpy", "gssgd", "gssgd.aggregators", "gssgd.ddp",
           "tests.dist_utils"]  # fmt: skip


def _context() -> Any:
    """The ``forkserver`` context, its server to preload :data:`PRELOAD` (set before the
    server starts, on the first group)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def error_report(exc: BaseException) -> dict[str, str]:
    """The report of ``exc`` (call it while handling it) that :func:`raise_worker_errors`
    reads: what a worker returns instead of its result, and what a run that shares a spawn
    with others returns to its own test."""
    return {
        "__error__": repr(exc),
        "__type__": type(exc).__name__,
        "__traceback__": traceback.format_exc(),
    }


def _worker(
    rank: int, world_size: int, init_file: str, out_dir: str, env: dict[str, str], fn, args
) -> None:
    os.environ.clear()
    os.environ.update(env)  # the test process's, not the fork server's from its start
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=120),
    )
    try:
        result: Any = fn(rank, world_size, *args)
    except BaseException as exc:  # report to the parent, which re-raises
        result = error_report(exc)
    torch.save(result, os.path.join(out_dir, f"{rank}.pt"))
    del result
    # collect the DDP reducers (in reference cycles) that still hold the group, then destroy
    # it: left to interpreter exit, its gloo threads aborted the worker now and then
    if not leave_process_group(rank):
        raise SystemExit(1)


def run_workers(world_size: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes.

    Returns the per-rank results (anything torch.save can hold). An exception in a worker
    is returned as a dict with ``__error__``/``__type__``/``__traceback__`` so tests can
    assert on errors raised on every rank.
    """
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        ctx, env = _context(), dict(os.environ)
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, init_file, tmp, env, fn, args))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        for r, p in enumerate(procs):
            if p.is_alive():
                p.kill()
                raise TimeoutError(f"rank {r} did not finish")
            if p.exitcode != 0:
                raise RuntimeError(f"rank {r} exited with code {p.exitcode}")
        return [
            torch.load(os.path.join(tmp, f"{r}.pt"), weights_only=False) for r in range(world_size)
        ]


def run_each(rank: int, world_size: int, fn: Callable[..., Any], runs: Mapping[Any, tuple]) -> dict:
    """``fn(rank, world_size, *args)`` for every ``name: args`` of ``runs`` in turn, by name:
    several runs in one spawn (``run_workers(P, run_each, fn, runs)``), since starting the
    processes costs more than the runs. A run that raised is reported by
    :func:`error_report` to its own test; every rank must raise or stop alike, so the group
    stays usable for the next run."""
    out = {}
    for name, args in runs.items():
        try:
            out[name] = fn(rank, world_size, *args)
        except Exception as exc:  # noqa: BLE001 - reported to the test of this run
            out[name] = error_report(exc)
    return out


def run_on_prefixes(
    rank: int, world_size: int, fn: Callable[..., Any], sizes: Sequence[int], *args: Any
) -> dict[int, Any]:
    """``fn(rank, world_size, *args)`` on the whole world, then ``fn(rank, P, *args, group)``
    on the subgroup of ranks ``0..P-1`` for every smaller P of ``sizes`` (group-local
    ranks), by P: several world sizes in one spawn (``run_workers(max(sizes),
    run_on_prefixes, fn, sizes, ...)``), since starting processes costs seconds each.
    new_group is a collective of the whole world, so every group is made before any rank
    runs on one, and every rank waits for the others at the end."""
    groups = {size: dist.new_group(list(range(size))) for size in sizes if size < world_size}
    out = {world_size: fn(rank, world_size, *args)}
    for size, group in groups.items():
        if rank < size:
            out[size] = fn(rank, size, *args, group)
    dist.barrier()
    return out


def raise_worker_errors(results: list[Any]) -> None:
    for r, res in enumerate(results):
        if isinstance(res, dict) and "__error__" in res:
            raise AssertionError(f"rank {r} failed:\n{res['__traceback__']}")
