"""A user's own data: ``npz:PATH`` (arrays) and ``text:PATH`` (UTF-8 text).

The files are checked thoroughly, since they come from outside: every error names
the file, what is wrong and how to fix it. Loads are cached per process and keyed
by the file's mtime and size (:func:`_file_version`), so an edited file is read
again. :func:`gssgd.train.data.load_dataset` calls these loaders.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from gssgd.train.data_types import ImageData, TextData, _image_data, _text_data

_NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def _user_path(name: str, prefix: str) -> Path:
    raw = name[len(prefix) :]
    if not raw:
        raise ValueError(
            f"dataset {name!r} has no path; write it as {prefix}PATH, e.g. {prefix}data/mine"
        )
    path = Path(raw).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"dataset {name!r}: no file at {path.resolve()}; check the path")
    return path.resolve()


def _file_version(path: Path) -> tuple[int, int]:
    """(mtime_ns, size): part of the cache key, so an edited file is read again."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


# --------------------------------------------------------------------------- npz


@functools.lru_cache(maxsize=4)
def _load_npz(path: Path, mtime_ns: int, size: int, name: str) -> ImageData:
    """Load and check a user's ``.npz`` (``mtime_ns`` and ``size`` key the cache)."""
    with np.load(path, allow_pickle=False) as npz:
        missing = [k for k in _NPZ_KEYS if k not in npz.files]
        if missing:
            raise ValueError(
                f"{path} lacks the arrays {missing} (it has {sorted(npz.files)}); "
                f"save it with np.savez(path, {', '.join(f'{k}=...' for k in _NPZ_KEYS)})"
            )
        x_train, y_train, x_test, y_test = (np.asarray(npz[k]) for k in _NPZ_KEYS)
    x_train, x_test = _check_features(path, x_train, x_test)
    num_classes = _check_labels(path, x_train, y_train, x_test, y_test)
    return _image_data(name, x_train, y_train, x_test, y_test, num_classes)


def _check_features(
    path: Path | str, x_train: np.ndarray, x_test: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Check the feature arrays; return them as (N, F) or (N, C, H, W). ``path`` names
    their source in the messages (the file, or ``--dataset MODULE:FUNCTION``)."""
    for key, x in (("x_train", x_train), ("x_test", x_test)):
        if x.ndim not in (2, 3, 4):
            raise ValueError(
                f"{path}: {key} has shape {x.shape}; expected (N, F) features, (N, H, W) "
                "images or (N, C, H, W) images"
            )
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
            raise ValueError(
                f"{path}: {key} has dtype {x.dtype}; store numbers (e.g. float32 or uint8)"
            )
        if len(x) == 0:
            raise ValueError(f"{path}: {key} is empty; both splits need at least one sample")
        if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
            raise ValueError(f"{path}: {key} contains NaN or Inf; clean the features first")
    if x_train.ndim == 3:
        x_train = x_train[:, None]
    if x_test.ndim == 3:
        x_test = x_test[:, None]
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ValueError(
            f"{path}: x_train samples have shape {x_train.shape[1:]} but x_test samples "
            f"{x_test.shape[1:]}; both splits need the same sample shape"
        )
    return x_train, x_test


def _check_labels(
    path: Path | str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray
) -> int:
    """Check the labels against the features; return the number of classes."""
    for key, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if y.ndim != 1 or len(y) != len(x):
            raise ValueError(
                f"{path}: y_{key} has shape {y.shape} but x_{key} has {len(x)} samples; "
                f"y_{key} must be 1-D with one integer label per sample"
            )
        if not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{path}: y_{key} has dtype {y.dtype}; labels must be integers 0..C-1")
        if y.min() < 0:
            raise ValueError(
                f"{path}: y_{key} contains the label {int(y.min())}; labels must be 0..C-1"
            )
    num_classes = int(y_train.max()) + 1
    if y_test.max() >= num_classes:
        raise ValueError(
            f"{path}: y_test contains the label {int(y_test.max())} but y_train's labels span "
            f"0..{num_classes - 1}; every test class must occur in the train split"
        )
    return num_classes


# --------------------------------------------------------------------------- text


@functools.lru_cache(maxsize=4)
def _load_text(path: Path, mtime_ns: int, size: int, name: str) -> TextData:
    """Load a user's text file (``mtime_ns`` and ``size`` key the cache)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path} is not UTF-8 text ({err}); convert it, e.g. with iconv -t UTF-8"
        ) from None
    return _text_data(name, text)


# --------------------------------------------------------------------------- MODULE:FUNCTION


@functools.lru_cache(maxsize=4)
def _load_from_function(name: str) -> ImageData | TextData:
    """A user's dataset function's data (``--dataset MODULE:FUNCTION``), checked.

    The function takes no argument and returns :class:`ImageData` / :class:`TextData`, a
    mapping with ``x_train, y_train, x_test, y_test`` (checked as a ``npz:`` file is), or
    a ``str`` (a text); see :mod:`gssgd.train.user_code`. Cached per process by name.
    """
    from gssgd.train.user_code import load_function

    made = load_function(name, "--dataset")()
    if isinstance(made, (ImageData, TextData)):
        return made
    if isinstance(made, str):
        return _text_data(name, made)
    if hasattr(made, "keys") and hasattr(made, "__getitem__"):
        missing = [k for k in _NPZ_KEYS if k not in made]
        if missing:
            raise ValueError(f"--dataset {name!r} returned a mapping without {missing}; return "
                             f"{{{', '.join(repr(k) + ': array' for k in _NPZ_KEYS)}}}")
        x_train, y_train, x_test, y_test = (np.asarray(made[k]) for k in _NPZ_KEYS)
        where = f"--dataset {name}"  # the checks' messages name their source
        x_train, x_test = _check_features(where, x_train, x_test)
        classes = _check_labels(where, x_train, y_train, x_test, y_test)
        return _image_data(name, x_train, y_train, x_test, y_test, classes)
    raise ValueError(f"--dataset {name!r} returned a {type(made).__name__}; return ImageData, "
                     f"TextData, a mapping of the arrays {', '.join(_NPZ_KEYS)}, or a str")
