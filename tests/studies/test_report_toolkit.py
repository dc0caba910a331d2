"""The studies' report toolkit (studies/_lib/report.py) and the report scripts built on it.

Two kinds of check:

* **Byte for byte.** ``frontier_report.py`` remakes, from the tiny raw runs under
  ``data/frontier-runs/``, the table that the script made before it was rewritten on the
  toolkit (``data/frontier-summary.md``, see ``data/README.md``); and the scripts remake
  the tables committed under ``studies/<study>/results/`` from the summaries committed beside them.
* **Each piece on numbers worked out by hand**: grouping, seed bands, the targets, the
  busiest link's bytes, tables, the runs directory.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from studies._lib.report import (
    ACCURACY,
    LOSS,
    Band,
    busier_totals,
    draw_band,
    figure,
    first_reaching,
    group,
    markdown_table,
    reach_on_mean_curve,
    read_runs,
    save_png,
    seed_band,
    steady_bytes,
    worker_dirs,
    write_summary,
)
from studies.frontier import report as frontier_report
from studies.guard import report as guard_report
from studies.optimizers import report as optimizer_report

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
STUDIES = ROOT / "studies"

# ----------------------------------------------------------------------------- byte for byte


def test_frontier_report_remakes_its_table_from_raw_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        sys, "argv", ["frontier_report.py", str(DATA / "frontier-runs"), str(tmp_path)]
    )
    frontier_report.main()
    for name in ("summary.md", "summary.json"):
        assert (tmp_path / name).read_bytes() == (DATA / f"frontier-{name}").read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "frontier_P16.png", "frontier_P4.png", "summary.json", "summary.md"
    ]  # fmt: skip
    by_p = json.loads((tmp_path / "summary.json").read_text())["by_P"]
    assert by_p["16"]["gs"]["seeds"] == 2 and by_p["4"]["dense"]["seeds"] == 1


def _committed(study: str) -> dict[str, Any]:
    return json.loads((STUDIES / study / "summary.json").read_text())


@pytest.mark.parametrize(
    ("study", "remake"),
    [
        ("frontier/results/cnn", lambda s: frontier_report.markdown(s["by_P"], ACCURACY)),
        ("frontier/results/lm", lambda s: frontier_report.markdown(s["by_P"], LOSS)),
        ("guard/results", lambda s: guard_report.markdown(s["runs"])),
        ("optimizers/results/main", optimizer_report._markdown),
    ],
)
def test_committed_tables_are_remade_from_their_summaries(study: str, remake: Any) -> None:
    """The committed summary.md starts with the tables the script makes from summary.json
    (the frontier's goes on with its targets, checked next)."""
    committed = (STUDIES / study / "summary.md").read_text()
    made = remake(_committed(study))
    assert made and committed.startswith(made)


@pytest.mark.parametrize(("study", "metric"), [("frontier/results/cnn", ACCURACY), ("frontier/results/lm", LOSS)])
def test_frontier_targets_are_remade_from_the_committed_summary(study: str, metric: Any) -> None:
    summary = _committed(study)
    goals = {b: frontier_report.targets(summary["by_P"], basis=b, m=metric)
             for b in ("bytes_steady", "bytes_message")}  # fmt: skip
    assert json.loads(json.dumps(goals)) == summary["targets"]


# ----------------------------------------------------------------------------- pieces


def test_group_keeps_keys_and_items_in_first_seen_order() -> None:
    runs = ["s0/gs", "s0/topk", "s1/gs", "s1/dense", "s1/topk"]
    assert group(runs, lambda r: r.split("/")[1]) == {
        "gs": ["s0/gs", "s1/gs"], "topk": ["s0/topk", "s1/topk"], "dense": ["s1/dense"]
    }  # fmt: skip


def test_seed_band_is_the_exact_mean_and_the_min_max() -> None:
    seeds = [0.9844, 0.9758, 0.9421]  # their float sums round three ways
    band = seed_band(seeds)
    assert band.mean == 0.9674333333333334  # correctly rounded (fmean: ...35, sum / 3: ...33)
    assert (band.low, band.high) == (0.9421, 0.9844)
    assert band.spread == pytest.approx(0.0423)
    assert seed_band([2.5]) == Band(2.5, 2.5, 2.5)
    with pytest.raises(statistics.StatisticsError):
        seed_band([])


def test_targets_half_a_point_below_dense_or_3_percent_above_its_loss() -> None:
    assert ACCURACY.target(0.98) == pytest.approx(0.975)
    assert ACCURACY.reaches(0.976, 0.98) and not ACCURACY.reaches(0.974, 0.98)
    assert LOSS.target(2.0) == pytest.approx(2.06)
    assert LOSS.reaches(2.05, 2.0) and not LOSS.reaches(2.07, 2.0)
    assert ACCURACY.best([0.9, 0.95]) == 0.95 and LOSS.best([2.1, 2.0]) == 2.0


def test_first_reaching_is_the_first_evaluation_at_the_target() -> None:
    evals = [(99, 0.90, 1e6), (199, 0.976, 2e6), (299, 0.99, 3e6)]
    assert first_reaching(evals, ACCURACY, 0.98) == (199, 0.976, 2e6)
    assert first_reaching(evals, ACCURACY, 0.999) is None
    losses = [(99, 2.5, 1e6), (199, 2.1, 2e6), (299, 2.0, 3e6)]
    assert first_reaching(losses, LOSS, 2.0) == (299, 2.0, 3e6)  # 2.1 is 5 % above


def test_reach_on_the_mean_curve_interpolates_between_evaluations() -> None:
    seeds = [
        [(9, 0.88, 100.0), (19, 0.97, 300.0), (29, 0.99, 600.0)],  # step 29: this seed only
        [(9, 0.92, 200.0), (19, 0.99, 500.0)],
    ]
    # mean curve: (10 steps, 0.90, 150 B), (20 steps, 0.98, 400 B); dense 0.945 -> goal 0.94,
    # half way between the two points
    steps, sent = reach_on_mean_curve(seeds, ACCURACY, 0.945)
    assert steps == 15 and sent == pytest.approx(275.0)
    assert reach_on_mean_curve(seeds, ACCURACY, 0.90) == (10, 150.0)  # the first point
    assert reach_on_mean_curve(seeds, ACCURACY, 0.99) == (None, None)  # 0.98 < 0.985


def test_reach_on_the_mean_curve_of_a_loss_goes_down_to_it() -> None:
    seeds = [[(0, 3.0, 10.0), (10, 1.12, 110.0)]]
    # dense 2.0 -> goal 2.06, half way down from 3.0 to 1.12: step 6 of 1 ... 11
    steps, sent = reach_on_mean_curve(seeds, LOSS, 2.0)
    assert steps == 6 and sent == pytest.approx(60.0)
    assert reach_on_mean_curve(seeds, LOSS, 3.0) == (1, 10.0)
    assert reach_on_mean_curve(seeds, LOSS, 1.0) == (None, None)  # 1.12 > 1.03


def test_busier_totals_count_the_busier_direction_cumulatively() -> None:
    records = [
        {"bytes_sent_max": 10, "bytes_received_max": 30},  # a worker receiving P-1 messages
        {"bytes_sent_max": 50, "bytes_received_max": 20},  # a server sending
        {"step": 2},  # nothing sent
    ]
    assert busier_totals(records) == [30.0, 80.0, 80.0]


def test_steady_bytes_leave_out_unmeasured_and_warm_up_steps() -> None:
    records = [
        {"step": 0, "k": 8, "bytes_sent_max": 800},  # before measured_from_step
        {"step": 1, "k": 4, "bytes_sent_max": 400},  # density warm-up: k not final yet
        {"step": 2, "k": 2, "bytes_sent_max": 200, "bytes_received_max": 250},
        {"step": 3, "k": 2, "bytes_sent_max": 220},
    ]
    assert steady_bytes({"measured_from_step": 1}, records) == [250.0, 220.0]


def test_markdown_table_from_cells_or_from_text() -> None:
    want = "| method | bytes |\n|---|---|\n| gs | 1,024 |\n| dense |  |"
    assert markdown_table(["method", "bytes"], [["gs", "1,024"], ["dense", ""]]) == want
    assert markdown_table("method | bytes", ["gs | 1,024", "dense | "]) == want


def test_read_runs_skips_unfinished_runs_and_worker_dirs_sort_by_p(tmp_path: Path) -> None:
    for p in ("P16", "P4", "P256"):
        (tmp_path / p / "s0" / "gs").mkdir(parents=True)
    (tmp_path / "P4" / "s0" / "gs" / "summary.json").write_text('{"status": "completed"}')
    (tmp_path / "P4" / "s0" / "gs" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1\n')
    (tmp_path / "Pnotes").mkdir()
    assert [p for p, _ in worker_dirs(tmp_path)] == [4, 16, 256]
    runs = [r for _, d in worker_dirs(tmp_path) for r in read_runs(d, "s*/*")]
    assert [(r.name, r.summary["status"], r.records) for r in runs] == [
        ("gs", "completed", [{"step": 0}])  # the torn last line of a crash is skipped
    ]


def test_the_same_figure_makes_the_same_png_and_summary(tmp_path: Path) -> None:
    pngs = []
    for i in range(2):
        fig, ax = figure(figsize=(3, 2))
        ax.plot([1, 2, 3], [3, 1, 2], "o-")
        pngs.append(save_png(fig, tmp_path / f"{i}.png").read_bytes())
    assert pngs[0] == pngs[1] and pngs[0].startswith(b"\x89PNG")
    written = write_summary(tmp_path / "out", {"a": [1, 2]}, "| a |\n", indent=2, name="x")
    assert [p.name for p in written] == ["x.json", "x.md"]
    assert written[0].read_text() == '{\n  "a": [\n    1,\n    2\n  ]\n}\n'


def test_draw_band_draws_the_seeds_mean_and_shades_their_band() -> None:
    fig, ax = figure()
    bands = [Band(0.5, 0.4, 0.6), Band(0.7, 0.7, 0.8)]
    line = draw_band(ax, [1.0, 2.0], bands, scale=100, label="gs")
    assert list(line.get_ydata()) == [50.0, 70.0] and line.get_label() == "gs"
    (shade,) = ax.collections
    ys = shade.get_paths()[0].vertices[:, 1]
    assert (min(ys), max(ys)) == (pytest.approx(40.0), pytest.approx(80.0))
