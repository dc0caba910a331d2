"""``gssgd study --jobs N``: methods searched in processes of their own write the summary
one process writes; a killed parallel study leaves no orphan and resumes to the same
summary; a second study into a running directory and a bad ``--jobs`` are refused."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

import pytest

from gssgd.cli.main import main
from gssgd.study import parse_spec, run_study
from gssgd.study.curves import LOSS
from gssgd.study.parallel import search_methods
from tests.study.test_study import SMALL, _outputs, _runs, _small, kill_study_after


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small study in one process (the reference for every test here)."""
    spec_file = tmp_path_factory.mktemp("spec") / "tiny.toml"
    spec_file.write_text(SMALL)
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


def test_a_killed_parallel_study_leaves_no_orphan_and_resumes(whole: Path,
                                                              tmp_path: Path) -> None:
    """SIGKILL the command while two methods train in their workers: no run is written
    after the kill (the workers died with it), and running it again gives the same
    summary without training a finished run twice."""
    spec_file, cut = whole.parent / "tiny.toml", tmp_path / "cut"
    dense_runs = 3 + 1  # the reference's budget and its other seed come first, alone
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
    spec = parse_spec(_small())
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


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_a_bad_jobs_count_is_refused_with_the_fix(jobs: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    spec_file = tmp_path / "tiny.toml"
    spec_file.write_text(SMALL)
    assert main(["study", str(spec_file), "--out", str(tmp_path / "x"), "--jobs", jobs]) == 2
    err = capsys.readouterr().err
    assert f"jobs={jobs}" in err and "1 or more" in err
    assert not (tmp_path / "x" / "runs").exists()
