"""The QSGD example plugin (examples/qsgd.py): a quantiser with error feedback and a new
option in one file, against a single-process reference of the same math on real gloo
processes (P = 3 and 2), through the DDP hook, and through ``gssgd train --opt``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import gssgd
from gssgd.aggregators import build_options
from gssgd.methods import unregister_method
from tests.dist_utils import raise_worker_errors, run_on_prefixes, run_workers

D, STEPS, LEVELS, SEED = 1000, 4, 4, 7
HOOK_LEVELS = 32


@pytest.fixture()
def qsgd():
    """The example method, registered for the test and removed after it."""
    import examples.qsgd as module
    from gssgd.methods import register_method

    register_method(module.METHOD, replace=True)
    yield module
    unregister_method("qsgd")


def _grads(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(D, generator=g) * (1 + step) for step in range(STEPS)]


def _run(rank: int, world_size: int, group: dist.ProcessGroup | None = None) -> dict:
    import examples.qsgd  # noqa: F401  registers "qsgd" in this process

    agg = gssgd.make_aggregator("qsgd", D, group=group, levels=LEVELS, seed=SEED)
    updates, sent = [], []
    for grad in _grads(rank):
        updates.append(agg.step(grad))
        sent.append(agg.last_stats.bytes_sent)
    return {"updates": torch.stack(updates), "residual": agg.residual.clone(), "sent": sent}


def _reference(world_size: int, module) -> dict:
    """Every rank's quantiser by hand: ``Q(e + g)`` with rank r's generator ``seed + r``,
    the mean in rank order, and ``e = a - Q(a)``."""
    gens = [torch.Generator().manual_seed(SEED + r) for r in range(world_size)]
    residuals = [torch.zeros(D) for _ in range(world_size)]
    grads = [_grads(r) for r in range(world_size)]
    updates = []
    for step in range(STEPS):
        decoded = []
        for r in range(world_size):
            a = residuals[r] + grads[r][step]
            norm, codes = module.quantise(a, LEVELS, gens[r])
            q = codes.to(torch.float32) * (norm / LEVELS)
            decoded.append(q)
            residuals[r] = a - q
        total = torch.zeros(D)
        for q in decoded:
            total += q
        updates.append(total / world_size)
    return {"updates": torch.stack(updates), "residuals": residuals}


def test_qsgd_matches_its_reference_on_real_processes(qsgd) -> None:
    results = run_workers(3, run_on_prefixes, _run, [3, 2])
    raise_worker_errors(results)
    for world_size in (3, 2):
        ref = _reference(world_size, qsgd)
        for rank in range(world_size):
            got = results[rank][world_size]
            assert torch.equal(got["updates"], ref["updates"])  # bitwise, every rank
            assert torch.equal(got["residual"], ref["residuals"][rank])
            # what traffic() predicts is what the step sent (after the agreement check)
            options = build_options("qsgd", D, None, world_size, levels=LEVELS)[2]
            predicted = qsgd.QSGD.traffic(D, D, options, world_size)
            assert got["sent"][-1] == predicted.sent[rank]


def test_quantiser_is_unbiased_and_its_residual_is_what_it_got_wrong(qsgd) -> None:
    v = torch.randn(16, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    draws = []
    for _ in range(2000):
        norm, codes = qsgd.quantise(v, 4, gen)
        assert codes.dtype == torch.int8 and int(codes.abs().max()) <= 4
        draws.append(qsgd.dequantise(norm, codes, 4, torch.float32))
    # unbiased: the mean of many quantisations is the vector (each draw is off by up to
    # ||v|| / 4 per coordinate; the mean of 2,000 by about 1/45 of that)
    assert float((torch.stack(draws).mean(0) - v).abs().max()) < 0.05 * float(v.norm())
    rule = build_options("qsgd", 4, None, 1)[2].make_feedback()
    a = torch.tensor([1.0, -2.0, 3.0, 0.5])
    rule.keep(a, torch.tensor([1.0, -1.0, 3.0, 0.0]))
    assert torch.equal(rule.residual, torch.tensor([0.0, -1.0, 0.0, 0.5]))


def test_levels_out_of_range_is_refused_with_the_fix(qsgd) -> None:
    with pytest.raises(ValueError, match=r"levels=200 is invalid: .*\[1, 127\].*levels=16"):
        gssgd.make_aggregator("qsgd", 100, levels=200)
    with pytest.raises(ValueError, match="takes no k"):
        gssgd.make_aggregator("qsgd", 100, k=3)


def _hook_run(rank: int, world_size: int) -> dict:
    import examples.qsgd  # noqa: F401
    from gssgd.ddp import HookState, comm_hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = HookState("qsgd", levels=HOOK_LEVELS, model=ddp, start_iter=1)
    ddp.register_comm_hook(state, comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 8, generator=g)
    y = x[:, :1] * 2 - x[:, 1:2]
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    aggs = list(state._aggregators.values())
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"losses": losses, "levels": [a.options.levels for a in aggs], "params": params}


def test_qsgd_trains_in_the_ddp_hook(qsgd) -> None:
    results = run_workers(2, _hook_run)
    raise_worker_errors(results)
    for r in results:
        assert r["levels"] == [HOOK_LEVELS]  # the new option reached the hook's aggregator
        assert r["losses"][-1] < 0.5 * r["losses"][0]
    assert torch.equal(results[0]["params"], results[1]["params"])  # ranks stay in step


def test_qsgd_trains_from_the_command_line_with_its_new_option(tmp_path: Path, qsgd) -> None:
    from gssgd.cli.main import main
    from gssgd.train.metrics import read_metrics

    out = tmp_path / "cli"
    code = main(["train", "--plugin", "examples.qsgd", "--method", "qsgd", "--opt",
                 "levels=16", "--dataset", "digits", "--workers", "2", "--steps", "6",
                 "--batch-size", "16", "--eval-every", "0", "--no-progress", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "qsgd" and summary["status"] == "completed"
    d = summary["d"]
    # a quantised step after the dense first steps: the non-finite flag, then all-gathers
    # of d int8 levels and of a float32 norm (P = 2: each rank sends its own once), a
    # quarter of a dense float32 step's 4d bytes
    assert read_metrics(out / "metrics.jsonl")[-1]["bytes_sent"] == 4 + d + 4
