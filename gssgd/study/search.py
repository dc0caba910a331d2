"""The search: every method gets the same number of trials, drawn by Optuna.

1. The **reference** method (dense) is searched first, on its final test value; its best
   setting is re-run at every seed, and the mean of those runs' final values is the value
   the target is judged against (``dense - margin`` for accuracy, ``dense * (1 + margin)``
   for a loss).
2. Every other method is searched on its bytes to that target
   (:meth:`~gssgd.study.trials.Outcome.objective`: reaching it at all comes first), with
   the **same budget** of trials; then its best setting is re-run at every other seed.

The samplers are Optuna's, seeded from the spec so that a study is a pure function of its
spec: TPE (its first ``budget // 2`` trials random, as its startup), a grid (Optuna's
``GridSampler``, the settings in a seeded order), random, or a Latin hypercube
(:mod:`gssgd.study.design`: every knob spread over the budget; for budgets too small for
TPE to explore a list of choices). The search keeps no database:
on resume it asks the seeded sampler again, checks each answer against the trial's
``trial.json`` and tells it the stored outcome, so a killed study continues with exactly
the trials it would have run (tests/study/test_study.py kills one and compares).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gssgd.study.curves import Metric
from gssgd.study.design import latin_hypercube
from gssgd.study.spec import Knob, MethodSpace, StudySpec
from gssgd.study.trials import Outcome, read_outcome, run_trial, trial_config

__all__ = ["MethodResult", "rejudge", "search_method"]

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


def _grid(knob: Knob) -> list[Any]:
    if knob.choices is not None:
        return list(knob.choices)
    return list(range(int(knob.low), int(knob.high) + 1))


def _seed(spec: StudySpec, row: MethodSpace) -> int:
    """The method's search seed: stable across processes and resumes."""
    return zlib.crc32(f"{spec.name}/{row.label}".encode())


def _sampler(optuna: Any, spec: StudySpec, row: MethodSpace) -> Any:
    seed = _seed(spec, row)
    if spec.sampler == "grid":
        return optuna.samplers.GridSampler({k.name: _grid(k) for k in row.knobs}, seed=seed)
    if spec.sampler in ("random", "lhs"):  # lhs: every trial enqueued from its design
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
    optuna = _optuna()
    study = optuna.create_study(direction="minimize", sampler=_sampler(optuna, spec, row))
    space = {k.name: _distribution(optuna, k) for k in row.knobs}
    trials: list[tuple[dict[str, Any], Outcome]] = []
    dirs = [root / row.label / f"t{i:03d}" for i in range(spec.budget)]
    design = (latin_hypercube(row.knobs, spec.budget, _seed(spec, row))
              if spec.sampler == "lhs" else None)
    for i, out in enumerate(dirs):
        if design is not None:
            study.enqueue_trial(design[i])
        trial, params = _ask_new(study, space, trials, metric, reference)
        outcome = _train(spec, row, params, spec.seeds[0], out, metric, reference)
        study.tell(trial, outcome.objective(metric, reference))
        trials.append((params, outcome))
        tick(f"{row.label} trial {i + 1}/{spec.budget}")
    best = min(range(len(trials)), key=lambda i: (trials[i][1].objective(metric, reference), i))
    seeds, seed_dirs = {spec.seeds[0]: trials[best][1]}, {spec.seeds[0]: dirs[best]}
    for seed in spec.seeds[1:]:
        seed_dirs[seed] = root / row.label / f"best-s{seed}"
        seeds[seed] = _train(spec, row, trials[best][0], seed, seed_dirs[seed], metric,
                             reference)
        tick(f"{row.label} best, seed {seed}")
    return {"trials": trials, "best": best, "seeds": seeds,
            "dirs": {"trials": dirs, "seeds": seed_dirs}}


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


def _ask_new(study: Any, space: dict[str, Any], trials: list[tuple[dict[str, Any], Outcome]],
             metric: Metric, reference: float | None) -> tuple[Any, dict[str, Any]]:
    """A trial whose setting was not tried yet: a repeat (TPE and random draws repeat in a
    small space) is told its known outcome and asked again, so it costs no budget."""
    tried = [params for params, _ in trials]
    for _ in range(MAX_REPEATS):
        trial = study.ask(space)
        params = dict(trial.params)
        if params not in tried:
            return trial, params
        study.tell(trial, trials[tried.index(params)][1].objective(metric, reference))
    raise RuntimeError(f"the sampler proposed only settings already tried {MAX_REPEATS} times "
                       "in a row: widen the method's search space or lower the budget")


def _train(spec: StudySpec, row: MethodSpace, params: dict[str, Any], seed: int, out: Path,
           metric: Metric, reference: float | None) -> Outcome:
    meta = {"label": row.label, "method": row.method, "params": params, "seed": seed,
            "fixed": row.fixed, "run": spec.run}
    run_trial(trial_config(spec, row, params, seed, out), out, meta)
    return read_outcome(out, metric, reference)
