"""The language-model line of ``gssgd advise``: its figures are the committed summary's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gssgd.cli.main import main
from gssgd.costmodel.lm_reach import (
    LANGUAGE_MODELS,
    LM_GAPS,
    language_model_advice,
    lm_gaps_table,
)
from gssgd.train.models import TEXT_MODELS

SUMMARY = Path(__file__).resolve().parents[2] / "docs/results/local-steps-lm/summary.json"


def test_the_gaps_are_the_committed_local_steps_summary() -> None:
    assert lm_gaps_table(json.loads(SUMMARY.read_text())) == LM_GAPS


def test_the_language_models_are_the_trainers() -> None:
    assert LANGUAGE_MODELS == TEXT_MODELS


def test_the_advice_names_the_method_with_the_smallest_gap_at_the_nearest_p() -> None:
    line = language_model_advice(64)
    assert "at 16 workers" in line and "topk +1.8 %, gs +2.5 %" in line
    assert line.endswith("use --method topk (docs/study.md, answers 4 and 5)")


@pytest.mark.parametrize(("model", "shown"), [("lm", True), ("gpt", True), ("cnn", False)])
def test_advise_prints_it_for_language_models_only(capsys, model: str, shown: bool) -> None:
    assert main(["advise", "--model", model, "--workers", "16", "--link", "1gbit"]) == 0
    assert ("language model: the convergence column" in capsys.readouterr().out) == shown
    assert main(["advise", "--model", model, "--workers", "16", "--link", "1gbit",
                 "--json"]) == 0  # fmt: skip
    assert ("language_model" in json.loads(capsys.readouterr().out)) == shown
