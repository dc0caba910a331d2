"""The in-memory datasets: :class:`ImageData`, :class:`TextData` and how they are built.

Every loader (:mod:`gssgd.train.data_builtin`, :mod:`gssgd.train.data_user`) ends in
:func:`_image_data` or :func:`_text_data`, which turn checked arrays or a text into
these frozen containers. :class:`DatasetUnavailableError` is what a loader raises
when its source is not installed. :func:`gssgd.train.data.load_dataset` is the
entry point that picks the loader.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["DatasetUnavailableError", "ImageData", "TextData"]

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
