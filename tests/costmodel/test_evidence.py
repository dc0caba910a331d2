"""The cost model's evidence: one study per model family, read from data files that the
studies' committed summaries remake byte for byte; lookups from the nearest measured P with
their distance, a verdict that holds at every P the study ran, no density it did not run;
and no measured figure pasted into a Python module."""

from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path

import pytest

from gssgd.costmodel import store
from gssgd.costmodel.evidence import (
    PENALTY_PER_DECADE,
    PENALTY_PER_DOUBLING,
    Study,
    evidence_for,
    row_key,
    studies,
    study_for,
    study_from_summaries,
)
from gssgd.costmodel.method_specs import method_spec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies" / "cost_model"))
import write_evidence  # noqa: E402


def test_the_evidence_files_are_what_the_committed_summaries_give() -> None:
    for name, content in write_evidence.files().items():
        assert store.load(name) == json.loads(json.dumps(content)), name


def test_one_study_per_family() -> None:
    assert {s.family for s in studies()} == {"image", "language"}
    assert study_for("image").name == "mnist-lr-grid"  # it supersedes the equal-budget cells
    # the LSTM's equal-budget cells supersede the local-steps record's final gaps; a
    # transformer reads the GPT's
    assert study_for("language", "lstm").name == "lstm-equal-budget"
    assert study_for("language", "transformer").name == "gpt-equal-budget"
    assert study_for("language", "lstm").metric == "steps"


def test_a_lookup_takes_the_nearest_p_and_says_how_far_it_is() -> None:
    image = study_for("image")
    powersgd = method_spec("powersgd", 80_602, shapes=((80_602,),))
    row = "powersgd-r2"  # the equal-budget study's best rank at P = 16
    assert row_key(powersgd, 0.001) == row
    at_24 = evidence_for(image, row, 24, "image", 80_602)  # 16 is nearer than any other P
    assert at_24.measured and at_24.workers == 16 and at_24.p_factor == 1.5
    assert at_24.d_factor == 1.0 and at_24.confidence == "close"
    tried = evidence_for(image, "powersgd-r4", 16, "image")  # one trial of the search
    assert tried.trial and tried.seeds == 1
    assert "one trial (one seed)" in tried.describe()
    assert not evidence_for(image, "powersgd-r16", 16, "image").measured
    # no cliff: far from every measured P the nearest still answers, with its distance
    far = evidence_for(image, row, 1024, "image", 25_600_000)
    assert far.measured and far.workers == 16 and far.p_factor == 64  # rank 2 ran at 16 only
    assert far.d_factor == pytest.approx(25_600_000 / 80_602)
    assert far.penalty == pytest.approx(6 * PENALTY_PER_DOUBLING
                                        + PENALTY_PER_DECADE * math.log10(far.d_factor))
    assert far.confidence == "far" and "64x the workers, 318x the size" in far.describe()
    other = evidence_for(image, row, 16, "language")
    assert not other.measured and other.why == "no study of a language model"
    unrun = evidence_for(image, row_key(method_spec("gtopk", 80_602, 0.0003), 0.0003), 16,
                         "image")
    assert not unrun.measured and unrun.why == "gtopk@0.0003 was not run in mnist-lr-grid"
    assert "quality not measured" in unrun.describe()


def test_the_verdict_holds_at_every_measured_p_and_the_ratio_is_interpolated() -> None:
    """Reached only where reached at every P the row ran at, so that neighbouring worker
    counts get the same verdict; its steps ratio linear in log P between the measured P's,
    the nearest's outside them; the penalty continuous across the midpoint."""
    row = lambda ratio: {"seeds": 3, "gap": 0.0, "steps_ratio": ratio}  # noqa: E731
    study = _study("image", {16: {"dense": row(1.0), "a": row(1.2), "b": row(1.1)},
                             64: {"dense": row(1.0), "a": row(1.6), "b": row(None)}})
    verdicts = {evidence_for(study, "b", p, "image").reached for p in range(2, 300)}
    assert verdicts == {False}  # missed at 64: never recommendable, at any P
    b = evidence_for(study, "b", 16, "image")
    assert b.missed_at == (64,) and "missed the target at P=64" in b.describe()
    a = {p: evidence_for(study, "a", p, "image") for p in (8, 16, 32, 64, 128)}
    assert [a[p].steps_ratio for p in (8, 16, 32, 64, 128)] == [1.2, 1.2, 1.4, 1.6, 1.6]
    below, above = evidence_for(study, "a", 31, "image"), evidence_for(study, "a", 33, "image")
    assert below.workers == 16 and above.workers == 64
    assert abs(below.penalty - above.penalty) < 0.01  # no jump where the nearest P changes
    assert evidence_for(study, "dense", 1000, "image").penalty == 0.0  # the reference


