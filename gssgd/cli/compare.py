"""``gssgd compare``: the same training run once per method, side by side.

Every method trains the same model on the same data shards with the same seeds and
steps (one ``gssgd train`` run each, into ``DIR/METHOD/``). Then ``DIR/results.json``
maps each method to its final test accuracy (text: test loss), bytes sent per worker
per step and seconds per step; ``DIR/vs_step.png`` and ``DIR/vs_bytes.png`` plot loss
and accuracy against steps and against bytes communicated, and a table is printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from gssgd.cli.errors import run_command
from gssgd.cli.train import Formatter, add_training_flags, settings_from_args
from gssgd.methods import DDP_REFERENCE_METHOD, METHODS, REFERENCE_METHOD, parse_methods
from gssgd.study.curves import ACCURACY, LOSS, first_reaching
from gssgd.train.config import TrainConfig
from gssgd.train.data import TextData, load_dataset
from gssgd.train.launch import is_user_error
from gssgd.train.loop import run_training
from gssgd.train.method_settings import (
    check_settings_apply,
    import_plugins,
    setting_applies_to,
    settings_for,
)
from gssgd.train.metrics import METRICS_FILE, busier_bytes, read_metrics, write_json

__all__ = ["DEFAULTS", "add_parser", "run"]

#: compare's defaults where they differ from train's: the README's main job (MNIST, CNN, 4
#: workers, 250 steps), every aggregator method gssgd ships (plugins left out; the DDP
#: built-ins too), at a density that compresses (0.1 %: a sparse method sends about
#: 1/1000 of the gradient).
DEFAULTS: dict[str, Any] = {
    "methods": ",".join(name for name, spec in METHODS.items() if spec.aggregator is not None
                        and spec.aggregator.__module__.startswith("gssgd.")),
    "density": 0.001,
    "dataset": "mnist",
    "steps": 250,
    "batch_size": 32,
    "eval_every": 100,
}

#: The run the others are measured against: gssgd's dense, else DDP's own all-reduce.
_REFERENCES = (REFERENCE_METHOD, DDP_REFERENCE_METHOD)

#: The fields of a method's summary that go to results.json.
RESULT_FIELDS = (
    "status",
    "final_test_accuracy",
    "final_test_loss",
    "final_train_loss",
    "bytes_sent_per_step",
    "bytes_sent_max_per_step",
    "bytes_received_per_step",
    "bytes_received_max_per_step",
    "seconds_per_step",
    "seconds_communicate_per_step",
    "bytes_sent_total",
    "steps",
    "d",
    "seconds_wall",
)

DESCRIPTION = """\
Train the same model on the same data shards with the same seeds and steps once per
method (one `gssgd train` run each, into DIR/METHOD/), then compare them:

  DIR/results.json   method -> final test accuracy (text: test loss), bytes sent per
                     worker per step, seconds per step, ...
  DIR/vs_step.png    training loss and test accuracy against the step
  DIR/vs_bytes.png   the same against the bytes a worker sent
  stdout             a table of the above; "x fewer" and "bytes to dense-0.5pt" count
                     the busiest worker's link in its busier direction (local Top-k's
                     workers receive 2k(P-1) numbers; Sketched-SGD's server P sketches)

Methods: every name `gssgd train --help` lists (dense is gssgd's all-reduce through the
same hook as the compressors; ddp-allreduce is DDP's own).
Method-specific flags (--rows, --density, ...) go to the methods that take them.
The defaults are the main job: MNIST, CNN, 4 workers, six methods, density 0.001 (PowerSGD
at rank 2), each method at its recipe (dense and PowerSGD: SGD momentum 0.9, lr 0.05;
sparse: plain SGD with error feedback, lr 0.2, 100 density warm-up steps), 250 steps,
about two minutes on a 2-core machine.
On a language model (--model lm or gpt, the default for text) dense trains with SGD momentum
0.9 at lr 0.8 and the sparse methods with plain SGD at lr 1.6 and DGC's momentum 0.9 inside
the aggregator; --optimizer adamw trains dense with AdamW and the sparse methods with 1-bit
Adam's recipe (150 dense AdamW steps, then the variance frozen and the momentum
compressed; --adam-variance moving keeps the variance moving, --freeze-variance-after 0:
plain AdamW). The table's "vs dense" column is each method's loss against dense's (text)
or its accuracy in points. On a language model 400 steps is short: the sparse methods'
gaps to dense are still opening there (on the character GPT they peak near steps
500-1,000 and narrow after), so judge them with --steps 1500 or more.
"""

EPILOG = """\
examples:
  gssgd compare                                               # the main job (~2 min)
  gssgd compare --methods dense,topk,gtopk,sketched,gs --dataset digits --workers 2 \\
                --steps 50 --out runs/quick
  gssgd compare --methods dense,gs --density 0.001 --rows 7 --out runs/gs-vs-dense
