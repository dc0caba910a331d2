"""A cost model of one aggregation step: latency, bandwidth and compute, per method.

Every method's step costs this rank (Hockney's alpha-beta model plus a compute term)::

    T(method, P, d, link) = alpha * rounds                      # latency-bound messages
                          + beta(link) * critical_bytes         # bytes on the busiest link
                          + gamma[method] * d                   # compression compute

* ``rounds``: the sequential communication steps on the critical path, counted exactly as
  :mod:`gssgd.comm` counts them (a ring all-reduce is ``2(P-1)`` rounds, an all-gather
  ``P-1``, recursive doubling ``log2 P`` (+2 to fold in ranks past a power of two), a star
  gather or broadcast 1). Each costs ``alpha`` seconds: the per-message latency, measured
  by ``bench comm``'s latency probe (a 4-byte all-gather, timed per round).
* ``critical_bytes``: the bytes that cross the busiest link, summed over the sequential
  phases of the step, each phase counted in its busier direction (links are full duplex:
  a recursive-doubling exchange sends and receives at once and costs its payload once).
* ``beta(rate) = max(beta0, 8 / (eta * rate))`` seconds per byte: a stream moves at the
  pace of its slower stage. ``beta0`` is the software cost of moving a byte through the
  stack and the collective (measured on loopback, where there is no wire), the second term
  the wire time at ``eta`` times the nominal rate (``eta`` < 1: TCP/IP and Ethernet
  headers, ACKs, tbf granularity). An unlimited link (``rate=None``) is ``beta0``.
* ``gamma[method]``: compute per gradient element (sketching, top-k selection, recovery,
  error feedback, the non-finite guard), from the benchmark's ``seconds_compress +
  seconds_decompress + seconds_other`` on the critical path's rank.

The byte figures per rank (:func:`traffic`) are the ones :mod:`gssgd.comm` records in
``agg.last_stats`` on every step after the first (the first step adds the rank-agreement
check), control messages included: every method's step starts with an all-gather of a
4-byte non-finite flag. ``I`` is the index size (4 bytes when ``d < 2^31``, else 8), ``V`` the
value size (4, or 2 for a 16-bit dense payload), ``S = rows * cols * T`` a sketch table
(``T`` = 4, or 2 for 16-bit tables),
``C = min(m * k, d)`` the candidates, ``P2`` the largest power of two ``<= P`` and
``L = log2 P2``:

=============  =====================================  =========================================
method         per rank (sent / received)             critical bytes (busiest link)
=============  =====================================  =========================================
dense(16)      ring ``2(P-1)/P * d*V`` each way       ``2(P-1)/P * d*V``
topk           ``k(I+V)`` / ``(P-1) k(I+V)``           ``(P-1) k(I+V)`` (all-gather)
gtopk          ``L k(I+V)`` each way (+fold-in)        ``(L [+2]) k(I+V)`` (recursive doubling)
sketched       worker ``S + C*V`` / ``C*I + k(I+V)``   ``(P-1)(S + C*I + C*V + k(I+V))``: the
               server ``(P-1)`` times the reverse     server's link, phase after phase
gs             ``L (S + C*V)`` each way (+fold-in)     ``(L [+2]) (S + C*V)``; no indices
gs-backend     ring of ``S`` and of ``C*V``            ``2(P-1)/P (S + C*V)``
gs-estimate    as gs without ``C*V``                   ``(L [+2]) S``
gs-small       as gs with a quarter of the columns     as gs
gs-half        as gs, table entries in 16 bits        as gs
=============  =====================================  =========================================

``beta0`` and ``gamma`` are CPU work: on a machine where workers share cores both stretch by
the run's *compute share* (measured by ``bench comm``'s compute probe); the model holds
their values for a core per worker, and predictions assume one (``compute_share=1``).

Calibration (:func:`calibrate`) takes ``alpha`` from the latency probes, each method's
``gamma`` as its median measured compute per element, and fits ``beta0`` and ``eta`` to the
relative error of the measured step times minus their compute.

What the model leaves out, and so what its errors on emulated runs hold: waiting for peers
whose compute ran late (on a machine with fewer cores than workers, ranks take turns on
the cores, so one rank's collective waits for another's compute); the tbf bucket of the
emulated links, which lets the first ``burst`` bytes after an idle moment (32 KB at
100 Mbit/s, 500 KB at 1 Gbit/s) leave at memory speed, so short messages beat the rate;
and the latency of ranks woken up on busy cores, which the probe includes. Predictions for a
real cluster (a core per worker) therefore err on the slow side for latency and, for short
messages, on the fast side for the wire.

Example:
    >>> spec = method_spec("gs", d=10**8, density=0.001)
    >>> seconds = CostModel.default().predict(spec, world_size=64, rate_bps=10**9).total
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gssgd.aggregators import build_options
from gssgd.aggregators.options import DEFAULT_ROWS, resolve_k

__all__ = [
    "DEFAULT_METHODS",
    "VARIANTS",
    "CostModel",
    "ErrorRow",
    "Measurement",
    "MethodSpec",
    "Prediction",
    "Traffic",
    "calibrate",
    "error_summary",
    "load_measurements",
    "method_spec",
    "model_report",
    "prediction_errors",
    "traffic",
]

#: Benchmark method names: an aggregator of :data:`gssgd.AGGREGATORS` with some options.
VARIANTS: dict[str, str] = {
    "dense": "dense all-reduce, float32 payload (the uncompressed baseline)",
    "dense16": "dense all-reduce, float16 payload scaled by 1/P",
    "topk": "local Top-k, all-gather of (index, value) pairs",
    "gtopk": "global Top-k, recursive-doubling merges",
    "sketched": "Sketched-SGD, star topology through rank 0",
    "gs": "gs-SGD, recursive-doubling sketch all-reduce + exact round",
    "gs-backend": "gs-SGD with the backend's (ring) all-reduce",
    "gs-estimate": "gs-SGD without the exact round (exact=False)",
    "gs-small": "gs-SGD with a sketch of a quarter of the columns",
    "gs-half": "gs-SGD with float16 sketch tables on the wire",
}

#: What ``gssgd bench comm`` runs unless told otherwise.
DEFAULT_METHODS: tuple[str, ...] = tuple(VARIANTS)

_CONTROL_BYTES = 4  # the int32 non-finite flag every step all-gathers


# --------------------------------------------------------------------------- methods


@dataclass(frozen=True)
class MethodSpec:
    """Everything that fixes one benchmark method's message pattern.

    Attributes:
        name: the benchmark name (a key of :data:`VARIANTS`).
        aggregator: the :data:`gssgd.AGGREGATORS` name it runs.
        d, k: vector length and coordinates per rank (``k = d`` for dense).
        value_bytes: bytes of a value on the wire (4; 2 for a 16-bit dense payload).
        index_bytes: bytes of an index (4 when ``d < 2^31``, else 8).
        rows, cols, candidates: the sketch shape and m (0 for methods without a sketch).
        table_bytes: bytes of a sketch-table entry on the wire (4; 2 for 16-bit tables).
        exact: gs only: whether the exact second round runs.
        allreduce: gs only: "recursive_doubling" or "backend".
        seed: the hash seed of the sketching methods.
    """

    name: str
    aggregator: str
    d: int
    k: int
    value_bytes: int = 4
    index_bytes: int = 4
    rows: int = 0
    cols: int = 0
    candidates: int = 0
    table_bytes: int = 4
    exact: bool = True
    allreduce: str = "recursive_doubling"
    seed: int = 0

    @property
    def num_candidates(self) -> int:
        """``C = min(m * k, d)``: the coordinates whose exact values the second round fetches."""
        return min(self.candidates * self.k, self.d)

    @property
    def sketch_bytes(self) -> int:
        """``S = rows * cols * T``: one sketch table on the wire (``T``: ``table_bytes``)."""
        return self.rows * self.cols * self.table_bytes

    def aggregator_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`gssgd.make_aggregator` (after ``name`` and ``d``)."""
        if self.aggregator == "dense":
            return {"dtype": torch.float16 if self.value_bytes == 2 else torch.float32}
        opts: dict[str, Any] = {"k": self.k}
        if self.aggregator in ("sketched", "gs"):
            opts.update(rows=self.rows, cols=self.cols, candidates=self.candidates, seed=self.seed)
        if self.aggregator == "gs":
            # Every timed step must have the same message pattern: the collapse guard's
            # audits (one dense all-reduce at step 20, then every 200 steps: 0.5% of a dense
            # step on average) are left out of the benchmark.
            opts.update(exact=self.exact, allreduce=self.allreduce, guard="off")
            if self.table_bytes == 2:
                opts["table_dtype"] = torch.float16
        return opts

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (what ``results.json`` stores under ``spec``)."""
        return dataclasses.asdict(self)


def method_spec(
    name: str,
    d: int,
    density: float | None = None,
    *,
    k: int | None = None,
    rows: int = DEFAULT_ROWS,
    cols: int | None = None,
    candidates: int | None = None,
    seed: int = 0,
) -> MethodSpec:
    """The :class:`MethodSpec` of benchmark method ``name`` for vectors of length ``d``.

    Args:
        name: a key of :data:`VARIANTS`.
        d: gradient length.
        density: fraction of coordinates sent (``k = max(1, round(density * d))``).
        k: the count instead of ``density``.
        rows: sketch rows (odd).
        cols: sketch columns; None for the aggregators' default
            (:func:`gssgd.aggregators.options.default_sketch_cols`). ``gs-small`` uses a
            quarter of it (at least 256).
        candidates: m; the sketch proposes ``m * k`` candidates; None for the aggregators'
            default (:func:`gssgd.aggregators.options.default_candidates`).
        seed: hash seed.

    Returns:
        The spec, with every size resolved exactly as :func:`gssgd.make_aggregator` would
        resolve it (through :func:`gssgd.aggregators.build_options`).

    Raises:
        ValueError: an unknown name (the message lists the valid ones), or a bad size.
    """
    if name not in VARIANTS:
        raise ValueError(
            f"unknown benchmark method {name!r}; valid methods: {', '.join(VARIANTS)}. "
            "Pass a comma-separated subset, e.g. --methods dense,topk,gs."
        )
    index_bytes = 4 if d < 2**31 else 8
    if name in ("dense", "dense16"):
        resolve_k(d, density, None)  # validates d and density
        return MethodSpec(name, "dense", d, d, 2 if name == "dense16" else 4, index_bytes)
    kk = resolve_k(d, density, k)
    if name in ("topk", "gtopk"):
        return MethodSpec(name, name, d, kk, 4, index_bytes)
    aggregator = "sketched" if name == "sketched" else "gs"
    _, kk, opts = build_options(
        aggregator, d, None, k=kk, rows=rows, cols=cols, candidates=candidates, seed=seed
    )
    base_cols = opts.cols
    spec = MethodSpec(
        name,
        aggregator,
        d,
        kk,
        4,
        index_bytes,
        rows=opts.rows,
        cols=base_cols,
        candidates=opts.candidates,
        seed=seed,
    )
    if name == "gs-backend":
        spec = dataclasses.replace(spec, allreduce="backend")
    elif name == "gs-estimate":
        spec = dataclasses.replace(spec, exact=False)
    elif name == "gs-small":
        spec = dataclasses.replace(spec, cols=max(256, base_cols // 4))
    elif name == "gs-half":
        spec = dataclasses.replace(spec, table_bytes=2)
    return spec


# --------------------------------------------------------------------------- traffic


@dataclass(frozen=True)
class Traffic:
    """What one step of a method moves, for every rank.

    Attributes:
        sent, received: payload bytes per rank (index = rank), control messages included;
            equal to ``agg.last_stats.bytes_sent/bytes_received`` on every step but the first.
        rounds: sequential communication steps on the critical path (``last_stats.rounds``).
        critical_bytes: bytes on the busiest link, summed over the step's sequential phases.
    """

    sent: tuple[int, ...]
    received: tuple[int, ...]
    rounds: int
    critical_bytes: int

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(
            tuple(a + b for a, b in zip(self.sent, other.sent, strict=True)),
            tuple(a + b for a, b in zip(self.received, other.received, strict=True)),
            self.rounds + other.rounds,
            self.critical_bytes + other.critical_bytes,
        )


def _ring_allreduce(nbytes: int, p: int) -> Traffic:
    """The backend's all-reduce of ``nbytes``, counted as a ring: ``2(P-1)/P * n`` each way,
    in ``2(P-1)`` steps (a reduce-scatter and an all-gather of ``P-1`` steps each)."""
    moved = (2 * (p - 1) * nbytes) // p
    return Traffic((moved,) * p, (moved,) * p, 2 * (p - 1), moved)


def _allgather(nbytes: int, p: int) -> Traffic:
    """An all-gather of ``nbytes`` per rank: each rank's bytes go out once (logically) and
    ``(P-1) * n`` come in, over ``P-1`` ring steps."""
    if p == 1:
        return Traffic((0,), (0,), 0, 0)
    return Traffic((nbytes,) * p, ((p - 1) * nbytes,) * p, p - 1, (p - 1) * nbytes)


def _recursive_doubling(nbytes: int, p: int, result_extra: int = 0) -> Traffic:
    """Recursive doubling of an ``nbytes`` payload (gssgd.comm's schedule).

    ``L = log2 P2`` exchanges of ``n`` bytes with partner ``rank XOR 2^i``; with ``P != P2``
    the ranks ``>= P2`` first send their payload to ``rank - P2`` and get the result (plus
    ``result_extra`` bytes: gTop-k's survival flags) back last: two more rounds.
    """
    p2 = 1 << (p.bit_length() - 1)
    levels = p2.bit_length() - 1
    sent, received = [], []
    for rank in range(p):
        if rank >= p2:  # folds in, then receives the result
            sent.append(nbytes)
            received.append(nbytes + result_extra)
        else:
            s = r = levels * nbytes
            if rank + p2 < p:  # receives a folded rank's payload, sends it the result
                r += nbytes
                s += nbytes + result_extra
            sent.append(s)
            received.append(r)
    folded = p != p2
    rounds = levels + (2 if folded else 0)
    critical = levels * nbytes + ((2 * nbytes + result_extra) if folded else 0)
    return Traffic(tuple(sent), tuple(received), rounds, critical)


def _star(spec: MethodSpec, p: int) -> Traffic:
    """Sketched-SGD's four star phases through rank 0, which carries ``P-1`` copies of each:
    sketches in (S), candidate indices out (C*I), candidate values in (C*V), result out
    (k(I+V)). One round each."""
    s, c = spec.sketch_bytes, spec.num_candidates
    i, v, k = spec.index_bytes, spec.value_bytes, spec.k
    worker_out, worker_in = s + c * v, c * i + k * (i + v)
    sent = ((p - 1) * worker_in,) + (worker_out,) * (p - 1)
    received = ((p - 1) * worker_out,) + (worker_in,) * (p - 1)
    return Traffic(sent, received, 4, (p - 1) * (worker_out + worker_in))


def traffic(spec: MethodSpec, world_size: int) -> Traffic:
    """Bytes, rounds and critical-path bytes of one step of ``spec`` on ``world_size`` ranks.

    The formulas of the module docstring's table; this is the one place they live.

    Args:
        spec: the method (see :func:`method_spec`).
        world_size: P >= 1.

    Returns:
        The :class:`Traffic` of one step after the first.

    Raises:
        ValueError: ``world_size`` < 1, or an unknown aggregator in ``spec``.
    """
    p = world_size
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"world_size={p!r} must be an integer >= 1")
    control = _allgather(_CONTROL_BYTES, p)
    i, v, k = spec.index_bytes, spec.value_bytes, spec.k
    if spec.aggregator == "dense":
        return control + _ring_allreduce(spec.d * v, p)
    if spec.aggregator == "topk":  # indices, then values
        return control + _allgather(k * i, p) + _allgather(k * v, p)
    if spec.aggregator == "gtopk":  # (index, value) lists; the fold-back adds k uint8 flags
        return control + _recursive_doubling(k * (i + v), p, result_extra=k)
    if spec.aggregator == "sketched":
        return control + _star(spec, p)
    if spec.aggregator == "gs":
        reduce = _ring_allreduce if spec.allreduce == "backend" else _recursive_doubling
        out = control + reduce(spec.sketch_bytes, p)
        if spec.exact:
            out = out + reduce(spec.num_candidates * v, p)
        return out
    raise ValueError(f"unknown aggregator {spec.aggregator!r} in {spec}")


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Prediction:
    """A predicted step time and its three parts (seconds)."""

    latency: float
    bandwidth: float
    compute: float

    @property
    def total(self) -> float:
        return self.latency + self.bandwidth + self.compute


#: Defaults: the calibration of docs/results/model, from ``gssgd bench comm --workers 4 --d 1e6
#: --density 0.001`` at 100mbit, 1gbit and none on a 2-core x86 VM (4 single-threaded
#: workers sharing the cores, beside other load), rounded. ``alpha`` there includes the
#: wake-up delays of busy cores; ``beta0`` and ``gamma`` are per core (see the compute
#: share). Used when no calibration data is given.
DEFAULT_ALPHA = 0.0014
DEFAULT_BETA0 = 8.7e-10
DEFAULT_ETA = 0.82
DEFAULT_GAMMA: dict[str, float] = {
    "dense": 5.1e-09,
    "dense16": 5.7e-09,
    "topk": 2.3e-08,
    "gtopk": 2.3e-08,
    "sketched": 2.9e-08,
    "gs": 7.7e-08,
    "gs-backend": 7.1e-08,
    "gs-estimate": 4.5e-08,
    "gs-small": 7.3e-08,
    "gs-half": 7.7e-08,  # not calibrated: gs's figure
}


@dataclass
class CostModel:
    """``T = alpha * rounds + beta(rate) * critical_bytes + gamma[method] * d``.

    Attributes:
        alpha: seconds per latency-bound message (round).
        beta0: seconds per byte through the software stack (the whole cost on loopback).
        eta: the fraction of a shaped link's nominal rate that payload achieves.
        gamma: seconds of compression compute per gradient element, by method name.
        source: where the values come from ("defaults", or the calibration directories).
        notes: what calibration could not determine and left at its default.
    """

    alpha: float = DEFAULT_ALPHA
    beta0: float = DEFAULT_BETA0
    eta: float = DEFAULT_ETA
    gamma: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_GAMMA))
    source: str = "defaults"
    notes: list[str] = field(default_factory=list)

    @classmethod
    def default(cls) -> CostModel:
        """The documented defaults (see the ``DEFAULT_*`` constants)."""
        return cls()

    def beta(self, rate_bps: int | None, compute_share: float = 1.0) -> float:
        """Seconds per byte: ``max(share * beta0, 8 / (eta * rate))``, the slower of the
        software stack (stretched by shared cores) and the wire; ``share * beta0`` alone
        for an unlimited link (``rate_bps=None``)."""
        software = compute_share * self.beta0
        return software if rate_bps is None else max(software, 8.0 / (self.eta * rate_bps))

    def gamma_of(self, spec: MethodSpec) -> float:
        """``gamma`` of the method, falling back to its aggregator's, then to gs's."""
        for key in (spec.name, spec.aggregator, "gs"):
            if key in self.gamma:
                return self.gamma[key]
        return DEFAULT_GAMMA["gs"]

    def predict(
        self,
        spec: MethodSpec,
        world_size: int,
        rate_bps: int | None,
        compute_share: float = 1.0,
    ) -> Prediction:
        """The predicted seconds of one step of ``spec`` on ``world_size`` ranks.

        Args:
            spec: the method and sizes.
            world_size: P >= 1.
            rate_bps: every link's rate in bit/s, or None for an unlimited link.
            compute_share: workers per core (1: a core per worker, as in a cluster; about 2
                for 4 single-threaded workers on 2 cores): compute and the software cost
                per byte take that many times longer.
        """
        t = traffic(spec, world_size)
        return Prediction(
            latency=self.alpha * t.rounds,
            bandwidth=self.beta(rate_bps, compute_share) * t.critical_bytes,
            compute=compute_share * self.gamma_of(spec) * spec.d,
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Measurement:
    """One measured method of one ``bench comm`` run.

    Attributes:
        spec: the method's spec; world_size, rate_bps: the run's P and link (None: loopback).
        seconds_per_step: the measured step time; seconds_compute: its time outside
            collectives (compress + decompress + other, on the critical path's rank).
        source: the results directory it came from.
        alpha_probe: the run's measured seconds per latency-bound round, if it has one.
        compute_share: the factor by which sharing cores stretched the run's compute: its
            compute probe's ``share`` (``_meta.compute_probe``), else
            ``max(1, P * threads / cores)``.
    """

    spec: MethodSpec
    world_size: int
    rate_bps: int | None
    seconds_per_step: float
    seconds_compute: float
    source: str = ""
    alpha_probe: float | None = None
    compute_share: float = 1.0


def load_measurements(directory: str | Path) -> list[Measurement]:
    """Read the methods of ``DIRECTORY/results.json`` written by ``gssgd bench comm``.

    Raises:
        FileNotFoundError: there is no results.json (the message says how to make one).
        ValueError: the file lacks the fields the model needs.
    """
    path = Path(directory)
    path = path / "results.json" if path.is_dir() else path
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; pass a directory written by `gssgd bench comm --out DIR`"
        )
    data = json.loads(path.read_text())
    meta = data.get("_meta")
    if not isinstance(meta, dict) or "workers" not in meta or "link_bps" not in meta:
        raise ValueError(
            f"{path} has no '_meta' with 'workers' and 'link_bps'; it was not written by "
            "`gssgd bench comm` (or by an older version): rerun the benchmark"
        )
    probe = (meta.get("latency_probe") or {}).get("alpha")
    share = (meta.get("compute_probe") or {}).get("share")
    if share is None:  # no probe: assume the workers' threads shared the cores evenly
        cores = meta.get("cpu_count") or 0
        share = max(1.0, meta["workers"] * meta.get("threads", 1) / cores) if cores else 1.0
    out = []
    for name, row in data.items():
        if name.startswith("_"):
            continue
        try:
            spec = MethodSpec(**row["spec"])
            out.append(
                Measurement(
                    spec=spec,
                    world_size=int(meta["workers"]),
                    rate_bps=meta["link_bps"],
                    seconds_per_step=float(row["seconds_per_step"]),
                    seconds_compute=float(row["seconds_compress"])
                    + float(row["seconds_decompress"])
                    + float(row.get("seconds_other", 0.0)),
                    source=str(path.parent),
                    alpha_probe=None if probe is None else float(probe),
                    compute_share=share,
                )
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}: method {name!r} lacks a field the model needs: {exc}"
            ) from None
    return out


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of unknowns: the best feasible solution of
    the unconstrained least-squares problems over every subset of the columns."""
    n = a.shape[1]
    best, best_cost = np.zeros(n), float(np.sum(b**2))
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            x_sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x_sub < 0):
                continue
            x = np.zeros(n)
            x[list(cols)] = x_sub
            cost = float(np.sum((a @ x - b) ** 2))
            if cost < best_cost - 1e-15 * max(1.0, best_cost):
                best, best_cost = x, cost
    return best


def _relative_cost(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.sum(((pred - y) / y) ** 2, axis=-1)


def calibrate(
    measurements: Sequence[Measurement],
    base: CostModel | None = None,
    *,
    fit_alpha: bool = False,
) -> CostModel:
    """Fit the model to measured steps.

    Steps:
        1. ``gamma[method]``: the median of ``seconds_compute / (d * compute_share)`` over
           the method's points: compute per element on a core of its own. (Sharing cores is
           taken to stretch all compute alike, which overstates it for work one rank does
           while the others wait, such as Sketched-SGD's server recovery.)
        2. ``alpha``: the median of the runs' latency probes (``_meta.latency_probe``: the
           time per round of a 4-byte all-gather), when every run has one and ``fit_alpha``
           is False; otherwise it is fitted in step 3. Measuring it is the default because
           runs at one P hold few distinct round counts, and a fit then books the waits of
           ranks that share cores (a constant per step) as latency, which a prediction at
           P = 1024 multiplies by a thousand ring steps.
        3. ``beta0`` and ``eta`` (and a free ``alpha``): minimise the squared relative error
           of ``alpha * rounds + bytes * max(share * beta0, 8 / (eta * rate))`` against
           ``y = seconds_per_step - seconds_compute``: first on a log grid (``alpha`` in
           closed form at each node), then exactly: with each point's regime (software- or
           wire-bound) fixed at the best node the model is linear, and non-negative least
           squares solves it; repeated while a regime changes. ``beta0`` needs a loopback
           run (on a shaped link the wire hides it), ``eta`` a run on a shaped link.

    Parameters the data cannot determine keep ``base``'s value; ``notes`` says which.

    Args:
        measurements: from :func:`load_measurements` (one or more runs).
        base: the model whose values stand in for what cannot be fitted (the defaults).
        fit_alpha: fit ``alpha`` even when latency probes exist.

    Returns:
        A new :class:`CostModel`.

    Raises:
        ValueError: no measurements.
    """
    if not measurements:
        raise ValueError(
            "no measurements to calibrate on; pass directories written by `gssgd bench comm`"
        )
    base = base or CostModel.default()
    gamma = dict(base.gamma)
    by_method: dict[str, list[float]] = {}
    for m in measurements:
        by_method.setdefault(m.spec.name, []).append(
            m.seconds_compute / (m.spec.d * m.compute_share)
        )
    gamma.update({name: statistics.median(v) for name, v in by_method.items()})

    notes = []
    probes = {m.source: m.alpha_probe for m in measurements}
    alpha: float | None = None
    if not fit_alpha and all(p is not None for p in probes.values()):
        alpha = statistics.median(probes.values())  # type: ignore[arg-type]
        runs = f"{len(probes)} run" + ("s" if len(probes) > 1 else "")
        notes.append(f"alpha measured by the latency probes of the runs ({runs})")
    fit_beta0 = any(m.rate_bps is None for m in measurements)
    fit_eta = any(m.rate_bps is not None for m in measurements)
    if not fit_beta0:
        notes.append(
            f"beta0 (software cost per byte) kept at {base.beta0:.3g} s/B: it needs a "
            "--link none run"
        )
    if not fit_eta:
        notes.append(f"eta kept at {base.eta:g}: it needs a run on a rate-limited link")

    t = [traffic(m.spec, m.world_size) for m in measurements]
    rounds = np.array([x.rounds for x in t], dtype=float)
    volume = np.array([x.critical_bytes for x in t], dtype=float)
    share = np.array([m.compute_share for m in measurements])
    wire = np.array([0.0 if m.rate_bps is None else 8.0 / m.rate_bps for m in measurements])
    y = np.array([max(m.seconds_per_step - m.seconds_compute, 1e-9) for m in measurements])

    def solve_alpha(bandwidth: np.ndarray) -> np.ndarray:
        """The best non-negative alpha for each row of ``bandwidth`` (closed form)."""
        if alpha is not None:
            return np.full(bandwidth.shape[:-1], alpha)
        r = rounds / y
        a = np.sum(r * (1.0 - bandwidth / y), axis=-1) / max(float(np.sum(r * r)), 1e-300)
        return np.maximum(a, 0.0)

    # 1. A log grid over beta0 and eta.
    b0_grid = np.logspace(-12, -6, 241) if fit_beta0 else np.array([base.beta0])
    eta_grid = np.logspace(np.log10(0.05), np.log10(2.0), 161) if fit_eta else np.array([base.eta])
    soft = share[None, None, :] * b0_grid[:, None, None]
    bandwidth = volume * np.maximum(soft, wire / eta_grid[None, :, None])
    a = solve_alpha(bandwidth)
    cost = _relative_cost(a[..., None] * rounds + bandwidth, y)
    i, j = np.unravel_index(int(np.argmin(cost)), cost.shape)
    b0, eta, best_alpha = float(b0_grid[i]), float(eta_grid[j]), float(a[i, j])

    # 2. Exact: with each point's regime fixed the model is linear in (alpha, beta0, 1/eta).
    for _ in range(5):
        software = share * b0 >= wire / eta
        feats = {
            "alpha": rounds,
            "beta0": volume * share * software,
            "inv_eta": volume * wire * ~software,
        }
        free = [f for f, on in zip(feats, (alpha is None, fit_beta0, fit_eta), strict=True) if on]
        if not free:
            break
        known = (alpha or 0.0) * rounds
        if not fit_beta0:
            known = known + b0 * feats["beta0"]
        if not fit_eta:
            known = known + feats["inv_eta"] / eta
        design = np.stack([feats[f] / y for f in free], axis=1)
        x = dict(zip(free, _nnls(design, 1.0 - known / y), strict=True))
        new_b0 = float(x.get("beta0", b0)) if fit_beta0 else b0
        new_eta = eta
        if fit_eta and x.get("inv_eta", 0.0) > 0:
            new_eta = 1.0 / float(x["inv_eta"])
        new_alpha = float(x.get("alpha", best_alpha)) if alpha is None else alpha
        trial = new_alpha * rounds + volume * np.maximum(share * new_b0, wire / new_eta)
        if _relative_cost(trial, y) > _relative_cost(
            best_alpha * rounds + volume * np.maximum(share * b0, wire / eta), y
        ):
            break  # the grid's point is better: keep it
        changed = np.any((share * new_b0 >= wire / new_eta) != software)
        b0, eta, best_alpha = new_b0, new_eta, new_alpha
        if not changed:
            break
    sources = sorted({m.source for m in measurements})
    return CostModel(
        alpha=float(best_alpha if alpha is None else alpha),
        beta0=b0,
        eta=eta,
        gamma=gamma,
        source="calibrated on " + ", ".join(sources),
        notes=notes,
    )


@dataclass(frozen=True)
class ErrorRow:
    """A measured step next to the model's prediction; ``rel_error = pred/measured - 1``."""

    measurement: Measurement
    predicted: float

    @property
    def rel_error(self) -> float:
        return self.predicted / self.measurement.seconds_per_step - 1.0


def prediction_errors(model: CostModel, measurements: Iterable[Measurement]) -> list[ErrorRow]:
    """The model's prediction for each measured point (with its run's compute share)."""
    return [
        ErrorRow(m, model.predict(m.spec, m.world_size, m.rate_bps, m.compute_share).total)
        for m in measurements
    ]


def error_summary(rows: Sequence[ErrorRow]) -> dict[str, float]:
    """Median and largest ``|relative error|`` (and the count) of ``rows``."""
    errs = [abs(r.rel_error) for r in rows if math.isfinite(r.rel_error)]
    if not errs:
        return {"n": 0, "median_abs_rel_error": math.nan, "max_abs_rel_error": math.nan}
    return {
        "n": len(errs),
        "median_abs_rel_error": statistics.median(errs),
        "max_abs_rel_error": max(errs),
    }


# --------------------------------------------------------------------------- the report

#: Link rates of the prediction grid (bit/s): 0.1, 1, 10 and 100 Gbit/s.
PREDICTION_RATES: tuple[int, ...] = (10**8, 10**9, 10**10, 10**11)
#: Worker counts of the prediction grid: 2, 4, ..., 1024.
PREDICTION_WORKERS: tuple[int, ...] = tuple(2**i for i in range(1, 11))
#: Vector lengths of the prediction table (the plot uses a finer grid).
PREDICTION_DS: tuple[int, ...] = (10**6, 10**7, 10**8, 10**9)


def model_report(
    calibrate_dirs: Sequence[str | Path],
    check_dirs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    methods: Sequence[str] | None = None,
    density: float | None = None,
    d: int = 10**8,
    workers: int = 64,
    rates: Sequence[int] = PREDICTION_RATES,
    fit_alpha: bool = False,
    overrides: Mapping[str, float] | None = None,
    echo=print,
) -> dict[str, Any]:
    """Calibrate (or take the defaults), report errors, predict, and write tables and plots.

    Writes ``out_dir/model.json`` (parameters, per-point errors, predictions), ``tables.txt``,
    ``model_vs_workers.png`` (time vs P at ``d``, one panel per rate), ``model_vs_d.png``
    (time vs d at ``workers``) and, with measured points, ``model_fit.png``.

    Args:
        calibrate_dirs: ``bench comm`` output directories to fit on (may be empty).
        check_dirs: further directories to report the error on, not fitted.
        out_dir: where to write.
        methods: methods to predict (default: those measured, else all).
        density: density of the predictions (default: the calibration runs', else 0.001).
        d: vector length of the time-vs-P predictions.
        workers: P of the time-vs-d predictions.
        rates: link rates (bit/s) of the predictions.
        fit_alpha: fit alpha rather than take the runs' latency probes (see :func:`calibrate`).
        overrides: values of ``alpha``, ``beta0`` or ``eta`` to use instead of the fitted
            ones, for what-if predictions (e.g. a 20 us network: ``{"alpha": 2e-5}``);
            the errors on measured points are those of the calibrated model.
        echo: where the tables go.

    Raises:
        ValueError: an unknown or non-positive override.

    Returns:
        The content of model.json.
    """
    from gssgd.bench import report

    bad = {k: v for k, v in (overrides or {}).items() if k not in ("alpha", "beta0", "eta")}
    if bad or any(not v > 0 for v in (overrides or {}).values() if v is not None):
        raise ValueError(
            f"overrides {dict(overrides or {})} must set alpha, beta0 or eta to numbers > 0"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    calib = [m for directory in calibrate_dirs for m in load_measurements(directory)]
    check = [m for directory in check_dirs for m in load_measurements(directory)]
    if calib:
        model = calibrate(calib, fit_alpha=fit_alpha)
        head = f"cost model {model.source}"
    else:
        model = CostModel.default()
        head = (
            "cost model: documented defaults (no calibration data; pass --calibrate DIR "
            "with directories written by `gssgd bench comm`)"
        )
    lines = [
        head,
        f"  alpha = {model.alpha * 1e6:.1f} us per round (latency-bound message)",
        f"  beta  = max({model.beta0 * 1e9:.3g} ns/B (software, per core), "
        f"8 / ({model.eta:.3g} x rate) (wire)) per byte",
        "  gamma = "
        + ", ".join(f"{k} {v * 1e9:.3g}" for k, v in model.gamma.items())
        + " ns per element",
        *(f"  note: {n}" for n in model.notes),
    ]
    sections = ["\n".join(lines)]
    result: dict[str, Any] = {"model": model.as_dict()}
    for label, points in (("calibration", calib), ("check", check)):
        if not points:
            continue
        rows = prediction_errors(model, points)
        summary = error_summary(rows)
        title = (
            f"relative error on the {len(rows)} {label} points (predicted / measured - 1): "
            f"median |err| {summary['median_abs_rel_error']:.0%}, "
            f"max |err| {summary['max_abs_rel_error']:.0%}"
        )
        sections.append(report.error_table(rows, title))
        result[f"{label}_errors"] = [
            {
                "run": r.measurement.source,
                "workers": r.measurement.world_size,
                "link_bps": r.measurement.rate_bps,
                "method": r.measurement.spec.name,
                "d": r.measurement.spec.d,
                "measured": r.measurement.seconds_per_step,
                "predicted": r.predicted,
                "rel_error": r.rel_error,
            }
            for r in rows
        ]
        result[f"{label}_summary"] = summary
    if calib or check:
        report.plot_fit(
            prediction_errors(model, calib),
            out / "model_fit.png",
            "cost model: predicted vs measured",
            check=prediction_errors(model, check),
        )
    given = {k: float(v) for k, v in (overrides or {}).items() if v is not None}
    if given:
        model = dataclasses.replace(model, **given)
        text = ", ".join(f"{k}={v:g}" for k, v in given.items())
        sections.append(f"the predictions below use {text} (given, not calibrated)")
        result["predictions_model"] = model.as_dict()

    seen = list(dict.fromkeys(m.spec.name for m in calib + check))
    names = list(methods or seen or DEFAULT_METHODS)
    sparse = [m.spec for m in calib + check if m.spec.aggregator != "dense"]
    sketches = [s for s in sparse if s.rows]
    if density is None:
        density = sparse[0].k / sparse[0].d if sparse else 0.001
    rows_ = sketches[0].rows if sketches else DEFAULT_ROWS

    def spec_of(name: str, dd: int) -> MethodSpec:
        return method_spec(name, dd, density, rows=rows_)

    fine_ds = [int(10 ** (e / 2)) for e in range(10, 19)]  # 1e5 .. 1e9
    vs_p: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    vs_d: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    predictions: dict[str, Any] = {"d": d, "workers": workers, "density": density}
    for rate in rates:
        label = f"{report.fmt_rate(rate)}/s links"
        vs_p[label] = {
            n: (
                list(PREDICTION_WORKERS),
                [model.predict(spec_of(n, d), p, rate).total for p in PREDICTION_WORKERS],
            )
            for n in names
        }
        vs_d[label] = {
            n: (fine_ds, [model.predict(spec_of(n, dd), workers, rate).total for dd in fine_ds])
            for n in names
        }
        cell_p = {(p, n): model.predict(spec_of(n, d), p, rate).total
                  for p in PREDICTION_WORKERS for n in names}  # fmt: skip
        cell_d = {(dd, n): model.predict(spec_of(n, dd), workers, rate).total
                  for dd in PREDICTION_DS for n in names}  # fmt: skip
        sections.append(
            report.grid_table(
                f"predicted seconds per step at {report.fmt_rate(rate)}/s, d={d:.0e}, "
                f"density {density:g}, a core per worker",
                "P",
                PREDICTION_WORKERS,
                names,
                cell_p,
            )
        )
        sections.append(
            report.grid_table(
                f"predicted seconds per step at {report.fmt_rate(rate)}/s, P={workers}, "
                f"density {density:g}, a core per worker",
                "d",
                PREDICTION_DS,
                names,
                cell_d,
                row_format=lambda v: f"{v:.0e}",
            )
        )
        predictions[str(rate)] = {
            "vs_workers": {n: dict(zip(map(str, PREDICTION_WORKERS), vs_p[label][n][1],
                                       strict=True)) for n in names},
            "vs_d": {n: {str(dd): cell_d[(dd, n)] for dd in PREDICTION_DS} for n in names},
        }  # fmt: skip
    report.plot_lines(
        out / "model_vs_workers.png",
        vs_p,
        "workers P",
        f"cost model: seconds per step vs P (d={d:.0e}, density {density:g}; {model.source})",
        base_x=2,
    )
    report.plot_lines(
        out / "model_vs_d.png",
        vs_d,
        "gradient length d",
        f"cost model: seconds per step vs d (P={workers}, density {density:g}; {model.source})",
    )
    result["predictions"] = predictions
    text = "\n\n".join(sections)
    (out / "tables.txt").write_text(text + "\n")
    (out / "model.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    echo(text)
    echo(f"wrote {out / 'model.json'}, {out / 'tables.txt'} and the plots in {out}")
    return result
