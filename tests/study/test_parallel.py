"""``gssgd study --jobs N``: runs (a Latin hypercube: every setting known ahead) or whole
searches (TPE) in processes of their own write the summary one process writes; a killed
parallel study leaves no orphan and resumes to the same summary; runs start as soon as
what they need is known; a second study into a running directory and a bad ``--jobs``
are refused."""

from __future__ import annotations

import fcntl
import json
import time
from pathlib import Path

import pytest

from gssgd.cli.main import main
from gssgd.study import load_spec, parse_spec, run_study
from gssgd.study.curves import LOSS
from gssgd.study.parallel import _Plan, run_planned, search_methods
from gssgd.study.runner import metric_of
from tests.study.test_study import SMALL, _outputs, _runs, _small, kill_study_after


def _spec_text(sampler: str) -> str:
    return SMALL.replace("seeds = [0, 1]", f'seeds = [0, 1]\nsampler = "{sampler}"')


@pytest.fixture(scope="module", params=["tpe", "lhs"])
def whole(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small study in one process (the reference for the tests here), searched by TPE
    (whole searches in the workers) and by a Latin hypercube (single runs)."""
    spec_file = tmp_path_factory.mktemp("spec") / "tiny.toml"
    spec_file.write_text(_spec_text(request.param))
    out = spec_file.parent / "whole"
    assert main(["study", str(spec_file), "--out", str(out), "--no-progress"]) == 0
    return out


def test_two_jobs_write_the_summary_one_process_writes(whole: Path, tmp_path: Path) -> None:
    spec_file = whole.parent / "tiny.toml"
    out = tmp_path / "two"
    assert main(["study", str(spec_file), "--out", str(out), "--no-progress",
                 "--jobs", "2"]) == 0
    assert _outputs(out) == _outputs(whole)
    assert [p.relative_to(out) for p in _runs(out)] == \
        [p.relative_to(whole) for p in _runs(whole)]


def test_a_grid_search_run_by_run_writes_the_summary_one_process_writes(
        tmp_path: Path) -> None:
    """A grid's design (its combinations in a seeded order) does not depend on the
    outcomes: the runs planned ahead are the ones the search asks for."""
    spec_file = tmp_path / "grid.toml"
    spec_file.write_text(_spec_text("grid").replace(
        "lr = { low = 0.05, high = 0.4, log = true }", "lr = [0.05, 0.2]"))
    for jobs, out in (("1", "one"), ("2", "two")):
        assert main(["study", str(spec_file), "--out", str(tmp_path / out),
                     "--no-progress", "--jobs", jobs]) == 0
    assert _outputs(tmp_path / "two") == _outputs(tmp_path / "one")


def test_a_killed_parallel_study_leaves_no_orphan_and_resumes(whole: Path,
                                                              tmp_path: Path) -> None:
    """SIGKILL the command while two methods train in their workers: no run is written
    after the kill (the workers died with it), and running it again gives the same
    summary without training a finished run twice."""
    spec_file, cut = whole.parent / "tiny.toml", tmp_path / "cut"
    dense_runs = 3 + 1  # the reference's budget and its other seed
    kill_study_after(spec_file, cut, dense_runs + 2, "--jobs", "2", timeout=180)
    done = {p: (p / "summary.json").stat().st_mtime_ns for p in _runs(cut)}
    time.sleep(3.0)  # a run of this study takes about a second: an orphan would write one
    assert {p: (p / "summary.json").stat().st_mtime_ns for p in _runs(cut)} == done
    assert dense_runs + 2 <= len(done) and not (cut / "summary.json").exists()

    assert main(["study", str(spec_file), "--out", str(cut), "--no-progress",
                 "--jobs", "2"]) == 0
    assert _outputs(cut) == _outputs(whole)
    assert all((p / "summary.json").stat().st_mtime_ns == t for p, t in done.items())


def test_a_second_study_into_a_running_directory_is_refused(whole: Path) -> None:
    spec = load_spec(whole.parent / "tiny.toml")
    with open(whole / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running study holds it
        with pytest.raises(ValueError, match="another gssgd study is running in"):
            run_study(spec, whole, progress=False)
    run_study(spec, whole, progress=False)  # released: the finished study re-summarised


def test_a_failing_method_stops_the_study_with_its_own_error(tmp_path: Path) -> None:
    """Each worker's search fails (its run folder cannot be made): the first error comes
    back as itself, and no worker outlives the call."""
    spec = parse_spec(_small())
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    rows = [row for row in spec.methods if row.label != "dense"]
    with pytest.raises(OSError):
        search_methods(spec, rows, blocked, LOSS, 1.0, lambda text: None, jobs=2)
    import multiprocessing

    assert multiprocessing.active_children() == []


def test_a_failing_run_stops_the_study_with_its_own_error(tmp_path: Path) -> None:
    """Every planned run fails (its folder cannot be made): the first error comes back as
    itself, and no worker outlives the call."""
    spec = parse_spec(_small(sampler="lhs"))
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    with pytest.raises(OSError):
        run_planned(spec, blocked, LOSS, lambda text: None, jobs=2)
    import multiprocessing

    assert multiprocessing.active_children() == []


def test_a_run_starts_once_what_it_needs_is_known(tmp_path: Path) -> None:
    """The plan of a Latin hypercube study: every method's trials at once, the
    reference's first; the reference's best at its other seed when its trials are done;
    another method's best at its other seed when its trials are done and the target is
    known (whichever comes last)."""
    spec = parse_spec(_small(sampler="lhs"))
    run_study(spec, tmp_path, progress=False)  # the runs the plan reads
    plan = _Plan(spec, tmp_path / "runs", metric_of(spec))
    first = [task.name for task in plan.first()]
    assert first == [f"{label} trial {i}/3" for label in ("dense", "gs", "powersgd")
                     for i in (1, 2, 3)]
    assert all(task.fn is None for task in plan.first())  # all done: nothing to train
    for name in ("gs trial 1/3", "gs trial 2/3", "dense trial 1/3", "gs trial 3/3",
                 "dense trial 2/3", "powersgd trial 1/3"):
        assert plan.then(name) == []  # gs waits for the target
    assert [t.name for t in plan.then("dense trial 3/3")] == ["dense best, seed 1"]
    assert [t.name for t in plan.then("dense best, seed 1")] == ["gs best, seed 1"]
    assert plan.then("powersgd trial 2/3") == []
    assert [t.name for t in plan.then("powersgd trial 3/3")] == ["powersgd best, seed 1"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    best = {m["label"]: m["best_setting"] for m in summary["methods"]}
    seed_runs = sorted((tmp_path / "runs").glob("*/best-s1/trial.json"))
    assert {p.parts[-3]: json.loads(p.read_text())["params"] for p in seed_runs} == best
    # a finished run of another setting (the sampler that planned it changed) is refused
    # before anything trains, as the one-process search refuses it
    written = tmp_path / "runs" / "gs" / "t001" / "trial.json"
    meta = json.loads(written.read_text())
    written.write_text(json.dumps({**meta, "params": {**meta["params"], "lr": 0.123}}))
    with pytest.raises(ValueError, match="was trained with .* the spec changed"):
        _Plan(spec, tmp_path / "runs", metric_of(spec)).first()


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_a_bad_jobs_count_is_refused_with_the_fix(jobs: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    spec_file = tmp_path / "tiny.toml"
    spec_file.write_text(SMALL)
    assert main(["study", str(spec_file), "--out", str(tmp_path / "x"), "--jobs", jobs]) == 2
    err = capsys.readouterr().err
    assert f"jobs={jobs}" in err and "1 or more" in err
    assert not (tmp_path / "x" / "runs").exists()
