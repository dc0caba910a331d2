"""The cost model of a training step: which method is fastest for a model, a cluster and a
link, and how sure that is.

One step model (:func:`gssgd.costmodel.cluster.predict_step`, described in
:mod:`gssgd.costmodel.cluster`)::

    step = fwd+bwd + compression + latency * rounds + driven * (s - 1) * driven_rounds
           + 8 * (bytes - burst * bucket * rounds) / (efficiency[pattern] * rate) - hidden

with each method's rounds, bytes and pattern from its own ``traffic`` formula, a device's
measured constants for the compute, and the network's constants fitted on this machine's
emulated links and checked there on held-out runs (:mod:`gssgd.costmodel.fit`, stored in
``data/fit.json`` by ``gssgd advise --calibrate``). ``gssgd advise`` predicts with it
(:mod:`gssgd.costmodel.advice`), ``gssgd study`` models its runs' time with it, and
``gssgd bench`` sizes its time limits by it (:func:`~gssgd.costmodel.fit.emulated_step_seconds`).

The byte figures per rank (:func:`traffic`) are the ones :mod:`gssgd.comm` records in
``agg.last_stats`` on every step after the first (the first step adds the rank-agreement
check): what each rank's process puts on the wire, control messages and forwarded data
included. Every built-in method's non-finite flags ride in its first message (not in the
table): ``P`` more values at the end of an all-reduced payload (dense, gs, PowerSGD), one
more index in local Top-k's list, ``ceil(P / 31)`` int32 of bits after gTop-k's and
Sketched-SGD's indices (``ceil(P / 63)`` int64 from ``d = 2^31``), one value after each
Sketched-SGD sketch; a method of your own that does not carry them starts its step with
gloo's ring all-gather of a 4-byte flag, ``(P-1) * 4`` bytes each way.
``I`` is the index size (4 bytes when ``d < 2^31``, else 8), ``V`` the value size (4, or 2 for a 16-bit dense payload),
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
gs             ring of ``S`` and of ``C*V`` (16-bit S)  ``2(P-1)/P (S + C*V)``; no indices
gs-rd          ``L (S + C*V)`` each way (+fold-in)     ``(L [+2]) (S + C*V)`` (float32 S)
gs-hd          as the ring, in ``2 L`` rounds (+2)      ``2(P-1)/P (S + C*V)``
gs-estimate    as gs without ``C*V``                   ``2(P-1)/P S``
gs-small       as gs with a quarter of the columns     as gs
=============  =====================================  =========================================

.. [#] On average over the ranks: gloo cuts the buffer into segments, and each rank sends
   all but two blocks of them (:func:`gssgd.comm.ring_allreduce`), a few bytes more or less.
.. [#] gloo's ring all-gather: a rank sends its own ``k(I+V)`` and forwards ``P-2`` others'.

Modules, lowest first: :mod:`.link_rate` (link rates and their tbf shape, shared with the
emulation), :mod:`.store` (the measured data files under ``data/``), :mod:`.compute_law`,
:mod:`.method_specs` (which method, what it sends), :mod:`.architectures` (layer shapes),
:mod:`.network` (patterns, rounds and a network's constants), :mod:`.devices`,
:mod:`.cluster` (the step model), :mod:`.fit` (the measurements, the fit and its held-out
check), :mod:`.evidence` (each method's measured steps to the target) and :mod:`.advice`
(``gssgd advise``). The names below are those of ``method_specs`` and ``fit``.

Example:
    >>> spec = method_spec("gs", d=10**8, density=0.001)
    >>> traffic(spec, world_size=64).rounds
    252
"""

from __future__ import annotations

from gssgd.comm import Traffic
from gssgd.costmodel.fit import (
    ErrorRow,
    Measurement,
    emulated_step_seconds,
    error_summary,
    load_measurements,
)
from gssgd.costmodel.method_specs import DEFAULT_METHODS, VARIANTS, MethodSpec, method_spec, traffic

__all__ = [
    "DEFAULT_METHODS",
    "VARIANTS",
    "ErrorRow",
    "Measurement",
    "MethodSpec",
    "Traffic",
    "emulated_step_seconds",
    "error_summary",
    "load_measurements",
    "method_spec",
    "traffic",
]
