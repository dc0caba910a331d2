"""Which part of gs's narrow shape costs the character LSTM, and what a small-P shape of
float16 columns, a pre-filter and the ring would cost each model: the table of
``bash studies/sizing/shapes.sh`` (runs under ``runs/sizing-shapes/P<P>/<model>-<shape>-s<seed>/``).

    .venv/bin/python studies/sizing/shapes_report.py runs/sizing-shapes > studies/sizing/results/shapes.md

Per worker count, model and shape (the seeds that ran): the final test value (CNN: accuracy,
LSTM: loss) and its distance from dense's (points; % above its loss), the busiest link's
bytes over the run and in the last (steady) step, the bytes to dense − 0.5 point on the
seeds' mean curve (CNN; the LSTM's shapes all end beyond dense + 3 %), and the guard's
audited recall (mean over a run's audits, for runs that audited every 20 steps:
``audit_trace.py``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gssgd.study.curves import ACCURACY, LOSS, Metric, curve_of, reach_on_mean_curve  # noqa: E402,I001
from gssgd.study.report import fmt_bytes  # noqa: E402
from studies._lib.report import markdown_table, read_metrics  # noqa: E402

#: Shapes in the order the table lists them, with what each is.
SHAPES = {
    "dense": "dense (the reference)",
    "default": "earlier default: 40·k float32, m = 32, recursive doubling",
    "narrow": "many-workers shape: 16·k float16, m = 8, ring",
    "narrow-m32": "16·k float16, m = 32, ring",
    "wide-m8": "40·k float32, m = 8, recursive doubling",
    "wide16-m8": "40·k float16, m = 8, ring",
    "wide16-m32": "default (since #48): 40·k float16, m = 32, ring",
}
#: Audits every 20 steps make a recall trace (a default run audits twice or so).
MIN_AUDITS = 10


#: The CNN's runs by dataset (MNIST, Fashion-MNIST): judged on accuracy, the rest on loss.
IMAGE = ("cnn", "fashion")


def _metric(model: str) -> Metric:
    """What a model's runs are judged on: the CNN's accuracy, the LSTM's loss."""
    return ACCURACY if model in IMAGE else LOSS


def _runs(root: Path) -> dict[tuple[int, str, str], list[list[dict]]]:
    """(P, model, shape) -> each seed's metrics records."""
    found: dict[tuple[int, str, str], list[list[dict]]] = {}
    for path in sorted(root.glob("P*/*-s*/metrics.jsonl")):
        if not (path.parent / "summary.json").is_file():
            continue  # still running
        name = path.parent.name.rsplit("-s", 1)[0]
        model, shape = name.split("-", 1)
        records = read_metrics(path)
        found.setdefault((int(path.parent.parent.name[1:]), model, shape), []).append(records)
    return found


def _value(model: str, v: float) -> str:
    """An accuracy in per cent, a loss as it is."""
    return f"{100 * v:.2f}" if model in IMAGE else f"{v:.4f}"


def _row(p: int, model: str, shape: str, seeds: list[list[dict]], dense: float | None
         ) -> list[str]:
    curves = [curve_of(r, _metric(model)) for r in seeds]
    finals = [c[-1][1] for c in curves]
    mean = statistics.mean(finals)
    if dense is None or shape == "dense":
        gap = "–"
    elif model in IMAGE:
        gap = f"{100 * (mean - dense):+.2f} pt"
    else:
        gap = f"{100 * (mean / dense - 1):+.1f} %"
    shown = (f"{_value(model, mean)}{' %' if model in IMAGE else ''} "
             f"({', '.join(_value(model, f) for f in finals)})")
    reach = "–"
    if model in IMAGE and dense is not None and shape != "dense":
        _, sent = reach_on_mean_curve(curves, ACCURACY, dense)  # dense - 0.5 point
        reach = "not reached" if sent is None else fmt_bytes(sent)
    recalls = [[r["audited_recall"] for r in rs if r.get("audited_recall") is not None]
               for rs in seeds]
    traced = [statistics.mean(r) for r in recalls if len(r) >= MIN_AUDITS]
    return [str(p), model, SHAPES.get(shape, shape), str(len(seeds)), shown, gap,
            fmt_bytes(statistics.mean(c[-1][2] for c in curves)),
            fmt_bytes(statistics.mean(rs[-1]["bytes_sent_max"] for rs in seeds)), reach,
            f"{statistics.mean(traced):.2f}" if traced else "–"]


def table(root: Path) -> str:
    """The study's markdown table."""
    runs = _runs(root)
    order = list(SHAPES)
    rows = []
    for (p, model, shape) in sorted(runs, key=lambda key: (
            key[0], key[1], order.index(key[2]) if key[2] in order else len(order))):
        dense = runs.get((p, model, "dense"))
        ref = None if dense is None else statistics.mean(
            curve_of(r, _metric(model))[-1][1] for r in dense)
        rows.append(_row(p, model, shape, runs[(p, model, shape)], ref))
    head = ["P", "model", "shape", "seeds", "final (seeds)", "vs dense", "run's bytes",
            "steady step", "to dense − 0.5 pt", "audited recall"]
    return markdown_table(head, rows)


def main(argv: list[str]) -> int:
    print(table(Path(argv[0] if argv else "runs/sizing-shapes")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
