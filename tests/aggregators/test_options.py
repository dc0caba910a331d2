"""Every bad option raises a ValueError that names the option, the value and the fix,
before any process group is touched (these tests run without one)."""

from __future__ import annotations

import pytest
import torch

import gssgd
from gssgd.aggregators import build_options
from gssgd.aggregators.options import resolve_k
from gssgd.aggregators.sketching import default_sketch_cols

BAD = [
    ("nope", {}, "unknown method 'nope'; valid methods: dense, topk, gtopk, sketched, gs"),
    ("gs", {"density": 0.0}, r"density=0.0 is invalid: it must be a number in \(0, 1\]"),
    ("gs", {"density": 1.5}, r"density=1.5 is invalid"),
    ("gs", {"density": float("nan")}, r"density=nan is invalid"),
    ("topk", {"k": 0}, r"k=0 is invalid: it must be an integer in \[1, d=1000\]"),
    ("topk", {"k": 1001}, r"k=1001 is invalid"),
    ("topk", {"k": 10, "density": 0.1}, "both density=0.1 and k=10 were given"),
    ("dense", {"k": 10}, "takes no k"),
    ("dense", {"dtype": torch.float64}, "dtype=torch.float64 is invalid"),
    ("topk", {"momentum": 1.0}, r"momentum=1.0 is invalid: it must be a number in \[0, 1\)"),
    ("gtopk", {"momentum": -0.1}, "momentum=-0.1 is invalid"),
    ("gs", {"rows": 4}, "rows=4 is invalid: it must be an odd integer"),
    ("sketched", {"cols": 0}, "cols=0 is invalid"),
    ("gs", {"candidates": 0}, "candidates=0 is invalid"),
    ("gs", {"candidates": 1.5}, "candidates=1.5 is invalid"),
    ("gs", {"seed": -3}, "seed=-3 is invalid"),
    ("gs", {"exact": "yes"}, "exact='yes' is invalid"),
    ("gs", {"allreduce": "ring"}, "allreduce='ring' is invalid: it must be one of recursive_doubling, backend, halving_doubling"),
    ("gs", {"table_dtype": torch.int8}, "table_dtype=torch.int8 is invalid: it must be torch.float32"),
    ("gs", {"guard": "warn"}, "guard='warn' is invalid: it must be 'grow', 'raise' or 'off'"),
    ("gs", {"nonfinite": "ignore"}, "nonfinite='ignore' is invalid: it must be 'skip', 'raise' or 'propagate'"),
    ("gs", {"max_consecutive_skips": 0}, "max_consecutive_skips=0 is invalid"),
    ("gs", {"hash_cache": "auto"}, "hash_cache='auto' is invalid"),
    ("topk", {"rows": 5}, r"unknown option\(s\) \['rows'\] for method 'topk'"),
    ("sketched", {"exact": False}, r"unknown option\(s\) \['exact'\] for method 'sketched'"),
    ("topk", {"feedback": "fetchsgd"}, r"feedback='fetchsgd' is invalid: .* ef, ef21, global, onebit "
     r"for this method \('fetchsgd' needs a sketching method"),
    ("gtopk", {"feedback": "global"}, r"momentum=0.0 is invalid: feedback='global' .* \(0, 1\)"),
    ("gs", {"feedback": "fetchsgd"}, r"exact=True is invalid: .* Pass exact=False"),
    ("sketched", {"feedback": "fetchsgd", "warmup_steps": 100},
     r"warmup_steps=100 is invalid: feedback='fetchsgd' keeps its error in tables of one shape"),
    ("gs", {"feedback": "fetchsgd", "exact": False, "prefilter": 8},
     r"prefilter=8 is invalid: feedback='fetchsgd' keeps no residual"),
    ("gs", {"reuse": 0}, r"reuse=0 is invalid: it must be an integer >= 1"),
    ("gs", {"reuse": True}, r"reuse=True is invalid"),
    ("gs", {"reuse": 2, "exact": False}, r"reuse=2 is invalid: .* needs the exact round"),
    ("sketched", {"reuse": 2}, r"unknown option\(s\) \['reuse'\] for method 'sketched'"),
]


def test_fetchsgd_takes_no_prefilter_from_the_many_workers_defaults() -> None:
    """From 16 workers gs pre-filters by default; FetchSGD, with no residual, must not."""
    _, _, opts = build_options("gs", 100_000, 0.001, world_size=64, feedback="fetchsgd",
                               exact=False)
    assert opts.prefilter == 0 and opts.cols == 1600


@pytest.mark.parametrize(("method", "options", "match"), BAD)
def test_bad_option_raises_before_touching_the_process_group(
    method: str, options: dict, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        gssgd.make_aggregator(method, 1000, **options)


def test_good_options_need_an_initialised_process_group() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        gssgd.make_aggregator("gs", 1000, density=0.01)


@pytest.mark.parametrize(
    ("d", "density", "k", "want"),
    [
        (1000, 0.01, None, 10),
        (1000, None, None, 10),
        (10, 0.01, None, 1),
        (1000, None, 7, 7),
        (1_000_000, 0.001, None, 1000),
        (3, 0.5, None, 2),
        (5, 0.5, None, 2),
        (100, 1, None, 100),
    ],
)
def test_k_is_max_1_round_density_d(
    d: int, density: float | None, k: int | None, want: int
) -> None:
    assert resolve_k(d, density, k) == want


def test_sketch_defaults_are_resolved() -> None:
    _, k, opts = build_options("gs", 100_000, density=0.001)
    assert k == 100
    assert opts.cols == default_sketch_cols(100_000, 100)
    assert opts.rows % 2 == 1
    assert set(gssgd.AGGREGATORS) == {"dense", "topk", "gtopk", "sketched", "gs", "powersgd"}