def _study(family: str, rows: dict[int, dict[str, dict]]) -> Study:
    return Study("made-up", "a made-up study", family, "steps", "dense's target", rows)


def test_an_unrun_setting_says_what_its_method_measured_at_the_nearest_p() -> None:
    """A faster step of an unrun setting is no promise when its method's measured settings
    fell short: the lookup says how many reached and the best (or the closest miss)."""
    row = lambda ratio, gap: {"seeds": 3, "gap": gap, "steps_ratio": ratio}  # noqa: E731
    lm = _study("language", {
        16: {"powersgd-r8": row(None, 8.3), "powersgd-r2": row(None, 12.0),
             "gs-c16-m8-h-pf8@0.003": row(1.4, 2.5), "gs-c4-m8-h-pf8@0.01": row(1.2, 1.9),
             "topk@0.01": row(None, 3.4)},
        64: {"powersgd-r4": row(0.9, 1.0)}})
    missed = evidence_for(lm, "powersgd-r1", 16, "language")
    assert not missed.measured and missed.kin == (
        "its measured powersgd settings at P=16: none of 2 reached the target "
        "(closest: powersgd-r8, +8.30 %)")
    assert missed.describe().endswith(missed.kin)
    # 24 is nearer 16 than 64; at 48, P = 64 is the nearest and its rank 4 reached
    assert "P=16" in evidence_for(lm, "powersgd-r1", 24, "language").kin
    assert evidence_for(lm, "powersgd-r1", 48, "language").kin == (
        "its measured powersgd settings at P=64: 1 of 1 reached the target "
        "(best: powersgd-r4, 0.90x dense's steps)")
    assert evidence_for(lm, "gs-c40-m32@0.001", 16, "language").kin == (
        "its measured gs settings at P=16: 2 of 2 reached the target "
        "(best: gs-c4-m8-h-pf8@0.01, 1.20x dense's steps)")
    # far away: the nearest measured P's; nothing of the method at all: nothing to say
    assert "P=64" in evidence_for(lm, "powersgd-r1", 256, "language").kin
    assert evidence_for(lm, "gtopk@0.01", 16, "language").kin == ""
    # an estimate without the exact round is a method of its own
    assert evidence_for(lm, "topk-estimate@0.001", 16, "language").kin == ""
    # a study of final gaps measured no steps: the best reached is the smallest gap
    gaps = Study("gaps", "final gaps", "language", "final_gap", "dense's loss + 3 %",
                 {16: {"diloco-h10": row(None, 2.5), "diloco-h30": row(None, 1.1),
                       "diloco-h100": row(None, 9.0)}}, target_gap=3.0)
    assert evidence_for(gaps, "diloco-h50", 16, "language").kin == (
        "its measured diloco settings at P=16: 2 of 3 reached the target (best: diloco-h30)")
    # an accuracy gap (image family) is better larger: the closest miss is the smallest loss
    image = _study("image", {16: {"topk@0.01": row(None, -1.5), "topk@0.003": row(None, -0.7)}})
    assert evidence_for(image, "topk@0.001", 16, "image").kin.endswith(
        "(closest: topk@0.003, -0.70 pt)")


def test_a_final_gap_study_reaches_within_its_target_and_measures_no_steps() -> None:
    lm = next(s for s in studies() if s.name == "lstm-local-steps")
    assert lm.metric == "final_gap"
    diloco = evidence_for(lm, "diloco-h30", 16, "language")
    assert diloco.reached is False and diloco.steps_ratio is None
    assert "missed the target at P=16" in diloco.describe()
    dense = evidence_for(lm, "dense", 16, "language")  # the reference: its own steps
    assert dense.reached is True and dense.steps_ratio == 1.0


def test_a_language_cell_that_misses_the_target_says_so_with_its_gap() -> None:
    """The LSTM at 16 workers (equal budgets): local Top-k reaches dense's loss + 3 % in
    more steps than dense, but not at 64 workers, so it is not recommendable at either;
    gs, at its searched shape, does not reach it."""
    lm = study_for("language", "lstm")
    assert lm.rows[16]["topk@0.01"]["steps_ratio"] > 1
    topk = evidence_for(lm, "topk@0.01", 16, "language")
    assert topk.measured and topk.reached is False and topk.missed_at == (64,)
    assert topk.steps_ratio is None
    gs = [row for row in lm.rows[16] if row.startswith("gs")]
    assert gs and evidence_for(lm, gs[0], 16, "language").steps_ratio is None


