"""A cost model of one aggregation step: latency, bandwidth and compute, per method.

Every method's step costs this rank (Hockney's alpha-beta model plus a compute term)::

    T(method, P, d, link) = alpha * rounds                      # latency-bound messages
                          + beta(link) * header_bytes           # gloo's preambles on it
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
* ``header_bytes``: gloo's 48-byte preambles (:data:`gssgd.comm.HEADER_BYTES`, measured:
  tests/comm/test_wire_bytes.py) that cross the busiest link, summed over the phases like the
  payload: a message carries two with it and sends one back (its receiver's ready note), so
  a link carries ``2s + r`` of them for ``s`` messages out and ``r`` in
  (``Traffic.critical_headers``). Per message they cost like latency; at many workers they
  can outweigh a small collective's payload. Reported in the latency part of a prediction.
* ``beta(rate) = max(beta0, 8 / (eta * rate))`` seconds per byte: a stream moves at the
  pace of its slower stage. ``beta0`` is the software cost of moving a byte through the
  stack and the collective (fitted on loopback runs, where there is no wire), the second term
  the wire time at ``eta`` times the nominal rate (``eta`` < 1: TCP/IP and Ethernet
  headers, ACKs, tbf granularity). An unlimited link (``rate=None``) is ``beta0``.
* ``gamma[method]``: compute per gradient element (sketching, top-k selection, recovery,
  error feedback, the non-finite guard), from the benchmark's ``seconds_compress +
  seconds_decompress + seconds_other`` on the critical path's rank.

The byte figures per rank (:func:`traffic`) are the ones :mod:`gssgd.comm` records in
``agg.last_stats`` on every step after the first (the first step adds the rank-agreement
check): what each rank's process puts on the wire, control messages and forwarded data
included. Every method's step starts with gloo's ring all-gather of a 4-byte non-finite
flag, ``(P-1) * 4`` bytes each way (not in the table). ``I`` is the index size (4 bytes when
``d < 2^31``, else 8), ``V`` the value size (4, or 2 for a 16-bit dense payload),
``S = rows * cols * T`` a sketch table (``T`` = 4, or 2 for 16-bit tables),
``C = min(m * k, d)`` the candidates, ``P2`` the largest power of two ``<= P`` and
``L = log2 P2``:

=============  =====================================  =========================================
method         per rank (sent / received)             critical bytes (busiest link)
=============  =====================================  =========================================
dense(16)      ring ``2(P-1)/P * d*V`` each way [#]_  ``2(P-1)/P * d*V``
topk           ``(P-1) k(I+V)`` each way [#]_          ``(P-1) k(I+V)`` (all-gather)
gtopk          ``L k(I+V)`` each way (+fold-in)        ``(L [+2]) k(I+V)`` (recursive doubling)
sketched       worker ``S + C*V`` / ``C*I + k(I+V)``   ``(P-1)(S + C*I + C*V + k(I+V))``: the
               server ``(P-1)`` times the reverse     server's link, phase after phase
gs             ``L (S + C*V)`` each way (+fold-in)     ``(L [+2]) (S + C*V)``; no indices
gs-backend     ring of ``S`` and of ``C*V``            ``2(P-1)/P (S + C*V)``
gs-estimate    as gs without ``C*V``                   ``(L [+2]) S``
gs-small       as gs with a quarter of the columns     as gs
gs-half        as gs, table entries in 16 bits        as gs
=============  =====================================  =========================================

.. [#] On average over the ranks: gloo cuts the buffer into segments, and each rank sends
   all but two blocks of them (:func:`gssgd.comm.ring_allreduce`), a few bytes more or less.
.. [#] gloo's ring all-gather: a rank sends its own ``k(I+V)`` and forwards ``P-2`` others'.

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

This package is the cost model, apart from the benchmarks that measure (``gssgd.bench``,
which imports it, never the reverse). Its modules, lowest first: :mod:`.link_rate` (link
rates and their tbf shape, shared with the emulation), :mod:`.store` (the measured data
files under ``data/``), :mod:`.compute_law`, :mod:`.method_specs` (which method, what it
sends), :mod:`.architectures` (layer shapes), :mod:`.network` (patterns, rounds and a
network's constants), :mod:`.predict` (the three-constant model of ``gssgd bench model``),
:mod:`.fit` (the measurements and that fit), :mod:`.devices`, :mod:`.cluster` (the step
model itself), :mod:`.check` (its fit on this machine's emulated links and held-out check),
:mod:`.evidence` (each method's measured steps to the target) and :mod:`.advice`
(``gssgd advise``). The names below
are those of ``method_specs``, ``predict`` and ``fit``; ``gssgd bench model``'s tables and
plots are :mod:`gssgd.bench.model_report`.
"""

from __future__ import annotations

from gssgd.comm import Traffic
from gssgd.costmodel.fit import (
    ErrorRow,
    Measurement,
    calibrate,
    error_summary,
    load_measurements,
    prediction_errors,
)
from gssgd.costmodel.fit import (
    _nnls as _nnls,  # not public: the tests reach the fit's solver here
)
from gssgd.costmodel.method_specs import DEFAULT_METHODS, VARIANTS, MethodSpec, method_spec, traffic
from gssgd.costmodel.predict import CostModel, Prediction

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
    "prediction_errors",
    "traffic",
]
