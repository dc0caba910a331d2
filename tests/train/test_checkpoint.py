"""Tests for gssgd.train.checkpoint: atomic saves, the latest pointer, clear load errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from gssgd.train import checkpoint
from gssgd.train.checkpoint import (
    CHECKPOINT_DIR,
    LATEST,
    CheckpointError,
    check_fingerprint,
    fingerprint,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)


def _payload(value: float) -> dict:
    return {
        "fingerprint": fingerprint("gs", "cnn", "digits", 2, 3),
        "model": {"w": torch.full((3,), value)},
        "optimizer": {"state": {}, "param_groups": []},
        "ranks": [{"rng": torch.get_rng_state()}, {"rng": torch.get_rng_state()}],
    }


def _ckpt_dir(run: Path) -> Path:
    return run / CHECKPOINT_DIR


def test_save_then_load_roundtrips_with_weights_only(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 10, _payload(1.0))
    assert path == _ckpt_dir(tmp_path) / "step-00000010.pt"
    assert (_ckpt_dir(tmp_path) / LATEST).read_text().strip() == path.name
    loaded = load_checkpoint(resolve_checkpoint(tmp_path))
    assert loaded["step"] == 10 and loaded["format"] == checkpoint.FORMAT
    assert torch.equal(loaded["model"]["w"], torch.ones(3))
    assert torch.load(path, weights_only=True)["step"] == 10  # plain types only


def test_only_the_newest_two_checkpoints_are_kept(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        save_checkpoint(tmp_path, step, _payload(step))
    names = [p.name for p in list_checkpoints(_ckpt_dir(tmp_path))]
    assert names == ["step-00000015.pt", "step-00000020.pt"]
    assert resolve_checkpoint(tmp_path).name == "step-00000020.pt"


def test_crash_between_temp_write_and_replace_keeps_latest_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_checkpoint(tmp_path, 10, _payload(1.0))
    real_replace = os.replace

    def crash(src, dst):  # the process "dies" after writing the temp file, before the rename
        raise KeyboardInterrupt("killed during save")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 20, _payload(2.0))
    monkeypatch.setattr(os, "replace", real_replace)
    # A torn temp file from an even harder kill (no cleanup at all) must not matter either.
    (_ckpt_dir(tmp_path) / ".step-00000030.pt.tmp-999").write_bytes(b"PK\x03\x04 torn")

    latest = resolve_checkpoint(tmp_path)
    assert latest.name == "step-00000010.pt"
    assert torch.equal(load_checkpoint(latest)["model"]["w"], torch.ones(3))
    assert [p.name for p in list_checkpoints(_ckpt_dir(tmp_path))] == ["step-00000010.pt"]


def test_crash_before_the_pointer_update_keeps_the_previous_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_checkpoint(tmp_path, 10, _payload(1.0))
    real_replace = os.replace

    def crash_on_pointer(src, dst):
        if Path(dst).name == LATEST:
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_pointer)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 20, _payload(2.0))
    monkeypatch.setattr(os, "replace", real_replace)
    assert resolve_checkpoint(tmp_path).name == "step-00000010.pt"
    assert load_checkpoint(resolve_checkpoint(tmp_path))["step"] == 10
    assert not list(_ckpt_dir(tmp_path).glob(".*tmp*"))  # the temp pointer was cleaned up


def test_truncated_checkpoint_is_a_clear_error_naming_the_file_and_an_older_one(
    tmp_path: Path,
) -> None:
    save_checkpoint(tmp_path, 10, _payload(1.0))
    path = save_checkpoint(tmp_path, 20, _payload(2.0))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated") as info:
        load_checkpoint(resolve_checkpoint(tmp_path))
    assert str(path) in str(info.value)
    assert "step-00000010.pt" in str(info.value)  # the fix: resume the older one


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"not a checkpoint at all", "corrupt or truncated"),
        (None, "lacks"),
    ],
)
def test_foreign_files_are_refused_with_the_file_named(
    tmp_path: Path, content: bytes | None, match: str
) -> None:
    path = tmp_path / "x.pt"
    if content is None:
        torch.save({"model": {}}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_resolve_without_checkpoints_says_how_to_get_some(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nowhere")


def test_pointer_to_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 10, _payload(1.0))
    (_ckpt_dir(tmp_path) / LATEST).write_text("step-00000099.pt\n")
    with pytest.raises(CheckpointError, match="step-00000099.pt.*step-00000010.pt"):
        resolve_checkpoint(tmp_path)


def test_without_a_pointer_the_newest_complete_checkpoint_is_used(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 10, _payload(1.0))
    save_checkpoint(tmp_path, 20, _payload(2.0))
    (_ckpt_dir(tmp_path) / LATEST).unlink()
    assert resolve_checkpoint(tmp_path).name == "step-00000020.pt"
    assert resolve_checkpoint(_ckpt_dir(tmp_path)).name == "step-00000020.pt"


def test_fingerprint_mismatch_names_every_difference() -> None:
    saved = fingerprint("gs", "cnn", "digits", 2, 100)
    check_fingerprint(saved, dict(saved), "ck.pt")  # the same run: fine
    other = fingerprint("topk", "cnn", "mnist", 4, 100)
    with pytest.raises(ValueError, match="ck.pt") as info:
        check_fingerprint(saved, other, "ck.pt")
    message = str(info.value)
    assert "method is 'gs' there but 'topk' here" in message
    assert "dataset is 'digits' there but 'mnist' here" in message
    assert "world_size is 2 there but 4 here (--workers)" in message
    assert "model is" not in message  # only what differs is named


def _saved(method: str, sync: dict) -> dict:
    fp = checkpoint.fingerprint(method, "cnn", "digits", 2, 100)
    return {"fingerprint": fp, "ranks": [{"sync": sync}, {"sync": sync}]}


def test_a_checkpoint_of_pytorchs_hook_under_its_old_name_resumes_as_torch_powersgd() -> None:
    """`--method powersgd` ran PyTorch's hook before gssgd had its own PowerSGD: its
    checkpoints (the hook's "powersgd" memories) resume as torch-powersgd, and resuming
    one as gssgd's powersgd says which name to use."""
    old = _saved("powersgd", {"powersgd": {"iter": 3}})
    assert checkpoint.renamed_fingerprint(old, "torch-powersgd")["method"] == "torch-powersgd"
    with pytest.raises(ValueError, match=r"written by --method powersgd of an earlier release, "
                       r"which is --method torch-powersgd now \(PyTorch's PowerSGD hook.*"
                       r"Resume with --method torch-powersgd"):
        checkpoint.renamed_fingerprint(old, "powersgd")
    ours = _saved("powersgd", {"hook": {"iter": 3}})  # gssgd's own PowerSGD: unchanged
    assert checkpoint.renamed_fingerprint(ours, "powersgd") == ours["fingerprint"]
    assert checkpoint.renamed_fingerprint(ours, "torch-powersgd")["method"] == "powersgd"
