"""Running a study's runs at once: ``gssgd study --jobs N``.

Two kinds of work go to ``jobs`` worker processes, each in a process of its own:

* **Runs known in advance** (:func:`run_planned`). A Latin hypercube, a grid or random
  draws ask the same settings whatever the outcomes
  (:func:`~gssgd.study.search.planned_settings`), so every method's trials can train at
  once, the reference's first; as soon as a method's trials are done and the target is
  known (the reference's best at every seed), its best setting's other seeds follow. No
  core waits for a method to finish its search.
* **Whole searches** (:func:`search_methods`), for TPE, whose trials follow the earlier
  outcomes: each method's search (its trials, then its best at the other seeds) in a
  process, once the reference's value is known.

Every run is the same pure function of its setting wherever it runs, and the study then
reads each run back in the spec's order exactly as one process would, so the summary
equals, byte for byte, the one a single process writes (tests/study/test_parallel.py);
only the wall-clock time changes.

Dying together: a worker process dies with the study (Linux's parent-death signal; a
whole search also checks its parent between runs), and so do the ranks a real-process run
starts in it (:func:`~gssgd.train.launch.die_with_launcher`), so a killed study leaves no
orphan training into the folders a resumed study will use. A study that fails in one
worker stops the others (their cut runs train again from the start on resume, as any
killed run does).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue as queue_module
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gssgd.study.curves import Metric
from gssgd.study.search import (
    PLANNED_SAMPLERS,
    MethodResult,
    best_trial,
    planned_settings,
    reference_value,
    search_method,
    seed_dir,
    seed_text,
    train_run,
    trial_dirs,
    trial_meta,
    trial_text,
)
from gssgd.study.spec import MethodSpace, StudySpec
from gssgd.study.trials import finished, read_outcome
from gssgd.train.launch import die_with_parent

__all__ = ["check_jobs", "run_planned", "search_methods"]

#: How often (seconds) the study looks at its workers while it waits for their messages.
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Task:
    """One piece of work for a worker process: ``fn(*args)`` (with a ``tick`` callback
    last where ``ticks`` is set: a whole search reports each of its runs; a single run is
    reported by its ``name`` when done). ``fn`` None: already done, nothing to run."""

    name: str
    fn: Callable[..., Any] | None
    args: tuple[Any, ...] = ()
    ticks: bool = False


def check_jobs(jobs: int) -> None:
    """Raises ValueError (naming the value and the fix) unless ``jobs`` is 1 or more."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: give how many runs (or TPE searches) to train at "
                         "once, 1 or more (1 trains them one after the other)")


def search_methods(spec: StudySpec, rows: list[MethodSpace], root: Path, metric: Metric,
                   reference: float | None, tick: Callable[[str], None],
                   jobs: int = 1) -> dict[str, MethodResult]:
    """Search every method of ``rows`` (:func:`~gssgd.study.search.search_method`): a TPE
    search ``jobs`` methods at a time; one whose settings are planned ahead here, one after
    the other (:func:`run_planned` trained its runs: they are only read back).

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
    if jobs == 1 or len(rows) <= 1 or spec.sampler in PLANNED_SAMPLERS:
        return {row.label: search_method(spec, row, root, metric, reference, tick)
                for row in rows}
    tasks = [Task(row.label, search_method, (spec, row, root, metric, reference), ticks=True)
             for row in rows]
    results = run_tasks(tasks, jobs, tick)
    return {row.label: results[row.label] for row in rows}


def run_planned(spec: StudySpec, root: Path, metric: Metric, tick: Callable[[str], None],
                jobs: int) -> None:
    """Train every run of a study whose settings are known in advance, ``jobs`` at a time
    (nothing for ``jobs`` 1 or a TPE search): the reference's trials first, then every
    other method's; each method's best at the other seeds once its trials are done and
    the target is known. The study reads them back afterwards (:func:`search_methods`).

    Raises:
        What a run raised (the first to fail; the others are stopped), RuntimeError where
        a worker died without a word or the reference stopped early at a seed.
    """
    check_jobs(jobs)
    if jobs == 1 or spec.sampler not in PLANNED_SAMPLERS:
        return
    plan = _Plan(spec, root, metric)
    run_tasks(plan.first(), jobs, tick, plan.then)


class _Plan:
    """Which runs may start, as runs end: the bookkeeping of :func:`run_planned`."""

    def __init__(self, spec: StudySpec, root: Path, metric: Metric) -> None:
        self.spec, self.root, self.metric = spec, root, metric
        self.rows = {row.label: row for row in spec.methods}
        self.reference_label = spec.method(spec.reference).label
        self.settings = {label: planned_settings(spec, row) or []
                         for label, row in self.rows.items()}
        self.trials_left = {label: spec.budget for label in self.rows}
        self.seeds_left = len(spec.seeds) - 1  # the reference's other seeds
        self.target: float | None = None
        self.waiting: list[str] = []  # trials done, the target not yet known
        self.of_task: dict[str, tuple[str, str]] = {}  # task name -> (label, "trial"/"seed")

    def first(self) -> list[Task]:
        """Every method's trials, the reference's first."""
        order = [self.reference_label,
                 *(label for label in self.rows if label != self.reference_label)]
        return [task for label in order for task in self._trials(label)]

    def then(self, name: str) -> list[Task]:
        """The runs that ``name``'s end lets start."""
        label, kind = self.of_task[name]
        if kind == "seed":
            if label != self.reference_label:
                return []
            self.seeds_left -= 1
            return self._target_known() if self.seeds_left == 0 else []
        self.trials_left[label] -= 1
        if self.trials_left[label]:
            return []
        if label == self.reference_label:
            seeds = self._seeds(label, None)
            return seeds or self._target_known()
        if self.target is None:
            self.waiting.append(label)
            return []
        return self._seeds(label, self.target)

    def _target_known(self) -> list[Task]:
        row = self.rows[self.reference_label]
        best = trial_dirs(self.root, row, self.spec.budget)[self._best(row.label, None)]
        outs = [best, *(seed_dir(self.root, row, s) for s in self.spec.seeds[1:])]
        self.target = reference_value(
            row.label, [read_outcome(out, self.metric, None) for out in outs])
        waiting, self.waiting = self.waiting, []
        return [task for label in waiting for task in self._seeds(label, self.target)]

    def _best(self, label: str, target: float | None) -> int:
        """The index of ``label``'s best trial, judged against ``target``."""
        dirs = trial_dirs(self.root, self.rows[label], self.spec.budget)
        outcomes = [read_outcome(out, self.metric, target) for out in dirs]
        return best_trial(outcomes, self.metric, target)

    def _trials(self, label: str) -> list[Task]:
        row = self.rows[label]
        dirs = trial_dirs(self.root, row, self.spec.budget)
        return [self._task(trial_text(row, i, self.spec.budget), label, "trial",
                           (self.spec, row, params, self.spec.seeds[0], out))
                for i, (params, out) in enumerate(zip(self.settings[label], dirs, strict=True))]

    def _seeds(self, label: str, target: float | None) -> list[Task]:
        row, params = self.rows[label], self.settings[label][self._best(label, target)]
        return [self._task(seed_text(row, seed), label, "seed",
                           (self.spec, row, params, seed, seed_dir(self.root, row, seed)))
                for seed in self.spec.seeds[1:]]

    def _task(self, name: str, label: str, kind: str, args: tuple[Any, ...]) -> Task:
        """A run (``args``: spec, row, setting, seed, folder); none where it is done (a
        folder of another setting is refused, as :func:`search_method` would)."""
        self.of_task[name] = (label, kind)
        done = finished(args[-1], trial_meta(*args[:-1]))
        return Task(name, None if done else train_run, args)


