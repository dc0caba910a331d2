"""A ``gssgd study`` spec for the methods ``gssgd advise`` proposes: the second step of
the advise -> study -> advise loop (``gssgd advise --study-spec FILE``), which measures on
the user's own model, at the user's worker count, what no packaged study measured; ``gssgd
advise --evidence`` then reads the study's summaries back
(:func:`gssgd.costmodel.evidence.study_from_summaries`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gssgd.costmodel.advice import Advice
from gssgd.costmodel.candidates import SIMPLEST, Candidate
from gssgd.methods import REFERENCE_METHOD, get_method

__all__ = ["STUDY_DATASET", "STUDY_LR", "study_spec"]


#: The learning-rate range every method of a written study spec searches, by family
#: (the trainer's optimizer for it): the same range for every method.
STUDY_LR = {"image": ("sgd", 0.01, 0.5), "language": ("adamw", 0.0003, 0.01)}
#: The datasets a written spec trains a shipped model on, by family.
STUDY_DATASET = {"image": "mnist", "language": "shakespeare"}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def _study_knobs(advice: Advice, c: Candidate) -> dict[str, Any]:
    """A candidate's table in a study spec: its method and its fixed settings."""
    method = get_method(c.method)
    if c.local_steps:
        return {"method": c.method, "fixed": {"local_steps": c.local_steps}}
    if method.uncompressed:  # dense, or dense16: its payload in float16
        return ({} if c.spec.value_bytes == 4
                else {"method": c.method, "fixed": {"payload_dtype": "float16"}})
    if method.by_shape:
        return {"method": c.method, "fixed": {"powersgd_rank": c.spec.rank}}
    options = {k: str(v).removeprefix("torch.") if not isinstance(v, int | float | str)
               else v for k, v in c.options().items()}
    return {"method": c.method, "fixed": {"density": advice.density, **options}}


def study_spec(advice: Advice, model: str, dataset: str | None, *, methods: int = 4,
               budget: int = 3, seeds: int = 3) -> str:
    """A ``gssgd study`` spec (TOML) that measures ``advice``'s candidates on the user's
    model at its workers: dense (the reference), dense16, and the ``methods`` others with
    the shortest predicted step (one per study row; gs streamed by the hook is measured as
    gs; local steps only with at least 10 outer steps), each searching the same
    learning-rate range (:data:`STUDY_LR`) with ``budget`` trials, each best re-run at
    ``seeds`` seeds, over ``advice.run_steps`` steps."""
    optimizer, low, high = STUDY_LR[advice.family]
    steps = advice.run_steps
    by_name = {c.name: c for c in advice.candidates}
    chosen = [by_name[n] for n in SIMPLEST if n in by_name]
    seen = {c.evidence.row for c in chosen}
    for c in sorted(advice.candidates, key=lambda c: c.step.total):
        if len(chosen) >= 2 + methods:
            break
        # streamed gs converges as gs; local steps need >= 10 outer steps to be judged
        streamed = c.settings.get("overlap") == "stream"
        if streamed or c.evidence.row in seen or (c.local_steps or 0) * 10 > steps:
            continue
        chosen.append(c)
        seen.add(c.evidence.row)
    metric, margin = ("accuracy", 0.005) if advice.family == "image" else ("loss", 0.03)
    lines = [
        f"# A study of {model} at {advice.workers} workers, written by gssgd advise: dense,",
        "# dense16 and the methods its step model ranks fastest on your cluster, each with",
        "# the same learning-rate range and trial budget. Run it, then give its --out folder",
        "# to gssgd advise --evidence.",
        f"# Its cost: {len(chosen)} methods x ({budget} trials + {seeds - 1} more seeds) = "
        f"{len(chosen) * (budget + seeds - 1)} runs of {steps} steps; time one run first.",
        f'name = "{Path(model.replace(":", "-")).name}-p{advice.workers}"',
        f"dataset = {_toml(dataset or STUDY_DATASET[advice.family])}",
        f"model = {_toml(model)}",
        f"workers = {advice.workers}",
        "batch_size = 16",
        f"steps = {steps}",
        f"eval_every = {max(1, steps // 10)}",
        "simulate = true",
        f'optimizer = "{optimizer}"',
        f"budget = {budget}",
        f"seeds = {list(range(seeds))}",
        'sampler = "lhs"',
        "",
        "[target]",
        f'metric = "{metric}"',
        f"margin = {margin}",
        f'reference = "{REFERENCE_METHOD}"',
    ]
    for c in chosen:
        lines += ["", f"[methods.{c.name}]", f"lr = {{ low = {low}, high = {high}, log = true }}"]
        for key, value in _study_knobs(advice, c).items():
            lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines) + "\n"
