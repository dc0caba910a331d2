"""``gssgd study``: equal budgets on a plugin model, a killed study resumed to the same
summary, and the spec's mistakes refused before anything trains."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gssgd.cli.main import main
from gssgd.study import load_spec, parse_spec, run_study

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "user_model_study.toml"

SMALL = """\
name = "tiny"
dataset = "examples.user_model:blobs"
model = "examples.user_model:mlp"
workers = 3
batch_size = 16
steps = 30
eval_every = 10
budget = 3
seeds = [0, 1]

[target]
margin = 0.02

[methods.dense]
lr = [0.02, 0.05, 0.1]

[methods.gs]
lr = { low = 0.05, high = 0.4, log = true }
density = [0.05, 0.1]
fixed = { cols = 400 }

[methods.powersgd]
lr = [0.05, 0.1]
powersgd_rank = [1, 2]
"""


def _outputs(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("summary.json", "summary.md",
                                                         "curves.png")}


def _runs(out: Path) -> list[Path]:
    return sorted(p.parent for p in (out / "runs").glob("*/*/summary.json"))


def kill_study_after(spec_file: Path, out: Path, runs: int, *args: str,
                     timeout: float = 120) -> None:
    """Run ``gssgd study spec_file --out out *args`` in a process of its own and SIGKILL
    it once ``runs`` runs have finished (or it ended, or ``timeout`` seconds passed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["study", str(spec_file), "--out", str(out), "--no-progress", *args]
    proc = subprocess.Popen([sys.executable, "-c",
                             f"from gssgd.cli.main import main; main({argv!r})"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while len(_runs(out)) < runs and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_the_example_study_gives_every_method_the_same_budget(tmp_path: Path) -> None:
    """The committed example spec on the plugin model: each method ran exactly the budget
    of distinct settings plus its best at the other seed; the summary ranks them."""
    spec = load_spec(EXAMPLE)
    summary = run_study(spec, tmp_path, progress=False)
    for row in summary["methods"]:
        assert row["budget"] == spec.budget == len(row["trials"])
        settings = [json.dumps(t["setting"], sort_keys=True) for t in row["trials"]]
        assert len(set(settings)) == spec.budget
        assert row["seeds"] == list(spec.seeds)
        assert len(list((tmp_path / "runs" / row["label"]).glob("*/summary.json"))) == \
            spec.budget + len(spec.seeds) - 1
    assert summary["budget_per_method"] == spec.budget
    dense = [m for m in summary["methods"] if m["label"] == "dense"][0]
    assert summary["reference"]["final_mean"] == dense["end"]["mean"]  # the window's mean
    assert summary["reference"]["window"] == 3
    assert dense["gap"]["mean"] == pytest.approx(0.0, abs=1e-9)
    for ranking in summary["rankings"].values():
        assert ranking["verdict"] in ("wins", "only one reaches", "none reaches") or \
            ranking["verdict"].startswith("tie: ")
    for row in summary["methods"]:  # the run's bytes against the reference's
        assert row["reduction"] == pytest.approx(dense["run_bytes"] / row["run_bytes"])
    text = (tmp_path / "summary.md").read_text()
    assert "3 trials per method" in text and "Fewest bytes" in text
    assert "Largest bytes reduction within the target" in text


@pytest.mark.parametrize("sampler", ["tpe", "lhs"])
def test_a_killed_study_resumes_to_the_same_summary(tmp_path: Path, sampler: str) -> None:
    """Kill the command (SIGKILL) after a few runs, run it again: the summary, table and
    plot equal an uninterrupted study's, byte for byte, and no finished run trained twice."""
    spec_file = tmp_path / "tiny.toml"
    spec_file.write_text(SMALL.replace('seeds = [0, 1]', f'seeds = [0, 1]\nsampler = "{sampler}"'))
    whole = tmp_path / "whole"
    assert main(["study", str(spec_file), "--out", str(whole), "--no-progress"]) == 0

    cut = tmp_path / "cut"
    kill_study_after(spec_file, cut, runs=4)
    done = {p: (p / "summary.json").stat().st_mtime_ns for p in _runs(cut)}
    total = load_spec(spec_file).trials
    assert 4 <= len(done) < total and not (cut / "summary.json").exists()

    assert main(["study", str(spec_file), "--out", str(cut), "--no-progress"]) == 0
    assert _outputs(cut) == _outputs(whole)
    assert all((p / "summary.json").stat().st_mtime_ns == t for p, t in done.items())


def test_a_latin_hypercube_study_tries_every_choice_and_stratum(tmp_path: Path) -> None:
    """Three trials over a learning-rate range and three densities: the Latin hypercube
    tries each density once and each third of the range once (seeded TPE, with one random
    start, kept its first density in all three trials of the first language-model cells)."""
    spec = parse_spec(_small(budget=3, seeds=[0], sampler="lhs", methods={
        "dense": {"lr": [0.02, 0.05, 0.1]},
        "gs": {"lr": {"low": 0.05, "high": 0.4, "log": True}, "density": [0.05, 0.1, 0.2],
               "fixed": {"cols": 400}}}))
    summary = run_study(spec, tmp_path, progress=False)
    drawn = [t["setting"] for t in next(m for m in summary["methods"]
                                        if m["label"] == "gs")["trials"]]
    assert sorted(t["density"] for t in drawn) == [0.05, 0.1, 0.2]
    assert sorted(int(3 * math.log(t["lr"] / 0.05) / math.log(8)) for t in drawn) == [0, 1, 2]


def test_a_study_refuses_another_spec_in_its_directory(tmp_path: Path) -> None:
    spec = parse_spec(_small(budget=2, methods={"dense": {"lr": [0.05, 0.1]}}))
    run_study(spec, tmp_path, progress=False)
    other = parse_spec(_small(budget=2, methods={"dense": {"lr": [0.05, 0.2]}}))
    with pytest.raises(ValueError, match="holds a study of another spec"):
        run_study(other, tmp_path, progress=False)


def _small(**changes: Any) -> dict[str, Any]:
    import tomllib

    raw = tomllib.loads(SMALL)
    raw.update(changes)
    return raw


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"budget": 0}, "budget=0"),
        ({"seeds": []}, "seeds=[]"),
        ({"sampler": "bayes"}, "sampler='bayes'"),
        ({"target": {"metric": "f1"}}, "target.metric='f1'"),
        ({"target": {"reference": "nope"}}, "target.reference='nope'"),
        ({"colour": 3}, "unknown keys ['colour']"),
        ({"methods": {"dense": {}}}, "it has no knob to search"),
        ({"methods": {"dense": {"lr": [0.1, 0.1]}}}, "it must list distinct values"),
        ({"methods": {"dense": {"lr": {"low": 0.4, "high": 0.1}}}}, "numbers A < B"),
        ({"methods": {"dense": {"lr": [0.05, 0.1]}}}, "cannot fill the budget of 3"),
        ({"sampler": "grid", "methods": {"dense": {"lr": {"low": 0.1, "high": 0.4}}}},
         "a grid needs lists"),
    ],
)
def test_a_bad_spec_is_refused_with_the_value_and_the_fix(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=_escaped(message)):
        parse_spec(_small(**changes))


