"""Searching several methods at once: ``gssgd study --jobs N``.

A method's search is sequential (a TPE trial depends on the trials before it), but methods
are independent of one another once the reference's value is known. With ``jobs > 1``
each method's whole search (its trials, then its best at the other seeds) runs in a
process of its own, ``jobs`` at a time, in the spec's order. Every run is the same pure
function of its setting as in one process, so the summary equals, byte for byte, the one
a single process writes (tests/study/test_parallel.py); only the wall-clock time changes.

Dying together: a worker process dies with the study (Linux's parent-death signal, and a
check of its parent between runs elsewhere), so a killed study leaves no orphan training
into the folders a resumed study will use. A study that fails in one method stops the
others (their cut runs train again from the start on resume, as any killed run does).
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gssgd.study.curves import Metric
from gssgd.study.search import MethodResult, search_method
from gssgd.study.spec import MethodSpace, StudySpec

__all__ = ["check_jobs", "search_methods"]

#: How often (seconds) the study looks at its workers while it waits for their messages.
POLL_SECONDS = 0.5


def check_jobs(jobs: int) -> None:
    """Raises ValueError (naming the value and the fix) unless ``jobs`` is 1 or more."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: give how many methods to search at once, 1 or more "
                         "(1 searches them one after the other)")


def search_methods(spec: StudySpec, rows: list[MethodSpace], root: Path, metric: Metric,
                   reference: float | None, tick: Callable[[str], None],
                   jobs: int = 1) -> dict[str, MethodResult]:
    """Search every method of ``rows`` (:func:`~gssgd.study.search.search_method`),
    ``jobs`` of them at a time.

    Args:
        spec, rows: the study and the methods to search.
        root: the study's run folders.
        metric, reference: what is judged, and the reference's value.
        tick: called after each run with a short description (from this process).
        jobs: how many methods to search at once (1: one after the other, here).

    Returns:
        Each method's result by label, in ``rows``' order.

    Raises:
        ValueError: ``jobs`` below 1.
        Whatever a method's search raised (the first to fail; the others are stopped), or
        RuntimeError when a worker process died without a word (killed, out of memory).
    """
    check_jobs(jobs)
    if jobs == 1 or len(rows) <= 1:
        return {row.label: search_method(spec, row, root, metric, reference, tick)
                for row in rows}
    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    todo, running, results = list(rows), {}, {}
    try:
        while todo or running:
            while todo and len(running) < jobs:
                row = todo.pop(0)
                worker = ctx.Process(target=_search_in_worker, name=f"gssgd-study-{row.label}",
                                     args=(spec, row, root, metric, reference, messages,
                                           os.getpid()))
                worker.start()
                running[row.label] = worker
            _handle(_next_message(messages), tick, results)
            for label, worker in list(running.items()):
                if label in results:
                    worker.join()
                    del running[label]
                elif not worker.is_alive():
                    _drain(messages, tick, results)  # its last words may still be in the pipe
                    if label not in results:
                        raise RuntimeError(f"the search of methods.{label} died without a "
                                           f"result (exit code {worker.exitcode}); run the "
                                           "study again to continue it")
    finally:
        for worker in running.values():
            if worker.is_alive():
                worker.kill()
            worker.join()
    return {row.label: results[row.label] for row in rows}


def _next_message(messages: Any) -> tuple[Any, ...] | None:
    try:
        return messages.get(timeout=POLL_SECONDS)
    except queue_module.Empty:
        return None


def _drain(messages: Any, tick: Callable[[str], None], results: dict[str, MethodResult]) -> None:
    while (message := _next_message(messages)) is not None:
        _handle(message, tick, results)


def _handle(message: tuple[Any, ...] | None, tick: Callable[[str], None],
            results: dict[str, MethodResult]) -> None:
    """A worker's message: ``("tick", text)``, ``("done", label, result)`` or
    ``("error", label, exception)`` (raised here)."""
    if message is None:
        return
    kind, *rest = message
    if kind == "tick":
        tick(rest[0])
    elif kind == "done":
        results[rest[0]] = rest[1]
    else:
        raise rest[1]


def _search_in_worker(spec: StudySpec, row: MethodSpace, root: Path, metric: Metric,
                      reference: float | None, messages: Any, parent: int) -> None:
    """One method's search in a worker process; what it finds (or raises) goes back on
    ``messages``."""
    _die_with(parent)

    def tick(text: str) -> None:
        if os.getppid() != parent:  # the study is gone (where no death signal was armed)
            os._exit(1)
        messages.put(("tick", text))

    try:
        messages.put(("done", row.label, search_method(spec, row, root, metric, reference,
                                                        tick)))
    except Exception as err:  # noqa: BLE001 - every failure goes back to the study
        try:
            messages.put(("error", row.label, err))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            messages.put(("error", row.label,
                          RuntimeError(f"methods.{row.label}: {type(err).__name__}: {err}")))


def _die_with(parent: int) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux), and end now if
    the parent died already."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(1)
