"""gs-SGD: global-sketching SGD (Dai, Diao, Li, Xu; arXiv 2108.06004).

No parameter server: since a Count Sketch is linear, summing the workers' sketch tables with
an all-reduce yields the sketch of the global accumulated gradient on every rank.

Steps (per rank p, each step):
    1. Accumulate: ``a_p = e_p + u_p``.
    2. Compress: Count-Sketch ``a_p`` with hashes every rank derives from the same seed
       (with ``prefilter`` f: only this rank's ``f * k`` largest coordinates of it).
    3. Communicate: all-reduce the tables, no indices (by default the backend's ring, in
       float16; or recursive doubling: log2(P) rounds of rows*cols numbers). ``P`` more
       values ride at the end: the ranks' non-finite flags, so when a gradient is not
       finite on any rank every rank skips the step here (its ``nonfinite`` policy; on a
       step that reuses its candidates, with the exact round's values).
    4. Recover: every rank takes the same top ``m*k`` candidates by |estimate| from the
       summed sketch (ties by lower index), in the canonical order of increasing index.
    5. Exact round (``exact=True``): all-reduce ``a_p`` at the candidates (m*k numbers, no
       indices: every rank knows them and their order), keep the top k of the exact sums
       (ties by lower index). Estimate mode
       (``exact=False``): keep the sketch's top k and their estimates (one round).
       With ``reuse`` R > 1, only every R-th step (after any density warm-up) runs steps
       2-4; the steps between run step 5 at the last sketched step's candidates (Ok-Topk's
       reuse of a selection across steps). With ``chunk`` C, steps 4 and 5 select by chunk
       of C coordinates, each chunk its share of the m*k and of the k
       (:mod:`gssgd.selection`, as DeMo and SparseLoCo select).
    6. Update: the k values / P. Error feedback: ``e_p = a_p`` with those k coordinates
       zeroed on every rank.

With ``feedback="fetchsgd"`` the ranks sketch their plain gradients and keep no residual;
steps 4-6 become FetchSGD's momentum and error accumulation on the summed table, alike on
every rank (:mod:`gssgd.aggregators.feedback`): one all-reduce of the tables per
step, and no guard audits (no rank holds the global accumulated vector to audit against).

Communication per rank is ``O((rows*cols + m*k) * log P)``, independent of ``d``.

Tuning: ``cols`` sets the recovery noise (about ``||a|| / sqrt(cols)``); ``candidates`` m
lets the exact round repair the sketch's mistakes at the price of m*k numbers per round.
``last_stats.delivered_fraction`` reports the share of the accumulated mass (squared l2,
from the sketch's norm estimate) that each step delivered; the ``guard`` option watches it
and grows the sketch (or stops with a clear message) when it collapses to what random
coordinates would deliver, instead of letting training silently diverge.

The collapse guard (:class:`CollapseGuard`, the ``guard`` option) follows the aggregator
in this module.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from gssgd.aggregators.base import index_dtype
from gssgd.aggregators.sketching import SketchedOptions, SketchingAggregator
from gssgd.comm import Traffic, allgather, halving_doubling, recursive_doubling, ring_allreduce
from gssgd.selection import grouped_topk_indices, shares, topk_indices
from gssgd.validate import bad_value, is_int

__all__ = [
    "ALLREDUCES",
    "AUDITS",
    "AUDIT_POOL",
    "AUDIT_SHARE",
    "CollapseGuard",
    "GSOptions",
    "GlobalSketchSGD",
    "SketchCollapseError",
    "audit_interval",
    "audit_pool",
    "audit_traffic",
]


log = logging.getLogger(__name__)
#: The worker counts at which this process said gs sends more than a rival (said once).
_SAID_COSTLIER: set[int] = set()

#: How often guard="grow" doubles the sketch before a further collapse stops the run.
MAX_GROWS = 2

__all__ = ["ALLREDUCES", "GSOptions", "GlobalSketchSGD"]


#: How gs can sum its tables and exact values (``GSOptions.allreduce``).
ALLREDUCES = ("recursive_doubling", "backend", "halving_doubling")


@dataclass(frozen=True)
class GSOptions(SketchedOptions):
    """gs-SGD options on top of the sketch options.

    Attributes:
        exact: fetch the exact sums of the candidates in a second all-reduce (True), or
            use the sketch's estimates (False, one round; mass is not conserved).
        allreduce: how the sketch tables are summed: "recursive_doubling", "backend" (the
            backend's ring) or "halving_doubling" (a reduce-scatter by recursive halving and
            an all-gather by recursive doubling: the ring's bytes in 2 log2 P rounds);
            None: by the number of workers (:func:`~gssgd.aggregators.sketching.sketch_default_shape`).
        guard: what to do when an audit finds the sketch collapsed (see
            :class:`CollapseGuard`; audits come at step 20, then spaced to add at
            most 5 % of gs's bytes, every 200 steps or more): "grow"
            doubles ``cols`` and the ``m*k`` candidates (every
            rank alike, at most twice, up to ``d / (2 * rows)`` columns and ``d / 8``
            candidates) and raises :class:`~gssgd.aggregators.gs.SketchCollapseError` on
            a further collapse; "raise" raises it at once, with a message saying what to
            change; "off" never audits.
        audit: how an audit finds the mass exact global top-k would deliver
            (:class:`CollapseGuard`): "tops" (default) fetches the exact global
            values of the union of every rank's largest coordinates, a pool of about
            :data:`~gssgd.aggregators.gs.AUDIT_POOL` times k (a few per cent of a dense
            all-reduce at low density; it estimates the best mass from below, so the
            recall from above); "dense" all-reduces the whole vector (exact, the cost of a
            dense step); "both" runs the two, decides on the dense one and logs both
            recalls (to compare them).
        reuse: R >= 1: sketch only every R-th step after any density warm-up; the R - 1
            steps between skip the table all-reduce and fetch the exact sums at the last
            sketched step's ``m*k`` candidates (the same on every rank, so still no
            indices), keeping the top k of them. Ok-Topk (Li & Hoefler, PPoPP 2022) reuses
            its selection threshold across steps the same way: the heavy coordinates of an
            error-fed gradient drift slowly, and what falls outside the kept set waits in
            the residual for the next sketch. 1 (default): sketch every step. Needs the
            exact round (``exact=True``). A sketch the guard has grown, or a step with no
            kept set, sketches. The collapse guard audits and counts sketching steps only.
        chunk: C >= 1: select by chunk of C consecutive coordinates, as DeMo and SparseLoCo
            do (:mod:`gssgd.selection`): the m*k candidates are shared out over
            the chunks in proportion to their lengths, the k delivered in proportion to the
            candidates each holds, and each chunk takes its largest; the guard then
            measures against the exact vector's top k chosen the same way. At most k
            chunks (C >= ceil(d / k)): with more, the lower chunks would take every share
            and the rest never move. 0 (default): one selection over the whole vector.
            Needs the exact round.

    ``allreduce`` left None takes
    :func:`~gssgd.aggregators.sketching.sketch_default_shape`'s value too.
    """

    exact: bool = True
    allreduce: str | None = None
    guard: str = "grow"
    audit: str = "tops"
    reuse: int = 1
    chunk: int = 0
    shape_fields: ClassVar[tuple[str, ...]] = SketchedOptions.shape_fields + ("allreduce",)

    def resolved(self, d: int, k: int, world_size: int | None = None) -> GSOptions:
        """:meth:`SketchedOptions.resolved`, and ``chunk`` checked against ``d`` and ``k``.

        Raises:
            ValueError: more chunks than k (each must get a share of every step's k).
        """
        chunks = -(-d // self.chunk) if self.chunk else 0
        if chunks > k:
            raise bad_value("chunk", self.chunk,
                            f"it cuts d={d} into {chunks} chunks, more than the k={k} coordinates "
                            "a step delivers, so the lower chunks would take every share and the "
                            "rest would never move",
                            f"Use chunk >= ceil(d / k) = {-(-d // k)}, or a higher density.")
        return super().resolved(d, k, world_size)  # type: ignore[return-value]

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.exact, bool):
            raise bad_value("exact", self.exact, "it must be True or False", "Use exact=True.")
        if self.allreduce not in (None, *ALLREDUCES):
            raise bad_value(
                "allreduce",
                self.allreduce,
                f"it must be one of {', '.join(ALLREDUCES)}",
                "Use 'backend' for a bandwidth-optimal ring at large P.",
            )
        if self.audit not in AUDITS:
            raise bad_value("audit", self.audit, f"it must be one of {', '.join(AUDITS)}",
                            "Use 'tops' (a few per cent of a dense all-reduce) or 'dense'.")
        if self.guard not in ("grow", "raise", "off"):
            raise bad_value("guard", self.guard, "it must be 'grow', 'raise' or 'off'",
                            "Use 'grow'.")
        if not is_int(self.reuse) or self.reuse < 1:
            raise bad_value("reuse", self.reuse,
                            "it must be an integer >= 1 (1: sketch every step; R: every R-th)",
                            "Use reuse=1, or for example reuse=2 to sketch every other step.")
        if self.reuse > 1 and not self.exact:
            raise bad_value("reuse", self.reuse,
                            "reusing the candidate set needs the exact round, which exact=False "
                            "turns off", "Use exact=True with reuse > 1, or reuse=1.")
        if not is_int(self.chunk) or self.chunk < 0:
            raise bad_value("chunk", self.chunk,
                            "it must be an integer >= 0 (0: one selection over the whole vector; "
                            "C: by chunk of C coordinates)",
                            "For example chunk=4096 (SparseLoCo's).")
        if self.chunk and not self.exact:
            raise bad_value("chunk", self.chunk,
                            "selecting by chunk needs the exact round, which exact=False turns off",
                            "Use exact=True with chunk, or chunk=0.")
        if self.feedback == "fetchsgd" and self.exact:
            raise bad_value("exact", self.exact,
                            "feedback='fetchsgd' keeps the error in sketch space and has no exact "
                            "round", "Pass exact=False (--no-exact) with feedback='fetchsgd'.")


class GlobalSketchSGD(SketchingAggregator):
    """gs-SGD: all-reduced Count Sketches, shared heavy-hitter recovery, exact top-k."""

    name = "gs"
    flags_ride = True
    Options = GSOptions
    options: GSOptions

    @classmethod
    def message_traffic(
        cls, d: int, k: int, options: GSOptions, world_size: int, *, step: int | None = None
    ) -> Traffic:
        """The table all-reduce (``rows * cols`` entries of ``table_dtype``), then, with
        ``exact``, the all-reduce of the ``m * k`` candidates' values; no indices. Either
        by recursive doubling or, with ``allreduce="backend"``, the ring, or with
        ``"halving_doubling"`` recursive halving and doubling. A warm-up step
        uses its own k and larger sketch. The collapse guard's audits (at step 20, then
        every 200 steps or more: :func:`~gssgd.aggregators.gs.audit_traffic` and
        :func:`~gssgd.aggregators.gs.audit_interval`) and its growing the sketch are
        left out."""
        cols, candidates = options.shape_at(d, k, cls.k_at_step(d, k, options, step))
        return cls._message(options, cols, candidates, world_size,
                            table=cls.sketches_at(options, step))

    @staticmethod
    def sketches_at(options: GSOptions, step: int | None) -> bool:
        """Whether aggregation step ``step`` sketches (True) or reuses the last sketched
        step's candidates (``reuse`` > 1): every step of a density warm-up and every
        ``reuse``-th step after it sketch; ``step=None`` (the steady state) is a sketching
        step."""
        if options.reuse == 1 or step is None:
            return True
        steady = step - options.warmup_steps
        return steady < 0 or steady % options.reuse == 0

    @staticmethod
    def _message(options: GSOptions, cols: int, candidates: int, world_size: int,
                 table: bool = True) -> Traffic:
        """The table all-reduce of ``cols`` columns (unless ``table`` is False: a step that
        reuses its candidates) and, with ``exact``, the one of the ``candidates`` values;
        the first of them carries the ranks' ``P`` non-finite flags."""
        def reduce(n: int, itemsize: int) -> Traffic:
            if options.allreduce == "backend":
                return ring_allreduce(n * itemsize, world_size, itemsize)
            if options.allreduce == "halving_doubling":
                return halving_doubling(n * itemsize, world_size, itemsize)
            return recursive_doubling(n * itemsize, world_size)

        out, flags = Traffic.none(world_size), world_size
        if table:
            out = out + reduce(options.rows * cols + flags, options.table_dtype.itemsize)
            flags = 0
        if options.exact:
            out = out + reduce(candidates + flags, 4)
        return out

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.guard = CollapseGuard()
        self.grows = 0
        self._audit_recall: float | None = None  # this step's audit (last_stats reports it)
        #: the last audit's recall by audit kind ("dense", "tops"; both with audit="both")
        self.audit_recalls: dict[str, float] = {}
        super().__init__(*args, **kwargs)
        cheaper = self.cheaper_rivals(self.d, self.k, self.options, self.world_size)
        if cheaper and self.rank == 0 and self.world_size not in _SAID_COSTLIER:
            _SAID_COSTLIER.add(self.world_size)  # once a process: not once per DDP bucket
            mine = max(self.traffic(self.d, self.k, self.options, self.world_size).sent)
            name, sent = min(cheaper.items(), key=lambda item: item[1])
            log.warning(
                "gs-SGD at %d workers sends %s bytes a step (its sketch and exact round); "
                "method %r sends %s at the same density (%.1fx fewer): below the crossover "
                "worker count an all-gather of k costs less than a sketch (docs/sizing.md). "
                "Use method=%r, or gs from more workers.",
                self.world_size, f"{mine:,}", name, f"{sent:,}", mine / max(sent, 1), name)

    @classmethod
    def cheaper_rivals(cls, d: int, k: int, options: GSOptions, world_size: int
                       ) -> dict[str, int]:
        """The methods whose steady step sends fewer bytes from the busiest rank than gs's
        at ``world_size`` workers and this k: local Top-k's all-gather and dense's
        all-reduce, each by its own traffic formula (empty where gs sends the least)."""
        from gssgd.aggregators.dense import DenseAllReduce
        from gssgd.aggregators.topk import LocalTopk

        mine = max(cls.traffic(d, k, options, world_size).sent)
        rivals = {rival.name: max(rival.traffic(d, d if rival.sends_all else k, rival.Options(),
                                                world_size).sent)
                  for rival in (LocalTopk, DenseAllReduce)}
        return {name: sent for name, sent in rivals.items() if sent < mine}

    def _build_sketch(self, cols: int) -> None:
        """A sketch of ``cols`` columns, and the guard's later audits spaced for its bytes;
        a kept candidate set (``reuse``) of the old size is dropped."""
        super()._build_sketch(cols)
        self.kept_candidates: torch.Tensor | None = None
        step = self._message(self.options, cols, self.num_candidates, self.world_size)
        audit = audit_traffic(self.options.audit, self.d, self.k, self.world_size)
        self.guard.audit_every = audit_interval(max(audit.sent), max(step.sent))

    @property
    def max_cols(self) -> int:
        """Past ``d / (2 * rows)`` columns the sketch would cost half of dense: stop growing."""
        return max(self.options.cols, self.d // (2 * self.options.rows))

    @property
    def max_candidates(self) -> int:
        """Past ``d / 8`` candidates the exact round would cost a quarter of dense: stop there."""
        return max(self.options.num_candidates(self.k, self.d), self.d // 8)

    def _on_collapse(self, recall: float) -> None:
        """Grow the sketch, or raise, when an audit finds a collapse (all ranks alike)."""
        what = (
            f"gs-SGD's sketch collapsed at aggregation step {self.steps}: its update delivered "
            f"{recall:.1%} of the mass that exact global top-k would have (below "
            f"{self.guard.min_recall:.0%}; rows={self.options.rows}, cols={self.cols}, "
            f"m*k={self.num_candidates} candidates, k={self.k}, d={self.d})"
        )
        can_grow = self.cols < self.max_cols or self.num_candidates < self.max_candidates
        if self.options.guard == "grow" and can_grow and self.grows < MAX_GROWS:
            self.grows += 1
            new_cols = min(2 * self.cols, self.max_cols)
            self.num_candidates = min(2 * self.num_candidates, self.max_candidates)
            if self.rank == 0:
                log.warning(
                    "%s; growing the sketch to cols=%d and m*k to %d candidates.",
                    what,
                    new_cols,
                    self.num_candidates,
                )
            self._build_sketch(new_cols)
            self.guard.reset()
            return
        raise SketchCollapseError(
            f"{what}. Raise cols or candidates, raise the density, or use method 'topk'"
            + (
                f" (the sketch already grew {self.grows} times; growing late rarely rescues a"
                " run whose residuals are already polluted)."
                if self.options.guard == "grow"
                else "."
            )
        )

    def _allreduce(self, tensor: torch.Tensor, own: bool = False) -> torch.Tensor:
        """The sum over ranks of ``tensor`` by the options' all-reduce; ``own``: the tensor
        is this call's to overwrite (the backend sums in place; else it sums a copy)."""
        if self.options.allreduce == "backend":
            return self.comm.allreduce_backend(tensor if own else tensor.clone())
        if self.options.allreduce == "halving_doubling":
            return self.comm.allreduce_halving_doubling(tensor)
        return self.comm.allreduce_recursive_doubling(tensor)

    def _allreduce_flagged(self, values: torch.Tensor, bad: bool
                           ) -> tuple[torch.Tensor, list[int]]:
        """The sum over ranks of ``values`` with the ranks' non-finite flags riding at its
        end (:meth:`_flag_slots`, ``bad`` this rank's): the sum, shaped as ``values``, and
        the ranks whose gradient is not finite."""
        flat = values.reshape(-1)
        with self._timed("compress"):
            payload = torch.cat([flat, self._flag_slots(bad, flat.dtype, flat.device)])
        summed = self._allreduce(payload, own=True)  # a new tensor: no copy for the backend
        return summed[: flat.numel()].view_as(values), self._flags_of(summed)

    def _sum_tables(self, table: torch.Tensor, bad: bool) -> tuple[torch.Tensor, list[int]]:
        """The sum over ranks of the sketch tables, sent as ``options.table_dtype``, and the
        ranks whose gradient is not finite (their flags ride with the tables)."""
        summed, bad_ranks = self._allreduce_flagged(self._table_payload(table), bad)
        if summed.dtype == table.dtype:
            return summed, bad_ranks
        with self._timed("decompress"):
            return self._widened(summed, table.dtype), bad_ranks

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        if self._sends_dense_now():  # a warm-up step that would cost more than dense
            return self._dense_warmup_step(grad)
        accumulated, bad = self._begin_riding(grad)
        k = self.step_k  # k, or more during a density warm-up
        fetch = self.feedback.tables  # FetchSGD's tables in sketch space, or None
        kept = self.kept_candidates
        if kept is not None and k == self.k and not self.sketches_at(self.options, self.steps):
            kept = kept.to(accumulated.device)  # reuse: no sketch, the exact round at ``kept``
            # the ranks' flags ride with the exact round, this step's only message
            exact, bad_ranks = self._allreduce_flagged(accumulated[kept], bad)
            skipped = self._guard(grad, bad_ranks)
            if skipped is not None:
                return skipped
            update, _ = self._recover_and_update(accumulated, None, k, kept.numel(), kept,
                                                 exact)
            return self._finish(update)
        with self._timed("compress"):
            sketch, num_candidates = self._sketch_of_step(accumulated)
            sketch.accumulate(self._prefiltered(accumulated, k))

        table, bad_ranks = self._sum_tables(sketch.table, bad)
        skipped = self._guard(grad, bad_ranks)
        if skipped is not None:
            return skipped
        summed = sketch.with_table(table)

        if fetch is not None:
            with self._timed("decompress"):
                chosen, values = fetch.recover(summed, k)
                update = torch.zeros_like(accumulated)
                update[chosen] = values / self.world_size
            return self._finish(update)
        update, delivered = self._recover_and_update(accumulated, summed, k, num_candidates)
        return self._finish(update, delivered_fraction=delivered)

    def _candidates(self, summed: Any, num_candidates: int) -> torch.Tensor:
        """The ``num_candidates`` heaviest coordinates of the summed sketch (with ``chunk``:
        each chunk's share of them), sorted by index: the set is the same on every rank and,
        sorted, so is its order (the exact round sends values only, matched by position)."""
        if self.options.chunk:
            return self._largest(summed.query().abs(), None, num_candidates)
        return summed.heavy_hitters(num_candidates, ordered=False)[0].sort().values

    def _largest(self, scores: torch.Tensor, coords: torch.Tensor | None, total: int
                 ) -> torch.Tensor:
        """Positions into ``scores`` of its ``total`` largest (ties: the lower position); with
        ``chunk`` C, each chunk of C coordinates takes its share of ``total``, in proportion
        to how many of ``coords`` it holds (:func:`~gssgd.selection.shares`: all
        d, its length), sorted.

        Args:
            scores: 1-D, one score per coordinate of ``coords``.
            coords: the coordinate (in [0, d)) of each score; None: all d.
            total: how many to select, at most ``scores.numel()``.
        """
        chunk = self.options.chunk
        if not chunk:
            return topk_indices(scores, total)
        if coords is None:
            coords = torch.arange(self.d, device=scores.device)
        groups = coords.to(torch.int64) // chunk
        sizes = torch.bincount(groups, minlength=-(-self.d // chunk))
        return grouped_topk_indices(scores, groups, shares(total, sizes))

    def _warmup_selection(self, total: torch.Tensor, k: int) -> torch.Tensor:
        """A warm-up step sent dense delivers the top ``k`` of the exact global sum (with
        ``chunk``: each chunk its share), what the sketch and exact round recover."""
        return self._largest(total.abs(), None, k)

    def _recover_and_update(
        self, accumulated: torch.Tensor, summed: Any, k: int, num_candidates: int,
        candidates: torch.Tensor | None = None, exact: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, float | None]:
        """Steps 4-6 on the all-reduced sketch: recover, fetch exact values, update, audit.

        Args:
            accumulated: this rank's error-compensated vector ``a_p`` (its chosen
                coordinates are zeroed here: the residual update).
            summed: the sketch of the global vector (a CountSketch, or any sketch with
                ``heavy_hitters`` and ``l2_estimate``, such as the streaming layout's); None
                on a step that reuses ``candidates``.
            k: coordinates to deliver this step; num_candidates: the m*k of the exact round.
            candidates: the kept candidate set of a reusing step (sorted by index); None:
                recover them from ``summed`` (and keep them when ``reuse`` > 1).
            exact: the exact round's sums at ``candidates`` where the step already has
                them (a reusing step's, sent with the flags); None: all-reduce them here.

        Returns:
            ``(update, delivered fraction)``: the dense update (the k values / P, in the
            residual's dtype) and the share of the sketch's estimated mass it delivered
            (None on a reusing step: it has no sketch to estimate the mass from).

        Raises:
            SketchCollapseError: an audit found a collapse and the guard may not grow.
        """
        # the guard audits and counts sketching steps only: a collapse is the sketch's
        sketching = candidates is None
        audit = self.options.guard != "off" and sketching and self.guard.due() and k == self.k
        # the exact global values to audit against, before the residual update zeroes
        # ``accumulated``: by audit, (coordinates or None for all d, values)
        pools = self._audit_pools(accumulated, k) if audit else {}

        if self.options.exact:
            if candidates is None:
                with self._timed("decompress"):
                    candidates = self._candidates(summed, num_candidates)
                if self.options.reuse > 1 and k == self.k:
                    self.kept_candidates = candidates
            if exact is None:
                exact = self._allreduce(accumulated[candidates])
            with self._timed("decompress"):
                keep = self._largest(exact.abs(), candidates, k)
                chosen, values = candidates[keep], exact[keep]
        else:
            with self._timed("decompress"):
                chosen, values = summed.heavy_hitters(k)

        with self._timed("decompress"):
            update = torch.zeros_like(accumulated)  # in the residual's dtype
            update[chosen] = values / self.world_size
            self.feedback.keep(accumulated, chosen)
            mass = float(values.double().pow(2).sum())
            total = summed.l2_estimate() ** 2 if summed is not None else None
            delivered = None if total is None else mass / total if total > 0 else 1.0
        if audit:
            self._judge_audit(pools, mass, k)
        if k == self.k and sketching:  # steady steps only (a warm-up step sends more)
            self.guard.advance()
        return update, delivered

    def _audit_pools(self, accumulated: torch.Tensor, k: int
                     ) -> dict[str, tuple[torch.Tensor | None, torch.Tensor]]:
        """The exact global values an audit compares the delivery with, by audit kind:
        "dense", the whole vector all-reduced (coordinates None); "tops", every rank's
        :func:`~gssgd.aggregators.gs.audit_pool` largest coordinates all-gathered, and
        the exact sums at their union (sorted, the same on every rank) all-reduced."""
        audit = self.options.audit
        kinds = (DENSE_AUDIT, TOPS_AUDIT) if audit == BOTH_AUDITS else (audit,)
        pools: dict[str, tuple[torch.Tensor | None, torch.Tensor]] = {}
        if DENSE_AUDIT in kinds:
            pools[DENSE_AUDIT] = (None, self.comm.allreduce_backend(accumulated.clone()))
        if TOPS_AUDIT in kinds:
            # with ``chunk``, each chunk's share of the pool, as the selection takes them
            own = self._largest(accumulated.abs(), None, audit_pool(self.d, k, self.world_size))
            everyone = self.comm.allgather_backend(own.to(index_dtype(self.d)))
            coords = torch.unique(torch.cat(everyone).to(torch.int64))  # sorted
            pools[TOPS_AUDIT] = (coords, self.comm.allreduce_backend(accumulated[coords].clone()))
        return pools

    def _best_of(self, values: torch.Tensor, coords: torch.Tensor | None, k: int
                 ) -> torch.Tensor:
        """Positions of the k largest ``|values|`` (of the coordinates ``coords``; None: all
        d), chosen as the selection chooses: with ``chunk``, each chunk its share of k by
        its length (a chunk the pool holds fewer of gives what it holds)."""
        chunk = self.options.chunk
        if coords is None or not chunk:  # all d: the selection's own rule
            return self._largest(values.abs(), coords, min(k, values.numel()))
        chunks = -(-self.d // chunk)
        lengths = torch.full((chunks,), chunk, dtype=torch.int64, device=values.device)
        lengths[-1] = self.d - chunk * (chunks - 1)
        return grouped_topk_indices(values.abs(), coords.to(torch.int64) // chunk,
                                    shares(k, lengths))

    def _judge_audit(self, pools: dict[str, tuple[torch.Tensor | None, torch.Tensor]],
                     mass: float, k: int) -> None:
        """The recall of the delivered ``mass`` against the best k of each pool (the dense
        one decides when there is one); grow or stop on a collapse."""
        recalls = {}
        for kind, (coords, values) in pools.items():
            best = values[self._best_of(values, coords, k)]
            best_mass = float(best.double().pow(2).sum())
            recalls[kind] = min(1.0, mass / best_mass) if best_mass > 0 else 1.0
        self.audit_recalls = recalls
        if len(recalls) > 1 and self.rank == 0:
            log.info("gs audit at aggregation step %d: %s", self.steps, ", ".join(
                f"{kind} recall {value:.4f}" for kind, value in recalls.items()))
        self._audit_recall = recalls.get("dense", recalls.get("tops"))
        if self.guard.collapsed(self._audit_recall):
            self._on_collapse(self._audit_recall)

    def _audit_of_step(self) -> float | None:
        recall, self._audit_recall = self._audit_recall, None
        return recall

    def agreement_fields(self) -> dict[str, Any]:
        return {**super().agreement_fields(), "cols": self.cols}

    def state_dict(self) -> dict[str, Any]:
        """Adds the current sketch width (the guard may have grown it), the guard, and the
        kept candidate set of ``reuse`` (None when there is none)."""
        return {
            **super().state_dict(),
            "cols": self.cols,
            "grows": self.grows,
            "num_candidates": self.num_candidates,
            "guard": self.guard.state_dict(),
            "kept_candidates": (None if self.kept_candidates is None
                                else self.kept_candidates.clone()),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        super().load_state_dict(sd)
        self.num_candidates = int(sd.get("num_candidates", self.num_candidates))
        self._build_sketch(int(sd.get("cols", self.cols)))  # and the audits for its bytes
        self.grows = int(sd.get("grows", 0))
        self.guard.load_state_dict(sd.get("guard", {}))
        kept = sd.get("kept_candidates")
        self.kept_candidates = None if kept is None else kept.clone()


#: What ``GSOptions.audit`` takes.
AUDITS: tuple[str, ...] = ("tops", "dense", "both")
TOPS_AUDIT, DENSE_AUDIT, BOTH_AUDITS = AUDITS
#: The "tops" audit's pool over all ranks, in multiples of k (at most ``d / 16``).
AUDIT_POOL = 16

#: The most of a method's own traffic that later audits may add, on average.
AUDIT_SHARE = 0.05
#: Later audits never come more often than this (compressed steps).
MIN_AUDIT_EVERY = 200


def audit_pool(d: int, k: int, world_size: int) -> int:
    """How many of its largest coordinates each rank puts in a "tops" audit's pool:
    ``ceil(min(AUDIT_POOL * k, d / 16) / P)``, at least 1."""
    pool = min(AUDIT_POOL * k, max(k, d // 16))
    return max(1, min(d, -(-pool // world_size)))


def audit_traffic(kind: str, d: int, k: int, world_size: int) -> Traffic:
    """What one audit moves (the most: a "tops" pool's union may be smaller): a dense
    all-reduce of d float32 values, or the all-gather of every rank's pool indices and the
    all-reduce of the values at their union; "both" moves the two."""
    dense = ring_allreduce(d * 4, world_size)
    share = audit_pool(d, k, world_size)
    tops = allgather(share * index_dtype(d).itemsize, world_size) + ring_allreduce(
        min(d, share * world_size) * 4, world_size)
    return {"dense": dense, "tops": tops, "both": dense + tops}[kind]


def audit_interval(audit_bytes: int, step_bytes: int) -> int:
    """Steps between later audits: the fewest that keep an audit's ``audit_bytes`` (a dense
    all-reduce) within :data:`AUDIT_SHARE` of ``step_bytes`` per step, and at least
    :data:`MIN_AUDIT_EVERY`.

    Example: the MNIST CNN (d = 80,602) at density 0.001 on 64 workers: an audit moves
    635 kB per rank (a ring all-reduce of 322 kB), gs's many-workers step 10.6 kB (its
    non-finite flags included), so later audits come every 1,196 steps.
    """
    if step_bytes <= 0:
        return MIN_AUDIT_EVERY
    return max(MIN_AUDIT_EVERY, math.ceil(audit_bytes / (AUDIT_SHARE * step_bytes)))


class SketchCollapseError(RuntimeError):
    """gs-SGD's sketch collapsed and the guard could not (or was told not to) repair it.

    Every rank raises it at the same step with the same message (the decision comes from
    all-reduced values), so a trainer can stop every worker together and report it once.
    """


@dataclass
class CollapseGuard:
    """When to audit, and what counts as a collapse.

    Attributes:
        min_recall: collapse when an audit finds a recall below this.
        first_audit: compressed steps before the first audit (after a start or a resize).
        audit_every: compressed steps between later audits.
        since_start: compressed steps since the start or the last resize.
        last_recall: the most recent audit's recall (None before the first).
    """

    min_recall: float = 0.1
    first_audit: int = 20
    audit_every: int = 200
    since_start: int = 0
    last_recall: float | None = None

    def due(self) -> bool:
        """Whether this step (the ``since_start``-th) is audited."""
        n = self.since_start
        return n == self.first_audit or (n > self.first_audit and n % self.audit_every == 0)

    def advance(self) -> None:
        self.since_start += 1

    def collapsed(self, recall: float) -> bool:
        """Record an audit's recall; True when the sketch has collapsed."""
        self.last_recall = recall
        return recall < self.min_recall

    def reset(self) -> None:
        """Start afresh after the sketch was resized."""
        self.since_start = 0

    def state_dict(self) -> dict[str, float | int | None]:
        return {"since_start": self.since_start, "last_recall": self.last_recall}

    def load_state_dict(self, sd: dict) -> None:
        self.since_start = int(sd.get("since_start", 0))
        self.last_recall = sd.get("last_recall")
