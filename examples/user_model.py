"""Your own model and data in gssgd, in one file: ``--model MODULE:FUNCTION`` and
``--dataset MODULE:FUNCTION``.

The trainer imports this module on every worker, calls the dataset function once per
process and the model function once per worker (after seeding the global RNG, so every
rank builds the same weights), then trains exactly as it trains a shipped model: the DDP
hook's dense first steps, the method's warm-up and recipes, the same metrics and
checkpoints, on real processes or in the simulated world::

    gssgd train --dataset examples.user_model:blobs --model examples.user_model:mlp \\
        --method gs --density 0.05 --workers 3 --steps 60
    gssgd train --simulate --workers 16 --dataset examples.user_model:blobs \\
        --model examples.user_model:mlp --method powersgd --steps 60
    gssgd compare --dataset examples.user_model:digits --model examples.user_model:mlp

A dataset function takes no argument and returns a mapping with the arrays ``x_train,
y_train, x_test, y_test`` (checked and normalised like a ``npz:PATH`` file), a ``str`` (a
text for a character model), or gssgd's ``ImageData`` / ``TextData``. A model function
takes that data and returns an ``nn.Module`` mapping a batch of ``x`` to logits. The same
names work in a study spec (``gssgd study``: ``model = "examples.user_model:mlp"``).
"""

from __future__ import annotations

import numpy as np
from torch import nn

from gssgd.train.data import ImageData, TextData


def blobs(samples: int = 2400, features: int = 20, classes: int = 4) -> dict[str, np.ndarray]:
    """A small synthetic classification task: Gaussian blobs around random centres,
    drawn from a fixed seed (the same on every worker, every run), 1/6 held out."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0.0, 0.35, size=(classes, features))
    y = rng.integers(0, classes, size=samples)
    x = centres[y] + rng.normal(0.0, 1.0, size=(samples, features))
    cut = samples * 5 // 6
    return {"x_train": x[:cut].astype(np.float32), "y_train": y[:cut],
            "x_test": x[cut:].astype(np.float32), "y_test": y[cut:]}


def digits() -> dict[str, np.ndarray]:
    """scikit-learn's 8x8 digits (shipped with scikit-learn) as flat features, split 80/20
    with a fixed seed: a real dataset that arrives as plain arrays."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order].astype(np.float32), y[order]
    cut = len(y) * 4 // 5
    return {"x_train": x[:cut], "y_train": y[:cut], "x_test": x[cut:], "y_test": y[cut:]}


def mlp(data: ImageData | TextData, hidden: int = 64) -> nn.Module:
    """A two-layer perceptron sized to the data: flattened input, ``hidden`` ReLU units,
    one logit per class."""
    if not isinstance(data, ImageData):
        raise ValueError(f"examples.user_model:mlp needs arrays, but {data.name!r} is text")
    inputs = int(np.prod(data.input_shape))
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(),
                         nn.Linear(hidden, data.num_classes))
