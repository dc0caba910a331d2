"""Atomic, resumable checkpoints of a data-parallel run.

Layout of a run directory (``--out``)::

    OUT/checkpoints/step-00000010.pt   # complete checkpoints; the newest KEEP are kept
    OUT/checkpoints/step-00000020.pt
    OUT/checkpoints/latest             # one line: the file name of the newest checkpoint

A checkpoint is one ``torch.save`` file that ``torch.load(weights_only=True)`` can read
(plain dicts, lists, numbers, strings and tensors only)::

    {
        "format": 1,
        "step": 20,                      # steps completed; the run resumes at this step
        "fingerprint": {...},            # method, model, dataset, world_size, d
        "config": {...},                 # the TrainConfig of the run that wrote it
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "ranks": [{"rng": ..., "hook": ...}, ...],   # one entry per rank, in rank order
        "totals": {...},                 # running byte and time totals of the run
    }

Writes are atomic: the file is written to a temporary name in the same directory,
flushed and fsync'ed, then moved into place with ``os.replace``; only then is the
``latest`` pointer replaced the same way. A run killed in the middle of a save leaves at
worst a stray temporary file, and ``latest`` still names a complete checkpoint.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from gssgd.methods import FORMER_NAMES, METHODS

__all__ = [
    "CHECKPOINT_DIR",
    "FORMAT",
    "KEEP",
    "LATEST",
    "CheckpointError",
    "atomic_write",
    "check_fingerprint",
    "checkpoint_name",
    "fingerprint",
    "list_checkpoints",
    "load_checkpoint",
    "renamed_fingerprint",
    "resolve_checkpoint",
    "save_checkpoint",
]

#: Sub-directory of the run directory that holds the checkpoints.
CHECKPOINT_DIR = "checkpoints"
#: Name of the pointer file that names the newest complete checkpoint.
LATEST = "latest"
#: How many checkpoints are kept (the newest ones).
KEEP = 2
#: Version of the checkpoint layout; bumped when the layout changes.
FORMAT = 1

_NAME = re.compile(r"^step-(\d{8,})\.pt$")
_TMP_MARK = ".tmp-"
_REQUIRED = ("format", "step", "fingerprint", "model", "optimizer", "ranks")
#: The fingerprint fields and the flag that sets each (for error messages).
FINGERPRINT_FLAGS = {
    "method": "--method",
    "model": "--model",
    "dataset": "--dataset",
    "world_size": "--workers",
    "d": "--model/--dataset",
}


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used: missing, corrupt, truncated or of an unknown layout.

    The message names the file and says what to do instead.
    """


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint taken after ``step`` completed steps."""
    return f"step-{step:08d}.pt"


def fingerprint(method: str, model: str, dataset: str, world_size: int, d: int) -> dict[str, Any]:
    """What a resumed run must share with the run that wrote the checkpoint.

    Args:
        method: the aggregation method (``--method``).
        model: the model name (``--model``).
        dataset: the dataset name (``--dataset``).
        world_size: the number of workers; residuals are per rank, so it must match.
        d: the number of model parameters.

    Returns:
        A plain dict, stored in every checkpoint under ``"fingerprint"``.
    """
    return {"method": method, "model": model, "dataset": dataset, "world_size": world_size, "d": d}


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], path: Path | str) -> None:
    """Refuse to resume a checkpoint written by a different run.

    Raises:
        ValueError: naming every field that differs, its value in the checkpoint and here.
    """
    differing = [
        f"{key} is {saved.get(key)!r} there but {value!r} here ({FINGERPRINT_FLAGS.get(key, key)})"
        for key, value in current.items()
        if saved.get(key) != value
    ]
    if differing:
        raise ValueError(
            f"cannot resume from {path}: it was written by a different run: "
            + "; ".join(differing)
            + ". Resume with the same --method, --model, --dataset and --workers, or start "
            "a fresh run with another --out."
        )


def renamed_fingerprint(saved: dict[str, Any], method: str) -> dict[str, Any]:
    """The fingerprint of checkpoint ``saved``, in today's method names, for a run of
    ``method``.

    A method renamed since the checkpoint was written (:data:`gssgd.methods.FORMER_NAMES`)
    resumes under its new name when the checkpoint's state is that method's: PyTorch's
    PowerSGD hook was ``--method powersgd`` until gssgd had a PowerSGD of its own, it is
    ``torch-powersgd`` now, and its ranks hold the hook's memories under the old name.

    Raises:
        ValueError: such a checkpoint resumed under its old name (the method now of that
            name keeps other state); the message names the new one.
    """
    fp = dict(saved["fingerprint"])
    old = fp.get("method")
    now = FORMER_NAMES.get(old) if isinstance(old, str) else None
    if now is None or not any(old in rank.get("sync", {}) for rank in saved.get("ranks", [])):
        return fp
    if method == old:
        raise ValueError(
            f"this checkpoint was written by --method {old} of an earlier release, which is "
            f"--method {now} now ({METHODS[now].summary}); --method {old} keeps other state. "
            f"Resume with --method {now}, or start a fresh run with --method {old}."
        )
    fp["method"] = now
    return fp


# --------------------------------------------------------------------------- writing


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write a file so that ``path`` is either its old content or the complete new one.

    ``write(f)`` fills a temporary file in the same directory, which is flushed,
    fsync'ed and then moved over ``path`` with ``os.replace``; the directory is fsync'ed
    too, so the rename survives a power cut. On any error the temporary file is removed.

    Args:
        path: the destination.
        write: called with the open binary temporary file.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    run_dir: Path | str, step: int, payload: dict[str, Any], keep: int = KEEP
) -> Path:
    """Write ``payload`` as the checkpoint of ``step`` and make it the latest.

    Order: (1) the checkpoint file, atomically; (2) the ``latest`` pointer, atomically;
    (3) delete all but the newest ``keep`` checkpoints and stale temporary files.

    Args:
        run_dir: the run directory (``--out``); checkpoints go to ``run_dir/checkpoints``.
        step: steps completed.
        payload: the checkpoint content (see the module docstring); ``step`` and
            ``format`` are filled in.
        keep: how many checkpoints to keep (>= 1).

    Returns:
        The path of the new checkpoint.

    Raises:
        ValueError: ``keep < 1``.
        OSError: the disk refused the write (the previous ``latest`` stays valid).
    """
    if keep < 1:
        raise ValueError(f"keep={keep} is invalid: it must be >= 1 (the newest is always kept)")
    directory = Path(run_dir) / CHECKPOINT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / checkpoint_name(step)
    content = {**payload, "format": FORMAT, "step": step}
    atomic_write(path, lambda f: torch.save(content, f))
    atomic_write(directory / LATEST, lambda f: f.write(f"{path.name}\n".encode()))
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    for stale in directory.glob(f".*{_TMP_MARK}*"):
        stale.unlink(missing_ok=True)
    return path


# --------------------------------------------------------------------------- reading


def list_checkpoints(directory: Path | str) -> list[Path]:
    """The complete checkpoints in ``directory``, oldest first (temporary files excluded)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def resolve_checkpoint(path: Path | str) -> Path:
    """The checkpoint file that ``--resume PATH`` means.

    Args:
        path: a run directory (``--out`` of the run), its ``checkpoints`` directory, or a
            checkpoint file.

    Returns:
        The file named by ``latest``; if there is no pointer, the newest checkpoint
        (checkpoint files only ever appear complete, so that is safe too).

    Raises:
        CheckpointError: nothing to resume from; the message names where it looked.
    """
    path = Path(path)
    if path.is_file():
        return path
    if not path.exists():
        raise CheckpointError(f"cannot resume: {path} does not exist; pass the --out of a run")
    directory = path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path
    pointer = directory / LATEST
    if pointer.is_file():
        name = pointer.read_text().strip()
        target = directory / name
        if not _NAME.match(name) or not target.is_file():
            others = [p.name for p in list_checkpoints(directory)]
            raise CheckpointError(
                f"cannot resume: {pointer} names {name!r}, which is not a checkpoint file in "
                f"{directory}; pass one of {others or 'no files'} with --resume "
                f"{directory}/FILE, or start afresh"
            )
        return target
    found = list_checkpoints(directory)
    if not found:
        raise CheckpointError(
            f"cannot resume: no checkpoint in {directory} (no {LATEST!r} pointer and no "
            "step-*.pt files); train with --checkpoint-every N --out DIR to write some"
        )
    return found[-1]


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """Load a checkpoint with ``torch.load(weights_only=True)`` and check its layout.

    Args:
        path: the checkpoint file (see :func:`resolve_checkpoint`).

    Returns:
        The checkpoint dict (tensors on the CPU).

    Raises:
        CheckpointError: the file is unreadable, corrupt or truncated, or lacks a field;
            the message names the file and an older checkpoint to try instead.
    """
    path = Path(path)
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a damaged file
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated and cannot be loaded "
            f"({type(err).__name__}: {reason}). {_older_hint(path)}"
        ) from err
    if not isinstance(content, dict):
        raise CheckpointError(
            f"checkpoint {path} holds a {type(content).__name__}, not a gssgd checkpoint dict. "
            f"{_older_hint(path)}"
        )
    missing = [key for key in _REQUIRED if key not in content]
    if missing:
        raise CheckpointError(
            f"checkpoint {path} lacks {missing}; it was not written by gssgd train. "
            f"{_older_hint(path)}"
        )
    if content["format"] != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has format {content['format']!r} but this gssgd reads format "
            f"{FORMAT}; resume it with the gssgd version that wrote it"
        )
    return content


def _older_hint(path: Path) -> str:
    older = [p for p in list_checkpoints(path.parent) if p.name != path.name]
    if older:
        return f"Resume from an older checkpoint instead: --resume {older[-1]}"
    return "No older checkpoint is left next to it; start the run afresh."
