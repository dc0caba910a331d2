"""``gssgd advise``: which method makes a training job fastest on a given cluster, and how
to ask for it (:func:`gssgd.costmodel.advice.advise` on the cluster cost model)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gssgd.cli.errors import run_command
from gssgd.costmodel.advice import (
    DEFAULT_RUN_STEPS,
    MEASURED_ERROR,
    Advice,
    advise,
    parse_params,
    parse_workers,
)
from gssgd.costmodel.cluster import Link, parse_latency, parse_link
from gssgd.costmodel.devices import CPU_FWDBWD_S, DEVICES, get_device
from gssgd.costmodel.lm_reach import LANGUAGE_MODELS, language_model_advice
from gssgd.costmodel.reach import REACH_WHERE
from gssgd.methods import SPARSE_WARMUP_STEPS, parse_methods

__all__ = ["add_parser", "model_params", "run"]

DESCRIPTION = """\
Predict one training step of every method on a cluster (compute, communication, and the
communication hidden behind backward), times the steps each needs to reach dense's
accuracy (measured by the many-workers frontier study at density 0.001), name the fastest
to that target, and print how to use it: a `gssgd train` command line and a
`HookState(...)` call for DDP.
"""

EPILOG = """\
examples:
  gssgd advise --params 25.6M --workers 64 --link 10gbit               # ResNet-50 on H200s
  gssgd advise --params 1.3B --workers 256 --link 100gbit --latency 5us --json
  gssgd advise --model gpt --workers 4 --link 100mbit --device cpu --latency 1ms

the model (gssgd.costmodel.cluster):
  step = fwd+bwd + compression + latency*rounds + bytes/(efficiency*rate) - hidden
  rounds and bytes are each method's own traffic formula; hidden = what overlaps backward
  (DDP's bucketed all-reduce for dense; nothing for the compressed methods, which select
  over the whole model after backward), all of it on an H200 (assumed), none on the cpu
  device (measured: gloo's threads take the cores backward needs). fwd+bwd defaults to
  params times the device's per-parameter constant (H200: ResNet-50's measured 32.8 ms at
  batch 64); give your own with --compute-ms. Cluster links are taken to reach 90 % of
  their rate in every pattern (an assumption; not measured on a cluster).
