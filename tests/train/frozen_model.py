"""A user model with a frozen layer (``--model tests.train.frozen_model:frozen_mlp``): its
first layer does not train, so the method averages the second layer's gradient alone."""

from __future__ import annotations

import numpy as np
from torch import nn

from gssgd.train.data import ImageData


def frozen_mlp(data: ImageData) -> nn.Module:
    """A two-layer perceptron whose first layer is frozen (``requires_grad=False``)."""
    inputs = int(np.prod(data.input_shape))
    model = nn.Sequential(nn.Flatten(), nn.Linear(inputs, 32), nn.ReLU(),
                          nn.Linear(32, data.num_classes))
    for p in model[1].parameters():
        p.requires_grad_(False)
    return model
