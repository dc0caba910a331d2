"""Whether a run reached dense's target: the one rule every judge uses.

``gssgd study`` (its rankings and verdicts), ``gssgd compare`` (bytes to the target),
advise's evidence (a study's rows) and the lab's benchmarks (time to accuracy) all ask a
:class:`Metric`: test accuracy within half a point of dense's (:data:`ACCURACY`), or test
loss within 3 % of dense's (:data:`LOSS`), or the same rule at a study's own margin.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ACCURACY", "LOSS", "Metric"]


@dataclass(frozen=True)
class Metric:
    """What a study judges runs on, and how close to dense counts as reaching it.

    ``key`` names the field: ``final_test_<key>`` in summary.json, ``test_<key>`` in
    metrics.jsonl. An accuracy reaches dense within ``margin`` points below dense's (0.005:
    half a point); a loss within ``margin`` as a fraction above dense's (0.03: 3 %).
    """

    key: str  # "accuracy" or "loss"
    higher_is_better: bool
    margin: float
    #: evaluations a run's end value averages over (:func:`gssgd.study.curves.reach_and_stay`; 1: the last)
    window: int = 1

    def at_least_as_good(self, a: float, b: float) -> bool:
        """Whether ``a`` is at least as good as ``b``."""
        return a >= b if self.higher_is_better else a <= b

    def target(self, dense: float) -> float:
        """The value that reaches dense: ``dense - margin`` (accuracy) or
        ``dense * (1 + margin)`` (loss)."""
        return dense - self.margin if self.higher_is_better else dense * (1 + self.margin)

    def reaches(self, value: float, dense: float) -> bool:
        """Whether ``value`` is at least as good as :meth:`target` of ``dense``."""
        return self.at_least_as_good(value, self.target(dense))

    def best(self, values: Iterable[float]) -> float:
        """The best of ``values``."""
        return max(values) if self.higher_is_better else min(values)

    def number(self, value: float) -> str:
        """``value`` as a table shows it: accuracy in % to 2 decimals, loss to 4."""
        return f"{100 * value:.2f}" if self.key == "accuracy" else f"{value:.4f}"

    def show(self, value: float) -> str:
        """:meth:`number` with its unit (`` %`` for accuracy)."""
        return self.number(value) + (" %" if self.key == "accuracy" else "")

    def gap(self, value: float, other: float) -> float:
        """``value`` against ``other``: points of accuracy, or % of ``other``'s loss."""
        return 100 * (value - other) if self.key == "accuracy" else 100 * (value / other - 1)


#: Test accuracy; dense - 0.5 point reaches dense.
ACCURACY = Metric("accuracy", True, 0.005)
#: Test loss; dense + 3 % reaches dense.
LOSS = Metric("loss", False, 0.03)
