"""The benchmarks' report toolkit in one import: number formats, tables, plots and the
markdown splice.

Each piece lives in its own module; this one gathers them for scripts and studies:

* :mod:`gssgd.bench.formatting`: ``fmt_seconds``, ``fmt_bytes``, ``fmt_rate``;
* :mod:`gssgd.bench.markdown`: ``splice_markdown``;
* :mod:`gssgd.bench.comm_report`: ``comm_table``, ``plot_comm`` (``gssgd bench comm``);
* :mod:`gssgd.bench.train_report`: ``train_table``, ``train_progress_line``,
  ``plot_train`` (``gssgd bench train``);
* :mod:`gssgd.bench.model_charts`: ``grid_table``, ``error_table``, ``plot_lines``,
  ``plot_fit`` (``gssgd bench model``).
"""

from __future__ import annotations

from gssgd.bench.comm_report import comm_table, plot_comm
from gssgd.bench.formatting import fmt_bytes, fmt_rate, fmt_seconds
from gssgd.bench.markdown import splice_markdown
from gssgd.bench.model_charts import error_table, grid_table, plot_fit, plot_lines
from gssgd.bench.train_report import plot_train, train_progress_line, train_table

__all__ = [
    "comm_table",
    "error_table",
    "fmt_bytes",
    "fmt_rate",
    "fmt_seconds",
    "grid_table",
    "plot_comm",
    "plot_fit",
    "plot_lines",
    "plot_train",
    "splice_markdown",
    "train_progress_line",
    "train_table",
]
