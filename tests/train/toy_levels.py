"""A toy plugin method for the tests: dense averaging whose options dataclass adds an option
no gssgd method has, ``levels``, so a test can see a new option travel from ``--opt`` to
every rank's aggregator (each aggregator writes the value it got to ``$GSSGD_TOY_RECORD``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from gssgd import Method, register_method
from gssgd.aggregators import AGGREGATORS

#: The directory each aggregator records its ``levels`` in (one file per aggregator).
RECORD_ENV = "GSSGD_TOY_RECORD"
_Dense = AGGREGATORS["dense"]


@dataclass(frozen=True)
class ToyLevelsOptions(_Dense.Options):  # type: ignore[name-defined,misc]
    """Dense's options and ``levels``, an integer in [1, 127]."""

    levels: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.levels, bool) or not isinstance(self.levels, int) or not (
                1 <= self.levels <= 127):
            raise ValueError(f"levels={self.levels!r} is invalid: it must be an integer in "
                             "[1, 127]. For example levels=16.")


class ToyLevels(_Dense):  # type: ignore[misc,valid-type]
    """Dense averaging that records the ``levels`` it was built with at its first step."""

    name = "toylevels"
    Options = ToyLevelsOptions

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        where = os.environ.get(RECORD_ENV)
        if where and self.steps == 0:
            Path(where, f"{os.getpid()}-{id(self)}.json").write_text(
                json.dumps({"levels": self.options.levels}))
        return super().step(grad)


METHOD = register_method(Method("toylevels", "dense averaging with a toy option (tests)",
                                ToyLevels), replace=True)
