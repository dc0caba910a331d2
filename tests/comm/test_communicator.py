"""The futures a DDP hook chains on (gssgd.comm.communicator): an error keeps its type down a
chain, where ``Future.then`` turns it into a RuntimeError."""

from __future__ import annotations

import pytest
import torch

from gssgd.comm import chain, completed_future, new_future


def test_chain_keeps_the_type_of_an_error_where_future_then_would_wrap_it() -> None:
    cpu = torch.device("cpu")
    doubled = chain(completed_future(torch.ones(2)), lambda t: t * 2, cpu)
    assert torch.equal(doubled.wait(), torch.full((2,), 2.0))

    def overflow(_: torch.Tensor) -> torch.Tensor:
        raise FloatingPointError("non-finite")

    with pytest.raises(FloatingPointError, match="non-finite"):  # not RuntimeError
        chain(completed_future(torch.ones(2)), overflow, cpu).wait()
    failed = new_future(cpu)
    later = chain(chain(failed, lambda t: t, cpu), lambda t: t, cpu)  # down a chain, too
    failed.set_exception(FloatingPointError("upstream"))
    with pytest.raises(FloatingPointError, match="upstream"):
        later.wait()