def test_a_knob_the_method_does_not_take_fails_before_training(tmp_path: Path) -> None:
    spec = parse_spec(_small(methods={"dense": {"lr": [0.02, 0.05, 0.1]},
                                      "gs": {"powersgd_rank": [1, 2, 3]}}))
    with pytest.raises(ValueError, match="methods.gs"):
        run_study(spec, tmp_path, progress=False)
    assert not (tmp_path / "runs").exists() or not _runs(tmp_path)


def test_the_command_reports_a_missing_spec(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["study", str(tmp_path / "none.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def _row(label: str, seeds: list[float | None], trials: list[float | None]) -> dict[str, Any]:
    """A summary row whose mean bytes are the seeds' mean (steps 1 a byte, for time too)."""
    reach = [{"steps": b, "bytes": b} for b in seeds]
    got = [b for b in seeds if b is not None]
    mean = sum(got) / len(got)
    return {"label": label, "to_target": {"steps": mean, "bytes": mean, "by_seed": reach},
            "trials": [{"steps": b, "bytes": b} for b in trials]}


@pytest.mark.parametrize(
    ("leader", "runner", "verdict"),
    [
        (([10, 12], [10, 11]), ([20, 22], [20, 30]), "wins"),
        (([10, 21], [10, 11]), ([20, 22], [20, 30]), "tie: seed bands overlap"),
        (([10, None], [10, 11]), ([20, 22], [20, 30]), "tie: seed bands overlap"),
        (([10, 12], [10, 25]), ([20, 22], [20, 30]),
         "tie: the leader's neighbouring setting does not beat the runner-up's best"),
        (([10, 12], [10, None]), ([20, 22], [20, 30]),
         "tie: the leader's neighbouring setting does not beat the runner-up's best"),
    ],
)
def test_a_lead_inside_the_seeds_or_one_setting_wide_is_a_tie(
    leader: tuple, runner: tuple, verdict: str
) -> None:
    from gssgd.study.summary import _bytes, _ranking

    ranking = _ranking([_row("b", *runner), _row("a", *leader)], _bytes)
    assert ranking["order"] == ["a", "b"] and ranking["verdict"] == verdict
    lead = leader[0]  # the ranking names the seed ranges it rests on
    assert ranking["seed_ranges"] == {"a": None if None in lead else [min(lead), max(lead)],
                                      "b": [min(runner[0]), max(runner[0])]}


def _ended(label: str, final: float | None, reduction: float | None, failed: int = 0
           ) -> dict[str, Any]:
    return {"label": label, "reduction": reduction,
            "end": {"mean": final, "failed": failed}}


def test_the_largest_reduction_counts_only_methods_whose_end_reaches_the_target() -> None:
    """Loss target dense + 3 % (dense 1.0 -> 1.03), on each method's end value (the mean of
    its last evaluations): the 300x method ends above it, the 200x
    one lost a seed, the reference does not count; the 40x one is the answer."""
    from gssgd.study.curves import LOSS
    from gssgd.study.summary import _largest_reduction

    rows = [_ended("dense", 1.0, 1.0), _ended("a", 1.02, 40.0), _ended("b", 1.031, 300.0),
            _ended("c", 1.01, 200.0, failed=1), _ended("d", 1.0, 10.0),
            _ended("e", None, None)]
    assert _largest_reduction(rows, "dense", LOSS, 1.0) == {
        "label": "a", "reduction": 40.0, "final": 1.02}
    assert _largest_reduction(rows[:1] + rows[2:3], "dense", LOSS, 1.0) is None


def test_a_setting_that_diverges_is_the_worst_trial_not_the_end_of_the_study(
    tmp_path: Path,
) -> None:
    spec = parse_spec(_small(budget=2, seeds=[0], methods={
        "dense": {"lr": [0.05, 0.1]},
        # float32 tables: gs's float16 tables saturate as the weights blow up while its
        # float32 exact round keeps the loss finite (about 1e25), so the run would complete
        "gs": {"lr": [0.1, 1e6], "density": [0.05],
               "fixed": {"cols": 400, "table_dtype": "float32"}}}))
    summary = run_study(spec, tmp_path, progress=False)
    gs = next(m for m in summary["methods"] if m["label"] == "gs")
    statuses = {t["setting"]["lr"]: t["status"] for t in gs["trials"]}
    assert statuses == {0.1: "completed", 1e6: "stopped: non-finite loss"}
    assert gs["best_setting"]["lr"] == 0.1 and gs["final"]["failed"] == 0


def test_a_spec_schedules_every_methods_learning_rate(tmp_path: Path) -> None:
    """``lr_schedule`` and ``lr_warmup_steps`` at the top of a spec reach every trial's
    config (the same recipe for every method), and a bad one is refused before training."""
    from gssgd.study.trials import trial_config

    spec = parse_spec(_small(lr_schedule="cosine", lr_warmup_steps=3))
    for row in spec.methods:
        cfg = trial_config(spec, row, {"lr": 0.05}, 0, tmp_path / row.label)
        assert (cfg.lr_schedule, cfg.lr_warmup_steps) == ("cosine", 3), row.label
    with pytest.raises(ValueError, match="lr-warmup-steps=30 is invalid"):
        run_study(parse_spec(_small(lr_warmup_steps=30)), tmp_path / "bad", progress=False)


def test_the_plot_draws_a_method_that_misses_the_target() -> None:
    """curves.png zoomed its value axis to the target, so a method ending 3 points short
    was not drawn at all; every method's final value now lies inside the axis."""
    from gssgd.study.report import value_axis

    low, high = value_axis(True, 98.0, [98.3, 91.0])
    assert low <= 91.0 - 1 and high >= 98.3 and high <= 100
    assert value_axis(True, 98.0, [98.2]) == (94.0, 99.5)  # all near the target: zoomed
    low, high = value_axis(False, 1.9, [1.85, 2.6])
    assert low < 1.85 and high > 2.6


# ------------------------------------------------------------------ the learning-rate grid
LR_GRID = """\
name = "grid"
dataset = "examples.user_model:blobs"
model = "examples.user_model:mlp"
workers = 3
batch_size = 16
steps = 20
eval_every = 10
seeds = [0, 1]
sampler = "lr-grid"
lr_grid = { low = 0.001, points = 5, factor = 2, extend = 2 }

[target]
margin = 0.02

[methods.dense]

[methods.topk]
density = [0.05, 0.1]
"""


def test_a_best_on_the_edge_of_the_lr_grid_extends_it_and_is_reported(tmp_path: Path) -> None:
    """Rates below the optimum: every best sits on the grid's top rate, the search adds
    the next rates past it (for the best's setting) up to the cap of 2, and the summary
    says so: the grid, the rates added, the methods still on an edge, the runs."""
    import tomllib

    from gssgd.study.report import markdown

    summary = run_study(parse_spec(tomllib.loads(LR_GRID)), tmp_path, progress=False)
    grid = [0.001, 0.002, 0.004, 0.008, 0.016]
    design = summary["design"]
    assert design["lr_grid"] == grid and design["extend"] == 2
    rows = {m["label"]: m for m in summary["methods"]}
    assert rows["dense"]["lr_extensions"] == [0.032, 0.064]
    assert rows["dense"]["budget"] == 5 + 2 and rows["topk"]["budget"] == 10 + 2
    assert rows["dense"]["best_setting"]["lr"] == 0.064
    assert set(design["on_edge"]) == {"dense", "topk"}  # the cap reached, still rising
    assert design["runs"] == (7 + 1) + (12 + 1)
    tried = [t["setting"] for t in rows["topk"]["trials"]]
    assert {t["density"] for t in tried[:10]} == {0.05, 0.1}  # crossed with every rate
    assert [t["lr"] for t in tried[:5]] == grid
    text = markdown(summary)
    assert "every method at the learning rates 0.001, 0.002, 0.004, 0.008, 0.016" in text
    assert "added: dense 0.032, 0.064; topk 0.032, 0.064" in text
    assert "bests still on an edge: dense, topk" in text


def test_a_best_inside_the_lr_grid_adds_nothing() -> None:
    """The extension rule on its own: a best between two tried rates is where it stays; a
    best on the edge gets the next rate past it until the cap."""
    from gssgd.study.design import lr_extension, on_edge
    from gssgd.study.spec import LrGrid

    grid = LrGrid(0.01, points=5, factor=2, extend=1)
    tried = [{"lr": lr, "rank": 2} for lr in grid.values]
    assert lr_extension(grid, tried, {"lr": 0.04, "rank": 2}) is None
    assert not on_edge(tried, {"lr": 0.04, "rank": 2})
    assert lr_extension(grid, tried, {"lr": 0.01, "rank": 2}) == {"lr": 0.005, "rank": 2}
    tried.append({"lr": 0.005, "rank": 2})
    assert lr_extension(grid, tried, {"lr": 0.005, "rank": 2}) is None  # the cap: 1
    assert on_edge(tried, {"lr": 0.005, "rank": 2})


@pytest.mark.parametrize(("changes", "message"), [
    ({"methods": {"dense": {"lr": [0.1, 0.2]}}}, "methods.dense.lr"),
    ({"methods": {"dense": {}, "topk": {"density": {"low": 0.01, "high": 0.1}}}},
     "crosses each knob's list"),
    ({"budget": 4}, "budget"),
    ({"lr_grid": {"low": 0.01, "points": 3}}, "lr_grid.points=3 is invalid"),
    ({"lr_grid": {"low": 0.01, "factor": 1}}, "lr_grid.factor=1 is invalid"),
    ({"sampler": "lhs", "budget": 2}, 'it goes with sampler = "lr-grid"'),
])
def test_a_bad_lr_grid_spec_is_refused_by_name(changes: dict, message: str) -> None:
    import tomllib

    raw = tomllib.loads(LR_GRID)
    raw.update(changes)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_spec(raw)


# ------------------------------------------------------------------ verdicts that stay
def test_a_first_touch_that_falls_back_is_no_reach() -> None:
    """The verdicts count where the seeds' mean curve reaches the target and stays (over a
    trailing window): a touch at step 20 that falls back does not count; the stay from
    step 40 on does; a curve whose last window misses does not reach at all."""
    from gssgd.study.curves import ACCURACY, Metric, reach_and_stay

    one = Metric("accuracy", True, 0.005, window=1)
    touch = [(9, 0.90, 100.0), (19, 0.98, 200.0), (29, 0.95, 300.0), (39, 0.99, 400.0),
             (49, 0.99, 500.0)]
    assert reach_and_stay([touch], one, 0.98) == (36, 362.5)  # 0.975 crossed at 5/8 of 30..40
    three = Metric("accuracy", True, 0.005, window=3)
    assert reach_and_stay([touch], three, 0.97)[0] is not None
    assert reach_and_stay([touch], three, 0.99) == (None, None)  # the last 3 mean 0.977
    assert reach_and_stay([touch[:3]], one, 0.98) == (None, None)  # ends below
    assert ACCURACY.window == 1  # the studies' own reports keep their first-touch rule


def test_a_margin_inside_dense_own_noise_is_flagged() -> None:
    """The GPT cell: dense's seeds spread over 5.6 % of its loss, the margin is 3 %; the
    summary says reaching or missing is inside dense's noise."""
    from gssgd.study.curves import LOSS
    from gssgd.study.report import _noise_line
    from gssgd.study.summary import _noise

    noisy = _noise({"gap": {"mean": 0.0, "low": -2.6, "high": 3.0}}, LOSS)
    assert noisy["margin_inside_noise"] and noisy["seed_spread"] == pytest.approx(5.6)
    quiet = _noise({"gap": {"mean": 0.0, "low": -0.5, "high": 0.5}}, LOSS)
    assert not quiet["margin_inside_noise"]
    line = _noise_line({"label": "dense", "margin": 0.03, **noisy}, "loss")
    assert "The margin (3 %) is smaller than dense's own seed spread (5.60 %)" in line
    assert _noise_line({"label": "dense", "margin": 0.03, **quiet}, "loss") == ""


def test_the_summary_lists_each_recipe_knob_and_flags_one_set_differently() -> None:
    """The same recipe for every method it applies to, or a stated difference: a warm-up
    fixed for one sparse method and searched for another is flagged."""
    from gssgd.study.report import _recipe_lines
    from gssgd.study.summary import _recipe

    spec = parse_spec(_small(methods={
        "dense": {"lr": [0.02, 0.05, 0.1]},
        "gs": {"lr": [0.05, 0.1, 0.2], "warmup_density": [0.02, 0.25],
               "fixed": {"density": 0.05}},
        "topk": {"lr": [0.05, 0.1, 0.2], "fixed": {"density": 0.05, "warmup_density": 0.02}},
    }))
    recipe = _recipe(spec)
    assert recipe["density"] == {"gs": 0.05, "topk": 0.05}
    assert recipe["warmup_density"] == {"gs": {"searched": [0.02, 0.25]}, "topk": 0.02}
    text = _recipe_lines(recipe)
    assert "- `density`: fixed at 0.05 for gs, topk\n" in text
    assert ("- `warmup_density`: searched over [0.02, 0.25] for gs; fixed at 0.02 for topk "
            "(**set differently across methods**)") in text
