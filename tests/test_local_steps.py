"""Local steps with a compressed outer step (gssgd.local_steps), on 3 real gloo processes:
the dense outer step against a hand-written DiLoCo, bitwise; every compressed outer step
conserves the pseudo-gradient's mass through its residual; a resume is bitwise; bytes are
counted on outer steps only; bad settings are clear errors."""

from __future__ import annotations

import copy
import warnings
from functools import cache
from typing import Any

import pytest
import torch
import torch.distributed as dist

from gssgd.local_steps import LocalSteps
from tests.dist_utils import run_each, run_workers

WORLD = 3
H = 4
OUTER = 3
LR_IN, LR_OUT, MU = 0.01, 0.7, 0.9
COMPRESSED = ("topk", "gtopk", "gs", "sketched", "powersgd")
#: SparseLoCo's residual decay, on the methods it is tested with
DECAY, DECAYED = 0.5, ("topk", "gs")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 3))


def _batch(rank: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + t)
    return torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)


def _inner(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, t: int) -> None:
    x, y = _batch(rank, t)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def _flat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to(torch.float32) for t in ts])


def _diloco_by_hand(rank: int, world: int) -> torch.Tensor:
    """DiLoCo written from its equations with torch.distributed: H AdamW steps, the
    pseudo-gradient anchor - theta summed by all-reduce and divided by P, Nesterov on the
    anchor (buf = mu buf + g; step g + mu buf), the weights set to it, buffers averaged."""
    model = _model()
    params = list(model.parameters())
    buffers = [b for b in model.buffers() if b.dtype.is_floating_point]
    opt = torch.optim.AdamW(params, lr=LR_IN)
    anchor, buf = _flat(params), None
    for t in range(H * OUTER):
        _inner(model, opt, rank, t)
        if (t + 1) % H:
            continue
        with torch.no_grad():
            g = anchor - _flat(params)
            dist.all_reduce(g)
            g = g / world
            buf = g.clone() if buf is None else buf.mul_(MU).add_(g)
            anchor.add_(g.add(buf, alpha=MU), alpha=-LR_OUT)
            offset = 0
            for p in params:
                p.copy_(anchor[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            mean = _flat(buffers)
            dist.all_reduce(mean)
            mean = mean / world
            offset = 0
            for b in buffers:
                b.copy_(mean[offset:offset + b.numel()].view_as(b))
                offset += b.numel()
    return torch.cat([_flat(params), _flat(buffers)])


def _train(rank: int, world: int, method: str, steps: int, state: dict | None = None,
           **options: Any) -> dict[str, Any]:
    """``steps`` inner steps with LocalSteps (from ``state``: model, inner optimizer and
    LocalSteps states, when given), recording each outer step's pseudo-gradient, update
    and bytes."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR_IN)
    density = None if method in ("dense", "powersgd") else 0.1
    ls = LocalSteps(model, method, local_steps=H, density=density, outer_lr=LR_OUT,
                    outer_momentum=MU, **options)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        ls.load_state_dict(state["ls"])
        start = ls.inner_steps
    deltas, updates, sent = [], [], []
    step = ls.aggregator.step

    def recorded(grad: torch.Tensor) -> torch.Tensor:
        deltas.append(grad.clone())
        updates.append(step(grad).clone())
        return updates[-1]

    ls.aggregator.step = recorded  # type: ignore[method-assign]
    raw, held = [], []  # each outer step's pseudo-gradient and the residual it found
    for t in range(start, steps):
        _inner(model, opt, rank, t)
        before = ls.bytes_sent
        if (t + 1) % H == 0:
            raw.append((ls.anchor - ls._flat_params()).detach().clone())
            e = ls.aggregator.residual
            held.append(torch.zeros(ls.d) if e is None else e.clone())
        if ls.step():
            sent.append((ls.bytes_sent - before, ls.last_stats.bytes_sent))
        else:
            assert ls.bytes_sent == before  # an inner step sends nothing
    residual = ls.aggregator.residual
    return {
        "weights": torch.cat([_flat(list(model.parameters())),
                              _flat([b for b in model.buffers() if b.dtype.is_floating_point])]),
        "deltas": deltas, "updates": updates, "sent": sent, "raw": raw, "held": held,
        "residual": None if residual is None else residual.clone(),
        "state": {"model": copy.deepcopy(model.state_dict()), "opt": copy.deepcopy(opt.state_dict()),
                  "ls": copy.deepcopy(ls.state_dict())},
        "outer_steps": ls.outer_steps, "traffic": ls.aggregator.last_stats.bytes_sent,
    }


def _resumed(rank: int, world: int, method: str) -> dict[str, Any]:
    """Stop after one outer step and a half, resume from the saved states in fresh objects,
    and finish: the weights must equal an uninterrupted run's."""
    half = _train(rank, world, method, H + H // 2)
    return _train(rank, world, method, H * OUTER, state=half["state"])


def _nonfinite(rank: int, world: int) -> dict[str, Any]:
    """Rank 1's weights turn NaN before the second outer step: every rank skips it, with
    a warning, and goes back to the first outer step's weights."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR_IN)
    ls = LocalSteps(model, "gs", local_steps=2, density=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(4):
            _inner(model, opt, rank, t)
            if t == 3 and rank == 1:
                with torch.no_grad():
                    next(model.parameters()).fill_(float("nan"))
            if ls.step() and t == 1:
                anchor = ls.anchor.clone()
    return {"weights": ls._flat_params(), "anchor": anchor, "outer": ls.outer_steps,
            "skipped": ls.skipped, "warned": [str(w.message) for w in caught]}


def _decayed(rank: int, world: int, method: str) -> dict[str, Any]:
    """The outer step with SparseLoCo's error feedback: the residual decayed by DECAY."""
    return _train(rank, world, method, H * OUTER, error_decay=DECAY)


def _bad(rank: int, world: int, kwargs: dict[str, Any]) -> None:
    LocalSteps(_model(), **kwargs)


BAD = {
    "H0": {"local_steps": 0},
    "Hfloat": {"local_steps": 2.5},
    "lr": {"local_steps": 2, "outer_lr": -1.0},
    "momentum": {"local_steps": 2, "outer_momentum": 1.0},
    "method": {"local_steps": 2, "method": "nope"},
    "decay0": {"local_steps": 2, "method": "topk", "density": 0.1, "error_decay": 0.0},
    "decay_dense": {"local_steps": 2, "error_decay": 0.5},
}


def _everything(rank: int, world: int) -> dict:
    runs: dict[Any, tuple] = {"by_hand": (_diloco_by_hand, ())}
    runs.update({m: (_train, (m, H * OUTER)) for m in ("dense", *COMPRESSED)})
    runs.update({("decay", m): (_decayed, (m,)) for m in DECAYED})
    runs.update({("resumed", m): (_resumed, (m,)) for m in ("dense", "gs")})
    runs.update({("bad", n): (_bad, (kw,)) for n, kw in BAD.items()})
    runs["nonfinite"] = (_nonfinite, ())
    return run_each(rank, world, lambda r, w, fn, args: fn(r, w, *args), runs)


@cache
def results() -> list[dict]:
    return run_workers(WORLD, _everything)


def test_the_dense_outer_step_is_diloco_written_by_hand_bitwise() -> None:
    for rank, res in enumerate(results()):
        assert torch.equal(res["dense"]["weights"], res["by_hand"]), f"rank {rank}"
        assert res["dense"]["outer_steps"] == OUTER
    # every rank holds the same weights after the last outer step
    assert all(torch.equal(r["dense"]["weights"], results()[0]["dense"]["weights"])
               for r in results())


@pytest.mark.parametrize("method", COMPRESSED)
def test_a_compressed_outer_step_keeps_the_pseudo_gradients_mass_in_its_residual(
    method: str,
) -> None:
    """sum over outer steps and ranks of the pseudo-gradient = P * sum of the updates +
    sum over ranks of the residual (error feedback loses nothing)."""
    ranks = [r[method] for r in results()]
    assert len(ranks[0]["updates"]) == OUTER
    deltas = sum(torch.stack(r["deltas"]).double().sum(0) for r in ranks)
    delivered = WORLD * torch.stack(ranks[0]["updates"]).double().sum(0)
    residuals = sum(r["residual"].double() for r in ranks)
    assert deltas.abs().max() > 1e-3  # the invariant is not trivially zero
    assert max(r["residual"].abs().max() for r in ranks) > 1e-4  # something is held back
    torch.testing.assert_close(delivered + residuals, deltas, rtol=1e-5, atol=1e-6)
    for r in ranks[1:]:  # every rank applies the same update
        assert all(torch.equal(a, b) for a, b in zip(r["updates"], ranks[0]["updates"],
                                                     strict=True))
        assert torch.equal(r["weights"][: r["deltas"][0].numel()],
                           ranks[0]["weights"][: r["deltas"][0].numel()])


@pytest.mark.parametrize("method", ["dense", "gs"])
def test_a_resumed_run_ends_bitwise_equal_to_the_uninterrupted_one(method: str) -> None:
    for rank, res in enumerate(results()):
        assert torch.equal(res[("resumed", method)]["weights"], res[method]["weights"]), rank


@pytest.mark.parametrize("method", ["dense", *COMPRESSED])
def test_bytes_are_counted_on_outer_steps_only(method: str) -> None:
    for res in results():
        sent = res[method]["sent"]
        assert len(sent) == OUTER
        assert all(total == stats > 0 for total, stats in sent)
    # the pseudo-gradient's traffic plus the buffers' dense all-reduce
    assert results()[0][method]["sent"][-1][0] > results()[0][method]["traffic"]


@pytest.mark.parametrize(("name", "says"), [
    ("H0", "local_steps=0 is invalid: it must be an integer >= 1"),
    ("Hfloat", "local_steps=2.5"),
    ("lr", "outer_lr=-1.0 is invalid: it must be a number > 0"),
    ("momentum", "outer_momentum=1.0 is invalid: it must be a number in [0, 1)"),
    ("method", "method='nope' is not a gssgd method"),
    ("decay0", "error_decay=0.0 is invalid: it must be a number in (0, 1]"),
    ("decay_dense", "error_decay=0.5 decays the residual, but method='dense' keeps none"),
])
def test_bad_settings_are_clear_errors_on_every_rank(name: str, says: str) -> None:
    for res in results():
        err = res[("bad", name)]
        assert err["__type__"] == "ValueError" and says in err["__error__"], err


@pytest.mark.parametrize("method", DECAYED)
def test_a_decayed_residual_is_beta_e_plus_the_pseudo_gradient_less_what_was_sent(
    method: str,
) -> None:
    """SparseLoCo's error feedback, at every outer step t, summed over ranks:
    sum_p e_p(t) = DECAY * sum_p e_p(t-1) + sum_p delta_p(t) - P * update(t)."""
    ranks = [r[("decay", method)] for r in results()]
    for rank in ranks:
        assert "__error__" not in rank, rank
    for t in range(OUTER):
        before = sum(r["held"][t].double() for r in ranks)
        after = (sum(r["held"][t + 1].double() for r in ranks) if t + 1 < OUTER
                 else sum(r["residual"].double() for r in ranks))
        want = DECAY * before + sum(r["raw"][t].double() for r in ranks)
        want -= WORLD * ranks[0]["updates"][t].double()
        assert before.abs().max() > 1e-4 or t == 0  # the decay acts on something
        torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-6)
    # the run differs from classic error feedback's from the second outer step on
    assert not torch.equal(ranks[0]["weights"], results()[0][method]["weights"])


def test_a_non_finite_pseudo_gradient_on_one_rank_skips_the_outer_step_on_every_rank() -> None:
    for rank, res in enumerate(results()):
        got = res["nonfinite"]
        assert (got["outer"], got["skipped"]) == (1, 1), rank
        assert torch.equal(got["weights"], got["anchor"]), rank  # back to the last outer step
        assert any("skipped on every rank" in w for w in got["warned"]), got["warned"]
