"""The search: every method gets the same number of trials, drawn by Optuna.

1. The **reference** method (dense) is searched first, on its final test value; its best
   setting is re-run at every seed, and the mean of those runs' final values is the value
   the target is judged against (``dense - margin`` for accuracy, ``dense * (1 + margin)``
   for a loss).
2. Every other method is searched on its bytes to that target
   (:meth:`~gssgd.study.trials.Outcome.objective`: reaching it at all comes first), with
   the **same budget** of trials; then its best setting is re-run at every other seed.

The samplers are Optuna's, seeded from the spec so that a study is a pure function of its
spec: TPE (its first ``budget // 2`` trials random, as its startup), a grid (every
combination of the knobs' lists in a seeded order: :func:`~gssgd.study.design.grid_design`),
random, or a Latin hypercube
(:mod:`gssgd.study.design`: every knob spread over the budget; for budgets too small for
TPE to explore a list of choices). The search keeps no database:
on resume it asks the seeded sampler again, checks each answer against the trial's
``trial.json`` and tells it the stored outcome, so a killed study continues with exactly
the trials it would have run (tests/study/test_study.py kills one and compares).
"""

from __future__ import annotations

import statistics
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gssgd.study.curves import Metric
from gssgd.study.design import (
    grid_design,
    latin_hypercube,
    lr_extension,
    lr_grid_design,
    on_edge,
)
from gssgd.study.spec import Knob, MethodSpace, StudySpec
from gssgd.study.trials import Outcome, read_outcome, run_trial, trial_config

__all__ = ["PLANNED_SAMPLERS", "MethodResult", "best_trial", "planned_settings",
           "reference_value", "rejudge", "search_method", "seed_dir", "seed_text",
           "train_run", "trial_dir", "trial_dirs", "trial_meta", "trial_text"]

#: The samplers whose every setting is known before the first run (``--jobs`` runs them
#: run by run, not method by method: :mod:`gssgd.study.parallel`).
PLANNED_SAMPLERS = ("lhs", "grid", "random")

#: What a method's search gives: each trial's (setting, outcome) and its best's other seeds.
MethodResult = dict[str, Any]


def _optuna() -> Any:
    try:
        import optuna
    except ImportError as err:
        raise RuntimeError("gssgd study needs Optuna: pip install 'gssgd[study]' "
                           "(or pip install optuna)") from err
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _distribution(optuna: Any, knob: Knob) -> Any:
    dists = optuna.distributions
    if knob.choices is not None:
        return dists.CategoricalDistribution(list(knob.choices))
    if knob.integer:
        return dists.IntDistribution(int(knob.low), int(knob.high), log=knob.log)
    return dists.FloatDistribution(knob.low, knob.high, log=knob.log)


def _seed(spec: StudySpec, row: MethodSpace) -> int:
    """The method's search seed: stable across processes and resumes."""
    return zlib.crc32(f"{spec.name}/{row.label}".encode())


