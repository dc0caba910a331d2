"""What ``gssgd advise`` tells a language model's user: the measured gaps to dense's loss.

``advise``'s convergence column comes from the MNIST CNN (:mod:`gssgd.costmodel.reach`); on
a language model the methods rank otherwise. :data:`LM_GAPS` holds the per-step methods'
final test loss above dense AdamW's, in %, on the character LSTM (AdamW, density 0.01,
1,500 steps, 8 windows of 64 characters a worker; docs/study.md, answers 4 and 5), by P.
It is a rounded copy of the committed summary ``docs/results/local-steps-lm/summary.json``
(``scripts/local_steps_report.py``); ``tests/costmodel/test_lm_reach.py`` rebuilds it with
:func:`lm_gaps_table` and fails when they differ.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LANGUAGE_MODELS", "LM_DENSITY", "LM_GAPS", "language_model_advice", "lm_gaps_table"]

#: The shipped language models (``gssgd.train.models.TEXT_MODELS``, named here so that
#: ``advise`` need not import torch).
LANGUAGE_MODELS = ("lm", "gpt")
#: The density the language-model gaps were measured at.
LM_DENSITY = 0.01
#: P -> {method: final test loss above dense's, %} (per-step runs; one seed, dense's mean).
LM_GAPS: dict[int, dict[str, float]] = {16: {"gs": 2.5, "topk": 1.8}}


def lm_gaps_table(summary: dict[str, Any]) -> dict[int, dict[str, float]]:
    """:data:`LM_GAPS` from the local-steps report's summary: each P's per-step compressed
    runs at :data:`LM_DENSITY` (``<method>-d0.01``), their gap to dense, to 0.1 %."""
    out: dict[int, dict[str, float]] = {}
    for key, part in summary.items():
        rows = part["rows"]
        dense = next(r for r in rows if r["method"] == "dense" and not r["h"])
        gaps = {
            r["method"]: round(100 * (r["mean"] / dense["mean"] - 1), 1)
            for r in rows
            if not r["h"] and r["method"] != "dense" and r["density"] == LM_DENSITY
        }
        if gaps:
            out[int(key.removeprefix("P"))] = dict(sorted(gaps.items()))
    return out


def language_model_advice(workers: int) -> str:
    """The line ``advise`` prints for ``--model lm``/``gpt``: the measured gaps at the
    nearest measured P, and the method they point to."""
    p = min(LM_GAPS, key=lambda q: abs(q - workers))
    gaps = LM_GAPS[p]
    best = min(gaps, key=gaps.__getitem__)
    measured = ", ".join(f"{m} +{g:g} %" for m, g in sorted(gaps.items(), key=lambda i: i[1]))
    return (
        f"  language model: the convergence column is the MNIST CNN's. On the character "
        f"LSTM at {p} workers (AdamW, density {LM_DENSITY:g}) the final loss above dense's "
        f"was {measured}: use --method {best} (docs/study.md, answers 4 and 5)"
    )
