"""``gssgd advise``: which method makes a training job fastest on a given cluster, and how
to ask for it (:func:`gssgd.costmodel.advice.advise` on the cost model); ``--calibrate``
fits that model on ``gssgd bench comm`` runs and stores it with its held-out error."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from gssgd.cli.errors import run_command
from gssgd.costmodel.advice import (
    DEFAULT_RUN_STEPS,
    Advice,
    advise,
    candidate_methods,
    held_out_error,
    parse_params,
    parse_workers,
)
from gssgd.costmodel.architectures import (
    ARCHITECTURES,
    architecture_of,
    family_of,
    layer_shapes,
    model_shapes,
)
from gssgd.costmodel.cluster import Link, parse_latency, parse_link
from gssgd.costmodel.devices import DEVICE_NAMES, cpu_fwdbwd_seconds, get_device
from gssgd.methods import parse_methods
from gssgd.recipes import SPARSE_WARMUP_STEPS

__all__ = ["add_parser", "render", "run"]

DESCRIPTION = """\
Predict one training step of every method on a cluster (compute, communication, and the
communication hidden behind backward), times the steps one study measured each to need to
reach dense's target, name the fastest to that target, and print how to use it: a `gssgd
train` command line and the call for a DDP script. Every method is priced, PowerSGD on the
model's layer shapes (--model, or --arch with --params) and local steps (DiLoCo) with
their outer step every H steps. A method the study did not measure for this model family,
worker count (within 2x) or density says "steps not measured" and is ranked by its time
per step alone.

--calibrate RUN_DIR... fits the cost model on `gssgd bench comm` runs (this machine's
emulated links), checks it leaving one run out, and writes both to the package's
gssgd/costmodel/data/fit.json, whose error every report prints.
"""

EPILOG = """\
examples:
  gssgd advise --params 25.6M --arch resnet --workers 32 --link 1gbit
  gssgd advise --params 1.3B --arch transformer --workers 256 --link 100gbit --latency 5us
  gssgd advise --model gpt --workers 32 --link 10gbit --device a100 --json
  gssgd advise --calibrate studies/aggregation_grid/results/comm_* studies/cost_model/runs/comm_*

the model (gssgd.costmodel.cluster):
  step = fwd+bwd + compression + (latency + round) * rounds + bytes / (efficiency * rate)
         - hidden
  rounds and bytes are each method's own traffic formula; efficiency per collective pattern
  and the round's software cost are fitted on this machine's emulated links (a cluster
  keeps the efficiencies and drops the per-round software, driven-round and tbf terms);
  hidden = what overlaps backward (DDP's bucketed all-reduce for dense, gs's streamed table).
  fwd+bwd defaults to params times the device's per-parameter constant
  (gssgd/costmodel/data/devices.json); give your own with --compute-ms.
"""


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
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--params", help="the model's parameter count, e.g. 25.6M, 124M, 1.3B")
    size.add_argument("--model", help="a shipped model (gssgd train --model): its exact shapes")
    add("--arch", choices=ARCHITECTURES, default=None,
        help="with --params: the architecture family whose layer shapes PowerSGD is priced "
        "on and whose study the evidence comes from (transformer: GPT-2's layout; resnet: "
        "torchvision's bottleneck ResNet)")
    add("--workers", help="data-parallel workers (GPUs), 2..65536")
    add("--link", help="each worker's link rate, 1mbit..400gbit, e.g. 10gbit")
    add("--latency", default="20us", help="per-message latency, e.g. 5us, 20us (default), 1ms")
    add("--device", default="h200",
        help=f"the workers' device: {', '.join(DEVICE_NAMES)} (default h200)")
    add("--density", default="0.001",
        help="fraction of coordinates the sparse methods send (default 0.001)")
    add("--compute-ms", default=None,
        help="measured forward + backward milliseconds of one worker's batch "
        "(default: estimated from the parameters and the device)")
    add("--methods", default=None, help="comma-separated methods to compare (default: all)")
    add("--warmup-steps", default=None,
        help="density warm-up steps of the sparse methods (default: gssgd train's, "
        f"{SPARSE_WARMUP_STEPS}; 0 = none): counted in the run columns")
    add("--steps", default=str(DEFAULT_RUN_STEPS),
        help=f"the steps dense needs to its target (default {DEFAULT_RUN_STEPS}): each "
        "method's run to the target scales it by its measured steps ratio")
    add("--json", action="store_true", help="print the prediction as JSON")
    add("--calibrate", nargs="+", metavar="RUN_DIR", default=None,
        help="fit the cost model on these gssgd bench comm runs and store it (no advice)")
    add("--write", type=Path, default=None,
        help="with --calibrate: where to write fit.json (default: the package's data)")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Predict and print (or calibrate); 0 done, 2 a bad value."""
    return run_command("gssgd advise", lambda: _run(args))


def _number(flag: str, text: str | None, low: float, high: float, example: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not low <= value <= high:
        raise ValueError(f"{flag} {text!r} must be a number in {low:g}..{high:g}; e.g. {example}")
    return value


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


def _model(args: argparse.Namespace) -> tuple[int, tuple[tuple[int, ...], ...], str]:
    """The model's parameters, layer shapes and family, from --model or --params/--arch
    (its architecture: :func:`architecture_of` the same flags)."""
    if args.model is not None:
        if args.arch is not None:
            raise ValueError("--arch goes with --params; a shipped --model has its own shapes")
        shapes = model_shapes(args.model)
        return sum(math.prod(s) for s in shapes), shapes, family_of(model=args.model)
    if args.params is None:
        raise ValueError("give the model: --model NAME (a shipped model), or --params N with "
                         f"--arch ({', '.join(ARCHITECTURES)}), e.g. --params 25.6M --arch resnet")
    if args.arch is None:
        raise ValueError(
            f"--params {args.params} needs --arch ({', '.join(ARCHITECTURES)}): PowerSGD's "
            "message depends on the layer shapes, and the family decides which study's "
            "evidence applies; e.g. --params 25.6M --arch resnet"
        )
    params = parse_params(args.params)
    return params, layer_shapes(args.arch, params), family_of(arch=args.arch)


def _run(args: argparse.Namespace) -> None:
    if args.calibrate is not None:
        _calibrate(args)
        return
    for flag, value in (("--workers", args.workers), ("--link", args.link)):
        if value is None:
            raise ValueError(f"{flag} is required (e.g. --workers 32 --link 10gbit)")
    params, shapes, family = _model(args)
    device = get_device(args.device)
    compute_ms = _number("--compute-ms", args.compute_ms, 0, 3.6e6, "--compute-ms 33")
    fwdbwd_s = None if compute_ms is None else compute_ms / 1e3
    if fwdbwd_s is None and device.name == "cpu" and args.model is not None:
        fwdbwd_s = cpu_fwdbwd_seconds(args.model)  # timed on this machine's CPU now
    methods = None
    if args.methods is not None:
        methods = parse_methods(args.methods, valid=candidate_methods())
    density = _number("--density", args.density, 1e-9, 1, "--density 0.001")
    assert density is not None
    advice = advise(
        params=params, workers=parse_workers(args.workers),
        link=Link(parse_link(args.link), parse_latency(args.latency)), device=device,
        density=density, shapes=shapes, family=family, fwdbwd_s=fwdbwd_s, methods=methods,
        architecture=architecture_of(model=args.model, arch=args.arch),
        warmup_steps=_count("--warmup-steps", args.warmup_steps, 0),
        run_steps=_count("--steps", args.steps, 1) or DEFAULT_RUN_STEPS,
    )
    if args.json:
        json.dump(advice.as_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(render(advice, model=args.model or f"{args.arch}"))


def _calibrate(args: argparse.Namespace) -> None:
    """Fit on the runs, check leaving one out, write fit.json."""
    from gssgd.costmodel import store
    from gssgd.costmodel.check import calibration_record

    runs = [Path(r) for r in args.calibrate]
    missing = [str(r) for r in runs if not (r / "results.json").exists()]
    if missing:
        raise ValueError(f"not gssgd bench comm runs (no results.json): {', '.join(missing)}")
    record = calibration_record(runs, "this machine's emulated links (tc tbf), P = 4 and 8")
    if args.write is None:
        path = store.write("fit.json", record)
    else:
        args.write.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        path = args.write
    print(_error_line(record["held_out"]))
    print(f"wrote {path}")


def render(advice: Advice, model: str | None = None) -> str:
    """The human-readable report: a table of every method, the recommendation, the
    evidence and the model's error."""
    lines = [
        f"{model + ', ' if model else ''}{advice.params:,} parameters ({advice.family} "
        f"family), {advice.workers} workers on {advice.device.name}, links of {advice.link}, "
        f"density {advice.density:g}",
        "",
        f"{'method':<12} {'step ms':>9} {'compute':>9} {'comm':>9} {'hidden':>8} "
        f"{'MB/step':>8} {'run s':>9} {'target s':>9}  evidence",
    ]
    n = advice.run_steps
    for c in advice.candidates:
        s, to = c.step, c.target_seconds(n)
        lines.append(
            f"{c.name:<12} {s.total * 1e3:>9.1f} {s.compute * 1e3:>9.1f} "
            f"{s.communication * 1e3:>9.1f} {s.hidden * 1e3:>8.1f} "
            f"{c.warmup.step_bytes_sent / 1e6:>8.3g} {c.run_seconds(n):>9.4g} "
            f"{'-' if to is None else f'{to:.4g}':>9}  {c.evidence.describe()}"
        )
    rec, fastest = advice.recommended, advice.fastest_step
    lines += ["", _recommendation(advice)]
    if fastest is not rec:
        lines.append(f"  not {fastest.name}, the fastest step: {fastest.evidence.describe()}")
    measured = advice.best_measured
    if measured is not None and measured is not rec:
        to = measured.target_seconds(n)
        lines.append(f"  measured:  {measured.name}, the fastest whose steps to the target were "
                     f"measured ({measured.evidence.describe()}; {to:.4g} s)")
    lines += [
        f"  train:     {advice.train_command()}",
        f"  DDP:       {advice.hook_call()}",
        "",
        _evidence_line(advice),
        _error_line(held_out_error()),
    ]
    return "\n".join(lines)


def _recommendation(advice: Advice) -> str:
    rec, n = advice.recommended, advice.run_steps
    to = rec.target_seconds(n)
    dense = next((c for c in advice.candidates if c.name == "dense"), None)
    speedup = "" if dense is None else f", {dense.step.total / rec.step.total:.2f}x dense's"
    kin = rec.evidence.kin
    measured = ("" if rec.evidence.steps_ratio is not None
                else "; its steps to the target were not measured"
                + (f"; {kin}" if kin else ""))
    return (f"recommended: {rec.name} ({rec.step.total * 1e3:.1f} ms per step{speedup}"
            + ("" if to is None else f"; {to:.4g} s for dense's {n} steps to the target")
            + f"{measured})")


def _evidence_line(advice: Advice) -> str:
    study = advice.study
    if study is None:
        return (f"evidence: no study measured a {advice.family} model: every method is ranked "
                "by its time per step alone (steps not measured).")
    wanted = advice.architecture
    other = (f"; its model: {study.architecture}, as no study measured a {wanted}"
             if wanted and study.architecture and study.architecture != wanted else "")
    return (f"evidence: one study, {study.title} ({study.source}{other}); target {study.target}; "
            f"'target s' is a run of --steps {advice.run_steps} for dense, scaled by each "
            "method's measured steps ratio (1 where not measured).")


def _error_line(err: dict[str, Any]) -> str:
    per = ", ".join(f"{m} {e['median_abs_rel_error']:.0%}"
                    for m, e in sorted(err["per_method"].items()))
    return (
        f"model error (this model, held out on {err['where']}: {err['runs']} runs, "
        f"{err['points']} steps): median {err['median_abs_rel_error']:.1%}, max "
        f"{err['max_abs_rel_error']:.0%}; per method: {per}. Its first choice was the measured "
        f"fastest or within 10 % in {err['recommended_within_10pct']} of {err['runs']} runs. "
        "Cluster predictions keep the fitted efficiencies and are not checked on a cluster."
    )