"""


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    """Register ``gssgd compare``."""
    parser = subparsers.add_parser(
        "compare",
        help=summary,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=Formatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--methods",
        default=DEFAULTS["methods"],
        help=f"comma-separated methods, from {', '.join(METHODS)}",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="where results go (default: runs/compare-TIME); one "
        "sub-directory per method, replaced when run again",
    )
    add_training_flags(parser, compare=True)
    parser.set_defaults(
        run=run, parser=parser,
        **{k: v for k, v in DEFAULTS.items() if k not in ("methods", "density")},
    )
    return parser


def _configs(args: argparse.Namespace, methods: list[str], out: Path) -> dict[str, TrainConfig]:
    """One config per method from the same flags; every one is checked before any runs.

    Raises:
        ValueError: a bad value, or a method-specific flag none of the methods takes.
    """
    settings = settings_from_args(args)
    settings.pop("out")  # compare's --out is the parent of the runs
    compresses = set(methods) & set(setting_applies_to("density"))
    if settings.get("density") is None and settings.get("k") is None and compresses:
        settings["density"] = DEFAULTS["density"]  # compare's default, for the methods taking it
    check_settings_apply(settings, methods)
    return {
        m: TrainConfig.build(m, **settings_for(m, settings), out=str(out / m), overwrite=True)
        for m in methods
    }


def run(args: argparse.Namespace) -> int:
    """Train every method, then write results.json and the plots and print the table.

    Returns:
        0 when every method completed, 1 when one failed or stopped, 2 on invalid flags.
    """
    return run_command("gssgd compare", lambda: _compare(args))


def _compare(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path("runs") / f"compare-{datetime.now():%Y%m%d-%H%M%S}"
    import_plugins(args.plugins)
    methods = list(parse_methods(args.methods))
    configs = _configs(args, methods, out)
    text = isinstance(load_dataset(args.dataset), TextData)

    results: dict[str, dict[str, Any]] = {}
    curves: dict[str, list[dict[str, Any]]] = {}
    start = time.perf_counter()
    for method, cfg in configs.items():
        try:
            summary = run_training(cfg)
        except Exception as err:  # record it, go on with the other methods
            if not is_user_error(err) and not isinstance(err, RuntimeError):
                raise
            print(f"gssgd compare: {method} failed: {err}", file=sys.stderr)
            results[method] = {"status": f"failed: {err}", "run_dir": cfg.out}
            continue
        assert summary is not None
        curves[method] = read_metrics(Path(cfg.out) / METRICS_FILE)
        results[method] = {key: summary.get(key) for key in RESULT_FIELDS}
        results[method]["k"] = curves[method][-1].get("k") if curves[method] else None
        results[method]["lr"], results[method]["momentum"] = cfg.lr, cfg.momentum
        results[method]["optimizer"] = cfg.optimizer
        results[method]["freeze_variance_after"] = cfg.freeze_variance_after
        results[method]["adam_variance"] = cfg.adam_variance
        results[method]["run_dir"] = cfg.out
    seconds = time.perf_counter() - start
    add_bytes_to_target(results, curves, text)

    # Imported here, not above: spawned workers re-import the CLI, and need no matplotlib.
    from gssgd.plots import plot_comparison

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    write_json(
        out / "settings.json",
        {"methods": methods, "seconds_total": seconds, **settings_from_args(args)},
    )
    plots = plot_comparison(curves, out, text=text)
    print(table(results, text))
    print(
        f"\n{len(methods)} methods in {seconds:.0f} s; wrote {out / 'results.json'}, "
        + ", ".join(str(p) for p in plots)
    )
    ok = all(r.get("status") == "completed" for r in results.values())
    return 0 if ok else 1


def add_bytes_to_target(
    results: dict[str, dict[str, Any]], curves: dict[str, list[dict[str, Any]]], text: bool
) -> None:
    """Add ``bytes_to_target`` (the bytes the busiest worker's link had carried, in its
    busier direction (:func:`busier_bytes`), at the first evaluation that reaches the dense
    run's final figure by the studies' rule: within 0.5 point of its accuracy, or 3 % of its
    loss (:data:`gssgd.study.curves.ACCURACY`, :data:`~gssgd.study.curves.LOSS`); None:
    never) and ``target``, in place. The dense reference is ``dense`` (else
    ``ddp-allreduce``)."""
    ref = next((m for m in _REFERENCES if m in curves), None)
    if ref is None:
        return
    metric = LOSS if text else ACCURACY
    final = results[ref].get(f"final_test_{metric.key}")
    if final is None:
        return
    for method, records in curves.items():
        evals, carried = [], 0.0
        for r in records:
            carried += busier_bytes(r)
            value = r.get(f"test_{metric.key}")
            if value is not None:
                evals.append((int(r.get("step", 0)), float(value), carried))
        hit = first_reaching(evals, metric, final)
        results[method]["target"] = metric.target(final)
        results[method]["bytes_to_target"] = None if hit is None else hit[2]


def table(results: dict[str, dict[str, Any]], text: bool = False) -> str:
    """The comparison as a fixed-width table (one row per method)."""
    headline = "test loss" if text else "test acc"
    key = "final_test_loss" if text else "final_test_accuracy"
    ref = next((results[m] for m in _REFERENCES if m in results), {})
    dense, dense_to_target = busier_bytes(ref), ref.get("bytes_to_target")
    reach = "to dense+3%" if text else "to dense-0.5pt"
    rows = [("method", headline, "vs dense", "bytes/worker/step", "max sent", "max received",
             "x fewer", f"bytes {reach}", "x fewer", "optimizer", "s/step", "status")]
    for method, r in results.items():
        sent, busiest = r.get("bytes_sent_per_step"), r.get("bytes_sent_max_per_step")
        to_target, link = r.get("bytes_to_target"), busier_bytes(r)
        rows.append((
            method,
            _fmt(r.get(key), ".4f"),
            _versus(r.get(key), ref.get(key), text),
            _fmt(sent, ",.0f"),
            _fmt(busiest, ",.0f"),
            _fmt(r.get("bytes_received_max_per_step"), ",.0f"),
            f"{dense / link:,.1f}x" if link and dense else "-",
            _fmt(to_target, ",.0f") if "target" in r else "-",
            f"{dense_to_target / to_target:,.1f}x" if to_target and dense_to_target else "-",
            _optimizer(r),
            _fmt(r.get("seconds_per_step"), ".4f"),
            str(r.get("status")),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.rjust(w) if i not in (0, 11) else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _versus(value: float | None, dense: float | None, text: bool) -> str:
    """A method's result against dense's: its loss in % above (text), else points of
    accuracy; "-" without both."""
    if value is None or dense is None:
        return "-"
    if text:
        return f"{value / dense - 1:+.1%}" if dense else "-"
    return f"{100 * (value - dense):+.2f} pt"


def _optimizer(r: dict[str, Any]) -> str:
    """``sgd lr 0.2`` / ``sgd lr 0.05, m 0.9`` / ``adamw lr 0.001`` / ``adamw lr 0.001,
    frozen after 150`` (1-bit Adam's recipe) / ``adamw lr 0.001, moving after 150`` (its
    variance kept moving) ("-" if unknown)."""
    if r.get("lr") is None:
        return "-"
    kind = r.get("optimizer", "sgd")
    extra = f", m {r['momentum']:g}" if kind == "sgd" and r.get("momentum") else ""
    if r.get("freeze_variance_after"):
        extra += f", {r['adam_variance']} after {r['freeze_variance_after']}"
    return f"{kind} lr {r['lr']:g}{extra}"


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)
