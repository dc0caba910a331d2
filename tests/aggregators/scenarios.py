"""Worker functions for the distributed aggregator tests (importable by spawned processes)."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

import gssgd
from gssgd.aggregators.gs import CollapseGuard
from tests.dist_utils import error_report

D = 3000
#: Steps of every run: five past gs's first collapse audit (at compressed step
#: ``first_audit`` = 20, counted from 0; the next comes 200 steps later), so the gs configs
#: audit and train on after it, and "the guard never grew the default sketch" means
#: something. Error feedback carries residuals from the first step on; more steps would
#: only repeat the same code paths (the P = 8 run was the slowest test of the suite at 50).
STEPS = CollapseGuard().first_audit + 5
#: A fixed sketch with float32 tables (the default's are float16), for both sketching methods
SKETCH = {"rows": 5, "cols": 300, "candidates": 3, "table_dtype": torch.float32}
#: ... and gs's tables summed by recursive doubling (the default is the backend's ring)
GS_SKETCH = {**SKETCH, "allreduce": "recursive_doubling"}

#: config name -> (method, options incl. density or k, vector length)
CONFIGS: dict[str, tuple[str, dict, int]] = {
    "dense": ("dense", {}, D),
    "dense16": ("dense", {"dtype": torch.float16}, D),
    "topk": ("topk", {"density": 0.01}, D),
    "topk_momentum": ("topk", {"density": 0.01, "momentum": 0.9}, D),
    "gtopk": ("gtopk", {"density": 0.01}, D),
    "gtopk_momentum": ("gtopk", {"density": 0.01, "momentum": 0.9}, D),
    # EF21 (no momentum) and EF21-SGDM: a dense estimate, the same on every rank
    "topk_ef21": ("topk", {"density": 0.01, "feedback": "ef21"}, D),
    "gtopk_ef21m": ("gtopk", {"density": 0.01, "feedback": "ef21", "momentum": 0.9}, D),
    "sketched_ef21m": ("sketched", {"density": 0.01, "feedback": "ef21", "momentum": 0.9,
                                    **SKETCH}, D),
    "gs_ef21m": ("gs", {**GS_SKETCH, "density": 0.01, "feedback": "ef21", "momentum": 0.9}, D),
    # the aggregator's momentum with masking, 1-bit Adam's compressed momentum, and
    # FetchSGD's momentum in sketch space
    "topk_global": ("topk", {"density": 0.01, "feedback": "global", "momentum": 0.9}, D),
    "gs_global": ("gs", {**GS_SKETCH, "density": 0.01, "feedback": "global", "momentum": 0.9}, D),
    "topk_onebit": ("topk", {"density": 0.01, "feedback": "onebit", "momentum": 0.9}, D),
    "gtopk_onebit": ("gtopk", {"density": 0.01, "feedback": "onebit", "momentum": 0.9}, D),
    "sketched_onebit": ("sketched", {"density": 0.01, "feedback": "onebit", "momentum": 0.9,
                                     **SKETCH}, D),
    "gs_onebit": ("gs", {**GS_SKETCH, "density": 0.01, "feedback": "onebit", "momentum": 0.9}, D),
    "sketched_fetchsgd": ("sketched", {"density": 0.01, "feedback": "fetchsgd",
                                       "momentum": 0.9, **SKETCH}, D),
    "gs_fetchsgd": ("gs", {**GS_SKETCH, "density": 0.01, "feedback": "fetchsgd",
                           "momentum": 0.9, "exact": False}, D),
    "sketched": ("sketched", {"density": 0.01, **SKETCH}, D),
    "gs": ("gs", {**GS_SKETCH, "density": 0.01}, D),
    "gs_backend": ("gs", {**SKETCH, "density": 0.01, "allreduce": "backend"}, D),
    "gs_estimate": ("gs", {**GS_SKETCH, "density": 0.01, "exact": False}, D),
    "gs_half": ("gs", {**GS_SKETCH, "density": 0.01, "table_dtype": torch.float16}, D),
    # Sketched-SGD's many-workers levers: float16 tables (summed as float32 on the server)
    # and the pre-filter
    "sketched_half_prefilter": ("sketched", {**SKETCH, "density": 0.01,
                                             "table_dtype": torch.float16, "prefilter": 2}, D),
    "gs_prefilter": ("gs", {**GS_SKETCH, "density": 0.01, "prefilter": 2}, D),
    # Ok-Topk-style reuse: a sketch every third step, the exact round at its candidates between
    "gs_reuse": ("gs", {**GS_SKETCH, "density": 0.01, "reuse": 3}, D),
    # DeMo/SparseLoCo-style selection by chunk: 700 coordinates a chunk (the last 200), so
    # the quotas of m*k = 90 and k = 30 go by largest remainder
    "gs_chunk": ("gs", {**GS_SKETCH, "density": 0.01, "chunk": 700}, D),
    # The shipped default sketch (no rows/cols/candidates given: one row, 40k columns capped
    # at d/4, m = 32 capped at d/(8k), float16 tables, gs's by the ring). At density 0.01
    # both caps bind (cols 750, m 12); at 0.001 neither does (cols 1200, m 32).
    "sketched_default": ("sketched", {"density": 0.01}, D),
    "gs_default": ("gs", {"density": 0.01}, D),
    "gs_default_sparse": ("gs", {"density": 0.001}, 10 * D),
    "gs_default_estimate": ("gs", {"density": 0.01, "exact": False}, D),
}
#: configs that use the default sketch shape
DEFAULT_SHAPE = ("sketched_default", "gs_default", "gs_default_sparse", "gs_default_estimate")
#: configs whose sums round differently from the float32 reference (tested on their own)
ROUNDED = {"dense16", "gs_half"}
#: configs whose statistics alone are kept (for byte-count tests)
STATS_ONLY: dict[str, tuple[str, dict, int]] = {
    "gs_k_small_d": ("gs", {**GS_SKETCH, "k": 30}, D),
    "gs_k_large_d": ("gs", {**GS_SKETCH, "k": 30}, 10 * D),
}


def make_grad(rank: int, step: int, d: int) -> torch.Tensor:
    """A different gradient per (rank, step): noise plus heavy coordinates, some shared."""
    gen = torch.Generator().manual_seed(1_000_003 * step + 7919 * rank + d)
    g = torch.randn(d, generator=gen)
    shared = torch.Generator().manual_seed(31 * step + d)
    heavy = torch.randperm(d, generator=shared)[:20]
    g[heavy] += 4 * torch.randn(20, generator=shared)
    own = torch.randperm(d, generator=gen)[:10]
    g[own] += 6.0
    return g


#: World sizes run as subgroups of ranks 0..P-1 inside the P = 8 run (one spawn instead of
#: three: starting processes costs seconds each), with a few configs: gTop-k's merges and
#: gs's table all-reduce fold one, two or three ranks there (P = 3 folds only one).
PREFIX_SIZES = (5, 6, 7)
PREFIX_CONFIGS = ("gtopk", "gtopk_momentum", "gs_default")


def build(name: str, table: dict, group: dist.ProcessGroup | None = None) -> gssgd.Aggregator:
    method, opts, d = table[name]
    opts = dict(opts)
    density = opts.pop("density", None)
    return gssgd.make_aggregator(method, d, density=density, group=group, **opts)


def run_config(rank: int, name: str, group: dist.ProcessGroup | None = None) -> dict:
    """STEPS steps of config ``name``: updates, final residual, gradient sum, statistics,
    and the sketch shape the aggregator used (None for methods without a sketch)."""
    agg = build(name, CONFIGS, group)
    d = CONFIGS[name][2]
    updates, stats, grad_sum = [], [], torch.zeros(d, dtype=torch.float64)
    for t in range(STEPS):
        g = make_grad(rank, t, d)
        grad_sum += g.double()
        updates.append(agg.step(g))
        stats.append(dataclasses.asdict(agg.last_stats))
    sd = agg.state_dict()
    shape = None
    if hasattr(agg, "sketch"):  # after the run: gs's guard may have grown cols and m*k
        shape = {
            "rows": agg.options.rows,
            "cols": getattr(agg, "cols", agg.options.cols),
            "candidates": agg.options.candidates,
            "num_candidates": agg.num_candidates,
        }
    return {
        "updates": torch.stack(updates),
        "residual": sd.get("residual"),
        "grad_sum": grad_sum,
        "stats": stats,
        "shape": shape,
    }


def run_all(rank: int, world_size: int) -> dict:
    out: dict = {name: run_config(rank, name) for name in CONFIGS}
    for name in STATS_ONLY:
        agg = build(name, STATS_ONLY)
        d = STATS_ONLY[name][2]
        stats = []
        for t in range(3):
            agg.step(make_grad(rank, t, d))
            stats.append(dataclasses.asdict(agg.last_stats))
        out[name] = {"stats": stats}
    return out


def run_all_and_prefixes(rank: int, world_size: int) -> dict:
    """``run_all``, then PREFIX_CONFIGS on the subgroups of ranks ``0..P-1`` for every P of
    PREFIX_SIZES (under ``out["prefix"][P]`` on the ranks of that subgroup)."""
    out = run_all(rank, world_size)
    # new_group is a collective of the whole world: every group is made before any rank
    # runs on one, and every rank waits for the others at the end.
    groups = {size: dist.new_group(list(range(size))) for size in PREFIX_SIZES}
    out["prefix"] = {
        size: {name: run_config(rank, name, group) for name in PREFIX_CONFIGS}
        for size, group in groups.items()
        if rank < size
    }
    dist.barrier()
    return out


def mismatched_density(rank: int, world_size: int, method: str) -> str:
    """Rank 1 asks for another density: every rank must raise a ValueError."""
    density = 0.02 if rank == 1 else 0.01
    agg = gssgd.make_aggregator(
        method, D, density=density, **({} if method in ("dense", "topk", "gtopk") else SKETCH)
    )
    if method == "dense":  # dense ignores density: make it disagree on the payload dtype
        agg = gssgd.make_aggregator(method, D, dtype=torch.float16 if rank == 1 else torch.float32)
    try:
        agg.step(make_grad(rank, 0, D))
    except ValueError as exc:
        return str(exc)
    return "no error"


#: The fault scenarios' methods (``label -> (method, options)``), each way the ranks'
#: non-finite flags ride with a first message: the all-reduced payload (dense, gs on the ring
#: and, reusing candidates, on its exact round, PowerSGD's dense part or its P), the
#: all-gathered index list (local Top-k), the merged lists (gTop-k both ways), the server's
#: replies (Sketched-SGD, FetchSGD). With local momentum, EF21 and PowerSGD's warm start,
#: a skipped step must leave more than the residual as it was.
NONFINITE_METHODS: dict[str, tuple[str, dict]] = {
    "dense": ("dense", {}),
    "topk": ("topk", {"density": 0.01, "momentum": 0.9}),
    "gtopk": ("gtopk", {"density": 0.01, "momentum": 0.9}),
    "gtopk_tree": ("gtopk", {"density": 0.01, "exchange": "tree"}),
    "sketched": ("sketched", {"density": 0.01, "momentum": 0.9, **SKETCH}),
    "sketched_fetchsgd": ("sketched", {"density": 0.01, "feedback": "fetchsgd",
                                       "momentum": 0.9, **SKETCH}),
    "gs": ("gs", {"density": 0.01, "momentum": 0.9}),
    "gs_ef21_reuse": ("gs", {**GS_SKETCH, "density": 0.01, "feedback": "ef21",
                             "momentum": 0.9, "reuse": 2}),
    "gs_estimate_hd": ("gs", {"density": 0.01, "exact": False, "allreduce": "halving_doubling"}),
    "gs_fetchsgd": ("gs", {**GS_SKETCH, "density": 0.01, "feedback": "fetchsgd",
                           "momentum": 0.9, "exact": False}),
    "powersgd": ("powersgd", {"rank": 2, "shapes": [(30, 100)]}),
    "powersgd_onebit": ("powersgd", {"rank": 2, "shapes": [(30, 100)], "feedback": "onebit",
                                     "momentum": 0.9}),
    "powersgd_dense_part": ("powersgd", {"rank": 2, "shapes": [(29, 100), (100,)]}),
}


def _make(label: str, **more) -> gssgd.Aggregator:
    method, opts = NONFINITE_METHODS[label]
    return gssgd.make_aggregator(method, D, **{**opts, **more})


def _same_state(a: object, b: object) -> bool:
    """Whether two state dicts (nested dicts, lists, tensors) hold the same values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_state(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def nonfinite_step(rank: int, world_size: int, label: str) -> dict:
    """Rank P-1 produces NaN at step 1 (Inf at step 2): every rank skips those steps once
    the flags riding in the step's first message are in. Beside it a twin aggregator skips
    the same steps without sending anything (its ``nonfinite_step`` straight away, as a
    separate flag exchange did): per step, whether the update and the whole state are
    bitwise the twin's."""
    agg, twin = _make(label), _make(label)
    out: dict = {"updates": [], "same_as_twin": [], "skipped": []}
    for t in range(4):
        g = make_grad(rank, t, D)
        if rank == world_size - 1 and t == 1:
            g[5] = float("nan")
        if rank == world_size - 1 and t == 2:
            g[7] = float("inf")
        update = agg.step(g)
        twin_update = twin.nonfinite_step(g, [world_size - 1]) if t in (1, 2) else twin.step(g)
        out["updates"].append(update)
        out["same_as_twin"].append(torch.equal(update, twin_update)
                                   and _same_state(agg.state_dict(), twin.state_dict()))
        out["skipped"].append(agg.last_stats.skipped)
    return out


def persistent_nonfinite(rank: int, world_size: int, label: str, nonfinite: str) -> str:
    """Rank 0's gradient is NaN from step 2 on: every rank must stop alike."""
    agg = _make(label, nonfinite=nonfinite, max_consecutive_skips=3)
    for t in range(10):
        g = make_grad(rank, t, D)
        if rank == 0 and t >= 2:
            g[:] = float("nan")
        try:
            agg.step(g)
        except FloatingPointError as exc:
            return f"step {t}: {exc}"
    return "no error"


METHODS = ["dense", "topk", "gtopk", "sketched", "gs"]


def for_every_method(rank: int, world_size: int, scenario_name: str, *args) -> dict:
    """Run one scenario for every method in a single spawn (spawning costs seconds): the
    non-finite scenarios for every label of :data:`NONFINITE_METHODS`, the others for
    :data:`METHODS`."""
    scenario = globals()[scenario_name]
    labels = NONFINITE_METHODS if "nonfinite" in scenario_name else METHODS
    return {m: scenario(rank, world_size, m, *args) for m in labels}


#: Per world size, the fault scenarios (``for_every_method`` arguments) that run after
#: ``run_all`` in its spawn: starting the processes again for each costs seconds. Every
#: rank of a fault scenario raises or skips at the same step, so the group stays usable.
FAULTS: dict[int, tuple[tuple[str, ...], ...]] = {
    2: (("mismatched_density",), ("persistent_nonfinite", "skip")),
    3: (("mismatched_density",), ("nonfinite_step",), ("persistent_nonfinite", "raise")),
}


def run_all_and_faults(rank: int, world_size: int) -> dict:
    """``run_all``, then FAULTS[world_size] (under ``out["faults"][scenario args]``; a
    scenario that raised is reported like a failed worker of ``run_workers``)."""
    out = run_all(rank, world_size)
    out["faults"] = {}
    for fault in FAULTS[world_size]:
        try:
            out["faults"][fault] = for_every_method(rank, world_size, *fault)
        except Exception as exc:  # noqa: BLE001 - reported to the test of this scenario
            out["faults"][fault] = error_report(exc)
    return out