"""

#: Stand-in data of the shipped models for counting their parameters: MNIST-shaped images
#: (1x28x28, 10 classes) for image models, a 65-character vocabulary for text models.
_STANDIN_VOCAB = 65


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``advise``."""
    parser = sub.add_parser(
        "advise",
        help="which method is fastest on your cluster, with the flags to use it",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add = parser.add_argument
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", help="the model's parameter count, e.g. 25.6M, 124M, 1.3B")
    size.add_argument("--model", help="a shipped model (gssgd train --model) to count instead")
    add("--workers", required=True, help="data-parallel workers (GPUs), 2..65536")
    add("--link", required=True, help="each worker's link rate, 1mbit..400gbit, e.g. 10gbit")
    add("--latency", default="20us", help="per-message latency, e.g. 5us, 20us (default), 1ms")
    add(
        "--device", default="h200", help=f"the workers' device: {', '.join(DEVICES)} (default h200)"
    )
    add(
        "--density",
        default="0.001",
        help="fraction of coordinates the sparse methods send (default 0.001)",
    )
    add(
        "--compute-ms",
        default=None,
        help="measured forward + backward milliseconds of one worker's batch "
        "(default: estimated from --params and the device)",
    )
    add("--methods", default=None, help="comma-separated methods to compare (default: all)")
    add(
        "--warmup-steps",
        default=None,
        help="density warm-up steps of the sparse methods (default: gssgd train's, "
        f"{SPARSE_WARMUP_STEPS}; 0 = none): counted in the warm-up and run columns",
    )
    add(
        "--steps",
        default=str(DEFAULT_RUN_STEPS),
        help=f"the run length the run column totals over (default {DEFAULT_RUN_STEPS}, "
        "gssgd train's): the steps dense needs; the target column scales it by each "
        "method's measured steps to dense's accuracy",
    )
    add("--json", action="store_true", help="print the prediction as JSON")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Predict and print; 0 done, 2 a bad value."""
    return run_command("gssgd advise", lambda: _run(args))


def model_params(name: str) -> int:
    """Parameters of the shipped model ``name`` on its stand-in data (see ``--model``).

    Raises:
        ValueError: an unknown model (the message lists them).
    """
    import torch

    from gssgd.train.data_types import ImageData, TextData
    from gssgd.train.models import MODELS, build_model

    if name not in MODELS:
        raise ValueError(
            f"unknown model {name!r}; shipped models are {', '.join(MODELS)} "
            "(or give --params N instead)"
        )
    if name in LANGUAGE_MODELS:
        ids = torch.arange(200) % _STANDIN_VOCAB
        chars = [chr(32 + i) for i in range(_STANDIN_VOCAB)]
        data: ImageData | TextData = TextData(train=ids, test=ids, vocab=chars, name="stand-in")
    else:
        x, y = torch.zeros(2, 1, 28, 28), torch.arange(2)
        data = ImageData(x_train=x, y_train=y, x_test=x, y_test=y, num_classes=10, name="stand-in")
    return sum(p.numel() for p in build_model(name, data).parameters())


def _density(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise ValueError(
            f"density {text!r} must be a number in (0, 1]; e.g. --density 0.001 "
            "(k = round(density * params) coordinates per step)"
        )
    return value


def _compute_seconds(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 3.6e6:
        raise ValueError(
            f"--compute-ms {text!r} must be a number of milliseconds in 0..3600000; give "
            "the measured forward + backward time of one worker's batch, e.g. --compute-ms 33"
        )
    return value / 1e3


def _count(flag: str, text: str | None, low: int) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise ValueError(f"{flag} {text!r} must be a whole number >= {low}, e.g. {flag} 100")
    return value


def _run(args: argparse.Namespace) -> None:
    params = parse_params(args.params) if args.params is not None else model_params(args.model)
    device = get_device(args.device)
    fwdbwd_s = _compute_seconds(args.compute_ms)
    if fwdbwd_s is None and device.name == "cpu" and args.model in CPU_FWDBWD_S:
        fwdbwd_s = CPU_FWDBWD_S[args.model]  # measured on this machine
    link = Link(parse_link(args.link), parse_latency(args.latency))
    methods = None
    if args.methods is not None:
        from gssgd.costmodel.advice import candidate_methods

        methods = parse_methods(args.methods, valid=candidate_methods())
    advice = advise(
        params=params,
        workers=parse_workers(args.workers),
        link=link,
        device=device,
        density=_density(args.density),
        fwdbwd_s=fwdbwd_s,
        methods=methods,
        warmup_steps=_count("--warmup-steps", args.warmup_steps, 0),
        run_steps=_count("--steps", args.steps, 1) or DEFAULT_RUN_STEPS,
    )
    if args.json:
        out = advice.as_dict()
        if args.model in LANGUAGE_MODELS:
            out["language_model"] = language_model_advice(advice.workers).strip()
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(render(advice, model=args.model))


def render(advice: Advice, model: str | None = None) -> str:
    """The human-readable report: a table of every method, the recommendation, the error."""
    what = (
        f"--model {model} ({advice.params:,} parameters)"
        if model
        else (f"{advice.params:,} parameters")
    )
    lines = [
        f"{what}, {advice.workers} workers on {advice.device.name}, links of {advice.link}, "
        f"density {advice.density:g}",
        "",
        f"{'method':<11} {'step ms':>10} {'compute':>10} {'comm':>10} {'hidden':>9} "
        f"{'MB/step':>9} {'warm-up s':>10} {'run s':>9} {'target s':>9}  {'pattern':<18} "
        "overlap  convergence",
    ]
    n = advice.run_steps
    for c in advice.candidates:
        s, w, to = c.step, c.warmup, c.target_seconds(n)
        lines.append(
            f"{c.name:<11} {s.total * 1e3:>10.1f} {s.compute * 1e3:>10.1f} "
            f"{s.communication * 1e3:>10.1f} {s.hidden * 1e3:>9.1f} "
            f"{w.step_bytes_sent / 1e6:>9.3g} {w.extra_seconds:>10.3g} {c.run_seconds(n):>9.4g} "
            f"{'-' if to is None else f'{to:.4g}':>9}  {s.pattern:<18} {s.overlap:<8} "
            f"{'not measured' if c.reach is None else c.reach.describe()}"
        )
    rec, fastest = advice.recommended, advice.fastest_step
    speedup = advice.speedup_over("dense")
    to = rec.target_seconds(n)
    lines += [
        "",
        f"recommended: {rec.name} ({rec.step.total * 1e3:.1f} ms per step"
        + (f", {speedup:.2f}x dense's" if speedup is not None else "")
        + ("" if to is None else f"; {to:.4g} s to dense's accuracy")
        + ")",
    ]
    if fastest is not rec:
        if fastest.reach is None:
            why = "its steps to dense's accuracy were not measured"
        elif not fastest.reach.reached:
            why = "measured short of dense's accuracy: " + fastest.reach.describe()
        else:
            why = "slower to dense's accuracy: " + fastest.reach.describe()
        lines.append(f"  not {fastest.name}, the fastest step ({why})")
    if advice.powersgd is not None:
        rank = advice.powersgd.row.removeprefix("powersgd-r")
        lines.append(
            f"  also:      powersgd, not modelled (its message, rank x (n + m) numbers per n x m "
            f"matrix, needs the layer shapes): rank {rank} {advice.powersgd.describe()}; "
            f"try gssgd train --method powersgd --powersgd-rank {rank}"
        )
    if model in LANGUAGE_MODELS:
        lines.append(language_model_advice(advice.workers))
    lines += [
        f"  options:   {_describe(rec.spec, rec.options())}",
        f"  train:     {advice.train_command()} ...",
        f"  DDP:       state = {advice.hook_call()}",
        "",
        _warmup_line(advice),
        _error_line(MEASURED_ERROR),
    ]
    return "\n".join(lines)


def _describe(spec: Any, changed: dict[str, Any]) -> str:
    parts = []
    if spec.rows:
        parts.append(f"sketch {spec.rows} x {spec.cols} (m = {spec.candidates})")
        table = "float16" if spec.table_bytes == 2 else "float32"
        if spec.aggregator == "gs":
            parts.append(f"all-reduce {spec.allreduce}")
            parts.append(f"table {table}")
    if spec.k != spec.d:
        parts.append(f"k = {spec.k:,}")
    if spec.value_bytes == 2:
        parts.append("16-bit payload")
    parts.append(
        "defaults otherwise"
        if not changed
        else "set: " + ", ".join(f"{k}={v}" for k, v in changed.items())
    )
    return "; ".join(parts)


def _warmup_line(advice: Advice) -> str:
    """What the columns after ``hidden`` mean, with the recommended method's warm-up."""
    w, n = advice.recommended.warmup, advice.run_steps
    line = (
        "MB/step: bytes the busiest worker sends per steady step; warm-up s: what a density "
        f"warm-up adds to a run (communication); run s: {n} steps, warm-up included; "
        f"target s: the run to dense's accuracy if dense needs {n} steps (--steps), each "
        f"method's steps scaled as measured ({REACH_WHERE}; what neither measured is ranked "
        "by the step)."
    )
    if w.steps:
        line += (
            f" {advice.recommended.name}'s warm-up: {w.steps} steps send {w.bytes_sent / 1e6:.4g} "
            f"MB per worker, {w.extra_bytes_sent / 1e6:.4g} MB more than steady steps "
            "(--warmup-steps 0 for none)."
        )
    return line


def _error_line(err: dict[str, Any]) -> str:
    return (
        f"model error (held out, {err['points']} measured steps in {err['runs']} runs on "
        f"{err['where']}): median {err['median_abs_rel_error']:.1%}, max "
        f"{err['max_abs_rel_error']:.1%}; its first choice was the measured fastest or within "
        f"10 % of it in {err['recommended_within_10pct']} of {err['runs']} runs. GPU "
        "predictions are not checked against a cluster."
    )