#: Modules allowed to hold many numbers: none today (a measured figure belongs in a data
#: file the study writes, loaded through gssgd.costmodel.store).
_NUMBER_LIMIT = 8


@pytest.mark.parametrize("path", sorted((ROOT / "gssgd").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_study_figure_is_pasted_into_a_python_module(path: Path) -> None:
    """No module-level constant holds a table of measured numbers (more than a few float
    literals): the reach tables, the language-model gaps, the H200 anchors, the CPU compute
    laws and the model's error now live in gssgd/costmodel/data/."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            floats = [n for n in ast.walk(node.value)
                      if isinstance(n, ast.Constant) and isinstance(n.value, float)]
            assert len(floats) <= _NUMBER_LIMIT, (
                f"{path.name}:{node.lineno} holds {len(floats)} numbers: move measured "
                "figures to a data file the study writes (gssgd/costmodel/data/)")


def _method(label: str, method: str, final: float, steps: int | None, setting: dict,
            fixed: dict | None = None, others: list[dict] | None = None) -> dict:
    """A summary's method row: its best, and (``others``) the other trials of its search."""
    best = {"setting": setting, "final": final, "steps": steps}
    return {"label": label, "method": method, "final": {"mean": final}, "seeds": [0, 1, 2],
            "best_setting": setting, "fixed": fixed or {}, "to_target": {"steps": steps},
            "trials": [best, *(others or [])]}


def test_an_equal_budget_summary_becomes_rows_advise_looks_up() -> None:
    """Each method's best: its row as advise names it, its gap to the reference and its
    steps over the reference's; compressed outer steps left out."""
    summary = {"run": {"workers": 16}, "d": 80_602,
               "reference": {"label": "dense", "margin": 0.005}, "metric": "accuracy",
               "methods": [
                   _method("dense", "dense", 0.98, 400, {"lr": 0.1}),
                   _method("dense16", "dense", 0.979, 420, {"lr": 0.1},
                           {"payload_dtype": "float16"}),
                   _method("gs", "gs", 0.976, 600, {"lr": 0.3, "density": 0.003}),
                   _method("powersgd", "powersgd", 0.97, None, {"powersgd_rank": 4}, others=[
                       {"setting": {"powersgd_rank": 1, "lr": 0.05}, "final": 0.95,
                        "steps": None},
                       {"setting": {"powersgd_rank": 1}, "final": 0.976, "steps": 700},
                       {"setting": {"powersgd_rank": 4, "lr": 0.3}, "final": 0.96,
                        "steps": None},
                       {"setting": {"powersgd_rank": 8}, "final": None, "steps": None}]),
                   _method("sl", "topk", 0.97, 500, {"density": 0.05}, {"local_steps": 30},
                           others=[{"setting": {"density": 0.01}, "final": 0.96,
                                    "steps": None}]),
               ]}
    study = study_from_summaries("MNIST CNN", [summary], "image",
                                 supersedes=("mnist-fair-frontier",))
    rows = study["rows"]["16"]
    assert set(rows) == {"dense", "dense16", "gs-c16-m8-h-pf8@0.003", "powersgd-r4",
                         "powersgd-r1"}
    # another setting the search tried: one seed, its own gap and steps (of two trials of
    # rank 1, the one that reached); the best's row is never replaced by a trial of the
    # same row, and a diverged trial is no row
    assert rows["powersgd-r1"] == {"seeds": 1, "gap": -0.4, "steps_ratio": 1.75,
                                   "trial": True}
    assert rows["gs-c16-m8-h-pf8@0.003"] == {"seeds": 3, "gap": -0.4, "steps_ratio": 1.5}
    assert rows["powersgd-r4"]["steps_ratio"] is None and rows["dense"]["steps_ratio"] == 1.0
    assert study["supersedes"] == ["mnist-fair-frontier"]
    assert study["target"] == "dense's mean accuracy - 0.5 point"


def test_a_language_cell_is_evidence_in_loss_percent_with_its_searched_shape() -> None:
    """A loss study: the gap is % above the reference's loss; gs's row names the shape its
    best setting ran (m = 32, no pre-filter, by chunk), not the default's."""
    summary = {"run": {"workers": 16}, "d": 247_636,
               "reference": {"label": "dense", "margin": 0.03}, "metric": "loss",
               "methods": [
                   _method("dense", "dense", 1.60, 400, {"lr": 0.01}),
                   _method("gs", "gs", 1.64, 500, {"lr": 0.01, "density": 0.01,
                                                   "candidates": 32, "prefilter": 0,
                                                   "chunk": 4096}),
                   _method("topk", "topk", 1.72, None, {"lr": 0.01, "density": 0.01}),
               ]}
    study = study_from_summaries("character LSTM", [summary], "language",
                                 supersedes=("lstm-local-steps",))
    rows = study["rows"]["16"]
    assert rows["gs-c16-m32-h@0.01-chunk4096"] == {"seeds": 3, "gap": 2.5, "steps_ratio": 1.25}
    assert rows["topk@0.01"] == {"seeds": 3, "gap": 7.5, "steps_ratio": None}
    assert study["family"] == "language" and study["target"] == "dense's mean loss + 3 %"


def test_a_superseded_study_is_not_the_one_advise_reads(monkeypatch) -> None:
    from gssgd.costmodel import evidence

    old = evidence.Study("a-old", "old", "image", "steps", "t", {16: {}})
    new = evidence.Study("b-new", "new", "image", "steps", "t", {16: {}}, supersedes=("a-old",))
    monkeypatch.setattr(evidence, "studies", lambda: [old, new])
    assert evidence.study_for("image") is new
    monkeypatch.setattr(evidence, "studies", lambda: [old])
    assert evidence.study_for("image") is old


def test_advise_reads_the_study_of_the_models_architecture_first(monkeypatch) -> None:
    from gssgd.costmodel import evidence

    gpt = evidence.Study("a-gpt", "gpt", "language", "steps", "t", {16: {}},
                         architecture="transformer")
    lstm = evidence.Study("b-lstm", "lstm", "language", "steps", "t", {16: {}},
                          architecture="lstm")
    monkeypatch.setattr(evidence, "studies", lambda: [gpt, lstm])
    assert evidence.study_for("language", "lstm") is lstm  # not the first by name
    assert evidence.study_for("language", "transformer") is gpt
    assert evidence.study_for("language") is gpt  # no architecture: the family's first
    monkeypatch.setattr(evidence, "studies", lambda: [lstm])
    assert evidence.study_for("language", "transformer") is lstm  # the family's, said so


def test_the_evidence_files_name_their_models_architecture() -> None:
    from gssgd.costmodel.architectures import architecture_of
    from gssgd.train.models import MODEL_ARCHITECTURES
    from gssgd.train.models import architecture_of as model_architecture

    for study in studies():
        assert study.architecture in set(MODEL_ARCHITECTURES.values()), study.name
    assert model_architecture("lm") == "lstm" and model_architecture("gpt-s") == "transformer"
    assert architecture_of("transformer") == "transformer"
    assert study_for("language", model_architecture("lm")).architecture == "lstm"


def test_a_summary_whose_bests_sit_at_an_edge_of_the_rates_tried_carries_a_caveat() -> None:
    """The caveats advise prints with the evidence: a search of three trials, and each
    method whose best learning rate is the lowest or highest its search tried."""
    trials = [{"setting": {"lr": lr}, "final": 0.9, "steps": 100} for lr in (0.01, 0.1)]
    summary = {"run": {"workers": 8}, "d": 1_000, "budget_per_method": 3,
               "reference": {"label": "dense", "margin": 0.005}, "metric": "accuracy",
               "methods": [{**_method("dense", "dense", 0.98, 100, {"lr": 0.01}),
                            "trials": trials},
                           {**_method("gs", "gs", 0.98, 100, {"lr": 0.05, "density": 0.1}),
                            "trials": [{"setting": {"lr": 0.01, "density": 0.1},
                                        "final": 0.9, "steps": None},
                                       {"setting": {"lr": 0.05, "density": 0.1},
                                        "final": 0.98, "steps": 100},
                                       {"setting": {"lr": 0.1, "density": 0.1},
                                        "final": 0.9, "steps": None}]}]}
    record = study_from_summaries("mine", [summary], "image", architecture="mine")
    assert record["caveats"] == [
        "P=8: 3 trials per method",
        "P=8: 1 of 2 methods' best learning rate is an edge of those tried, their optimum "
        "may lie beyond: dense (lowest)"]
    assert record["d"] == {"8": 1_000}
    study = Study.from_record("mine", record)
    assert study.d == {8: 1_000} and len(study.caveats) == 2
    with pytest.raises(ValueError, match="no study summaries"):
        study_from_summaries("none", [], "image")
