"""Fair studies of methods on any model: ``gssgd study SPEC.toml``.

A spec (:mod:`gssgd.study.spec`) names the data and model (built-in or ``MODULE:FUNCTION``),
the workers, steps and evaluation cadence, the target (the reference method's final value
less a margin) and each method's search space. Every method gets the **same trial budget**
(:mod:`gssgd.study.search`, Optuna); each best setting is re-run at every seed; the summary
(:mod:`gssgd.study.summary`, :mod:`gssgd.study.report`) says which method reaches the target
with the fewest bytes through the busiest link and in the least modeled time at 1 and
10 Gbit/s (:mod:`gssgd.study.modeled_time`), and whether that lead survives the seeds and
the leader's neighbouring setting ("tie" when not). Trials live in one directory each
(:mod:`gssgd.study.trials`), so a killed study resumes (:mod:`gssgd.study.runner`).

From Python::

    from gssgd.study import load_spec, run_study
    summary = run_study(load_spec("examples/user_model_study.toml"), Path("runs/mine"))
"""

from gssgd.study.runner import run_study
from gssgd.study.spec import StudySpec, load_spec, parse_spec

__all__ = ["StudySpec", "load_spec", "parse_spec", "run_study"]