def _sampler(optuna: Any, spec: StudySpec, row: MethodSpace) -> Any:
    seed = _seed(spec, row)
    if spec.sampler in PLANNED_SAMPLERS:  # lhs, grid: each trial enqueued from its design
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(1, spec.budget // 2))


def search_method(spec: StudySpec, row: MethodSpace, root: Path, metric: Metric,
                  reference: float | None, tick: Callable[[str], None]) -> MethodResult:
    """Run (or resume) ``row``'s ``spec.budget`` trials, then its best at the other seeds.

    Args:
        spec, row: the study and the method.
        root: the study's directory.
        metric: what is judged.
        reference: the reference's value (None while searching the reference itself).
        tick: called after each run with a short description (the progress bar).

    Returns:
        ``{"trials": [(params, Outcome), ...], "best": index, "seeds": {seed: Outcome},
        "dirs": {"trials": [path, ...], "seeds": {seed: path}}}``.
    """
    if spec.lr_grid is not None:
        return _lr_grid_search(spec, row, root, metric, reference, tick)
    optuna = _optuna()
    study, space, design = _new_search(optuna, spec, row)
    trials: list[tuple[dict[str, Any], Outcome]] = []
    dirs = trial_dirs(root, row, spec.budget)
    for i, out in enumerate(dirs):
        if design is not None:
            study.enqueue_trial(design[i])
        trial, params = _ask_new(study, space, [p for p, _ in trials],
                                 lambda j: trials[j][1].objective(metric, reference))
        outcome = _train(spec, row, params, spec.seeds[0], out, metric, reference)
        study.tell(trial, outcome.objective(metric, reference))
        trials.append((params, outcome))
        tick(trial_text(row, i, spec.budget))
    return _with_seeds(spec, row, root, metric, reference, tick, trials, dirs)


def _with_seeds(spec: StudySpec, row: MethodSpace, root: Path, metric: Metric,
                reference: float | None, tick: Callable[[str], None],
                trials: list[tuple[dict[str, Any], Outcome]], dirs: list[Path],
                **more: Any) -> MethodResult:
    """The search's result: its best trial, re-run at every other seed."""
    best = best_trial([o for _, o in trials], metric, reference)
    seeds, seed_dirs = {spec.seeds[0]: trials[best][1]}, {spec.seeds[0]: dirs[best]}
    for seed in spec.seeds[1:]:
        seed_dirs[seed] = seed_dir(root, row, seed)
        seeds[seed] = _train(spec, row, trials[best][0], seed, seed_dirs[seed], metric,
                             reference)
        tick(seed_text(row, seed))
    return {"trials": trials, "best": best, "seeds": seeds,
            "dirs": {"trials": dirs, "seeds": seed_dirs}, **more}


def _lr_grid_search(spec: StudySpec, row: MethodSpace, root: Path, metric: Metric,
                    reference: float | None, tick: Callable[[str], None]) -> MethodResult:
    """The ``lr-grid`` search: every rate of the grid with every combination of the
    method's knobs, then, while the best sits on an edge of the rates tried for its
    setting, the next rate past it (:func:`~gssgd.study.design.lr_extension`); the result
    also lists those ``extensions`` and whether the best is still ``on_edge`` (at the
    cap). Trials run in a fixed order, so a resumed search asks for the same ones."""
    grid = spec.lr_grid
    assert grid is not None
    settings = lr_grid_design(grid, row.knobs)
    planned = len(settings)
    trials: list[tuple[dict[str, Any], Outcome]] = []
    while len(trials) < len(settings):
        i = len(trials)
        out = trial_dir(root, row, i)
        trials.append((settings[i], _train(spec, row, settings[i], spec.seeds[0], out, metric,
                                           reference)))
        tick(trial_text(row, i, planned))
        if len(trials) == len(settings):
            best = trials[best_trial([o for _, o in trials], metric, reference)][0]
            more = lr_extension(grid, settings, best)
            settings += [more] if more is not None else []
    best = trials[best_trial([o for _, o in trials], metric, reference)][0]
    dirs = [trial_dir(root, row, i) for i in range(len(trials))]
    return _with_seeds(spec, row, root, metric, reference, tick, trials, dirs,
                       extensions=settings[planned:], on_edge=on_edge(settings, best))


def planned_settings(spec: StudySpec, row: MethodSpace) -> list[dict[str, Any]] | None:
    """Every trial's setting of ``row``'s search, known before any of them runs, or None
    for TPE (whose later trials follow the earlier outcomes). A Latin hypercube, a grid
    and random draws ask the same settings whatever the outcomes, so the same seeded
    sampler asked here without them gives what :func:`search_method` will ask (a run
    planned from it and found done there is checked against its ``trial.json``)."""
    if spec.sampler not in PLANNED_SAMPLERS:
        return None
    study, space, design = _new_search(_optuna(), spec, row)
    settings: list[dict[str, Any]] = []
    for i in range(spec.budget):
        if design is not None:
            study.enqueue_trial(design[i])
        trial, params = _ask_new(study, space, settings, lambda _: 0.0)
        study.tell(trial, 0.0)
        settings.append(params)
    return settings


def best_trial(outcomes: list[Outcome], metric: Metric, reference: float | None) -> int:
    """The index of the best of a search's trials (the first of equals)."""
    return min(range(len(outcomes)),
               key=lambda i: (outcomes[i].objective(metric, reference), i))


def reference_value(label: str, seeds: list[Outcome]) -> float:
    """The value the target is judged against: the mean end value (the mean of the last
    ``metric.window`` evaluations) of the reference's best setting over the seeds.

    Raises:
        RuntimeError: a seed's run stopped early (the study has no target).
    """
    finals = [o.final if o.end is None else o.end for o in seeds]
    if None in finals:
        raise RuntimeError(f"the reference {label}'s best setting stopped early at a "
                           "seed, so the study has no target; narrow its search space")
    return statistics.mean(finals)  # type: ignore[arg-type]


def trial_dirs(root: Path, row: MethodSpace, budget: int) -> list[Path]:
    """The folders of ``row``'s trials (seed ``seeds[0]``)."""
    return [trial_dir(root, row, i) for i in range(budget)]


def trial_dir(root: Path, row: MethodSpace, i: int) -> Path:
    """The folder of ``row``'s trial ``i`` (from 0)."""
    return root / row.label / f"t{i:03d}"


def seed_dir(root: Path, row: MethodSpace, seed: int) -> Path:
    """The folder of ``row``'s best setting at another ``seed``."""
    return root / row.label / f"best-s{seed}"


def trial_text(row: MethodSpace, i: int, budget: int) -> str:
    """The progress bar's words for trial ``i`` (one description per run of the study)."""
    return f"{row.label} trial {i + 1}/{budget}"


def seed_text(row: MethodSpace, seed: int) -> str:
    """The progress bar's words for the best setting's run at ``seed``."""
    return f"{row.label} best, seed {seed}"


def _new_search(optuna: Any, spec: StudySpec, row: MethodSpace
                ) -> tuple[Any, dict[str, Any], list[dict[str, Any]] | None]:
    """The method's seeded Optuna study, its search space, and (``lhs``, ``grid``) its
    design."""
    study = optuna.create_study(direction="minimize", sampler=_sampler(optuna, spec, row))
    space = {k.name: _distribution(optuna, k) for k in row.knobs}
    designs = {"lhs": latin_hypercube, "grid": grid_design}
    design = (designs[spec.sampler](row.knobs, spec.budget, _seed(spec, row))
              if spec.sampler in designs else None)
    return study, space, design


def rejudge(found: MethodResult, metric: Metric, reference: float) -> MethodResult:
    """``found`` with every run's outcome read again against ``reference`` (the reference
    method's own search ran before its value was known)."""
    dirs = found["dirs"]
    trials = [(params, read_outcome(out, metric, reference))
              for (params, _), out in zip(found["trials"], dirs["trials"], strict=True)]
    seeds = {seed: read_outcome(out, metric, reference) for seed, out in dirs["seeds"].items()}
    return {**found, "trials": trials, "seeds": seeds}


#: How many times a sampler may propose a setting already tried before the search gives up.
MAX_REPEATS = 200


def _ask_new(study: Any, space: dict[str, Any], tried: list[dict[str, Any]],
             value_of: Callable[[int], float]) -> tuple[Any, dict[str, Any]]:
    """A trial whose setting was not tried yet: a repeat (TPE and random draws repeat in a
    small space) is told its known outcome (``value_of(index)``) and asked again, so it
    costs no budget."""
    for _ in range(MAX_REPEATS):
        trial = study.ask(space)
        params = dict(trial.params)
        if params not in tried:
            return trial, params
        study.tell(trial, value_of(tried.index(params)))
    raise RuntimeError(f"the sampler proposed only settings already tried {MAX_REPEATS} times "
                       "in a row: widen the method's search space or lower the budget")


def trial_meta(spec: StudySpec, row: MethodSpace, params: dict[str, Any],
               seed: int) -> dict[str, Any]:
    """What a run's ``trial.json`` records: the setting a finished run is checked against."""
    return {"label": row.label, "method": row.method, "params": params, "seed": seed,
            "fixed": row.fixed, "run": spec.run}


def train_run(spec: StudySpec, row: MethodSpace, params: dict[str, Any], seed: int,
              out: Path) -> None:
    """Train ``row`` at ``params`` and ``seed`` into ``out`` (nothing where it is done)."""
    run_trial(trial_config(spec, row, params, seed, out), out,
              trial_meta(spec, row, params, seed))


def _train(spec: StudySpec, row: MethodSpace, params: dict[str, Any], seed: int, out: Path,
           metric: Metric, reference: float | None) -> Outcome:
    train_run(spec, row, params, seed, out)
    return read_outcome(out, metric, reference)