def run_tasks(tasks: list[Task], jobs: int, tick: Callable[[str], None],
              then: Callable[[str], list[Task]] = lambda name: []) -> dict[str, Any]:
    """Run ``tasks`` ``jobs`` at a time, each in a worker process of its own, in order;
    ``then(name)``, called here as each ends, gives the tasks it lets start (they go
    first).

    Returns:
        Each task's result by name.

    Raises:
        What a task raised (the first; the others are stopped), or RuntimeError when a
        worker died without a word (killed, out of memory).
    """
    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    todo, running, results = list(tasks), {}, {}
    by_name = {task.name: task for task in tasks}

    def ended(name: str) -> None:
        if not by_name[name].ticks:
            tick(name)
        follow = then(name)
        by_name.update((task.name, task) for task in follow)
        todo[:0] = follow

    try:
        while todo or running:
            while todo and (len(running) < jobs or todo[0].fn is None):
                task = todo.pop(0)
                if task.fn is None:  # done before (a resumed study)
                    results[task.name] = None
                    ended(task.name)
                    continue
                worker = ctx.Process(target=_in_worker, name=f"gssgd-study-{task.name}",
                                     args=(task, messages, os.getpid()))
                worker.start()
                running[task.name] = worker
            for name in _handle(_next_message(messages), tick, results):
                ended(name)
            for name, worker in list(running.items()):
                if name in results:
                    worker.join()
                    del running[name]
                elif not worker.is_alive():
                    for late in _drain(messages, tick, results):  # its last words
                        ended(late)
                    if name not in results:
                        raise RuntimeError(f"the study's worker for {name!r} died without a "
                                           f"result (exit code {worker.exitcode}); run the "
                                           "study again to continue it")
    finally:
        for worker in running.values():
            if worker.is_alive():
                worker.kill()
            worker.join()
    return results


def _next_message(messages: Any) -> tuple[Any, ...] | None:
    try:
        return messages.get(timeout=POLL_SECONDS)
    except queue_module.Empty:
        return None


def _drain(messages: Any, tick: Callable[[str], None], results: dict[str, Any]) -> list[str]:
    ended = []
    while (message := _next_message(messages)) is not None:
        ended += _handle(message, tick, results)
    return ended


def _handle(message: tuple[Any, ...] | None, tick: Callable[[str], None],
            results: dict[str, Any]) -> list[str]:
    """A worker's message: ``("tick", text)``, ``("done", name, result)`` or
    ``("error", name, exception)`` (raised here). Returns the task that ended, if any."""
    if message is None:
        return []
    kind, *rest = message
    if kind == "tick":
        tick(rest[0])
        return []
    if kind == "done":
        results[rest[0]] = rest[1]
        return [rest[0]]
    raise rest[1]


def _in_worker(task: Task, messages: Any, parent: int) -> None:
    """One task in a worker process; what it gives (or raises) goes back on ``messages``."""
    die_with_parent(parent)

    def tick(text: str) -> None:
        if os.getppid() != parent:  # the study is gone (where no death signal was armed)
            os._exit(1)
        messages.put(("tick", text))

    assert task.fn is not None
    try:
        args = (*task.args, tick) if task.ticks else task.args
        messages.put(("done", task.name, task.fn(*args)))
    except Exception as err:  # noqa: BLE001 - every failure goes back to the study
        try:  # the queue pickles in a thread of its own: find out here whether it can
            pickle.loads(pickle.dumps(err))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            err = RuntimeError(f"{task.name}: {type(err).__name__}: {err}")
        messages.put(("error", task.name, err))
