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
from gssgd.costmodel.architectures import ARCHITECTURES, architecture_of, family_of, layer_shapes
from gssgd.costmodel.cluster import Link, parse_latency, parse_link
from gssgd.costmodel.devices import DEVICE_NAMES, cpu_fwdbwd_seconds, device_record, get_device
from gssgd.costmodel.evidence import Study, study_from_summaries
from gssgd.costmodel.fit import margin_of
from gssgd.methods import REFERENCE_METHOD, parse_methods
from gssgd.recipes import SPARSE_WARMUP_STEPS
from gssgd.study.advised import study_spec

__all__ = ["add_parser", "render", "run"]

DESCRIPTION = """\
Which method to train with on your cluster, from two answers kept apart: every method's
step (compute + communication, from the step model) and its steps to dense's target (only
from a study of your model's family, or from your own study). The recommendation is made
only among the methods a study measured reaching the target, and only where a method beats
the simpler dense (or dense16) by more than the step model's held-out error for it plus a
margin for how far the study's workers and model size are from yours. Every other method is
listed with its step time only: "quality not measured".

The loop: advise proposes, a study measures on your model, advise decides.
  gssgd advise --model mymod:net --workers 32 --link 10gbit --study-spec s.toml
  gssgd study s.toml --out runs/my-study
  gssgd advise --model mymod:net --workers 32 --link 10gbit --evidence runs/my-study

--calibrate RUN_DIR... fits the step model on `gssgd bench comm` runs (this machine's
emulated links), checks it holding out each run, each worker count and each size, and
writes both to the package's gssgd/costmodel/data/fit.json, whose error every report prints.
"""

EPILOG = """\
examples:
  gssgd advise --params 25.6M --arch resnet --workers 32 --link 1gbit
  gssgd advise --params 1.3B --arch transformer --workers 256 --link 100gbit --latency 5us
  gssgd advise --model gpt --workers 32 --link 10gbit --device a100 --json
  gssgd advise --model examples.user_model:mlp --dataset examples.user_model:blobs \\
      --workers 8 --link 1gbit --study-spec my-study.toml
  gssgd advise --calibrate studies/cost_model/grid/comm_*

the step model (gssgd.costmodel.cluster, fitted in gssgd.costmodel.fit):
  step = fwd+bwd + compression + latency * rounds + bytes / (efficiency * rate) - hidden
  rounds and bytes are each method's own traffic formula; the efficiency of each collective
  pattern is fitted on this machine's emulated links, where its held-out error is measured
  with each run's probed latency and this CPU's compression; on your cluster, your --link
  and --latency and the device's constants (gssgd/costmodel/data/devices.json; give your
  own forward + backward with --compute-ms). hidden = what overlaps backward (DDP's
  bucketed all-reduce for dense, gs's streamed table, PowerSGD's buckets but the last
  with --per-bucket --overlap buckets).
"""


def add_parser(sub: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    """Register ``advise``."""
    parser = sub.add_parser(
        "advise",
        help=summary,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add = parser.add_argument
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--params", help="the model's parameter count, e.g. 25.6M, 124M, 1.3B")
    size.add_argument("--model", help="a shipped model (gssgd train --model) or your own "
                      "MODULE:FUNCTION: its exact shapes")
    add("--dataset", default=None,
        help="with --model: the data it is built on (as gssgd train --dataset; default: "
        "stand-in MNIST-shaped images, or text for a shipped text model), and the study "
        "spec's dataset")
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
        "method's run to the target scales it by its measured steps ratio; the study "
        "spec's steps")
    add("--evidence", nargs="+", metavar="STUDY_DIR", default=None,
        help="the --out folder(s) of your own gssgd study of this model (one per worker "
        "count): recommend from its measurements instead of the package's studies")
    _add_study_flags(add)
    add("--json", action="store_true", help="print the prediction as JSON")
    add("--calibrate", nargs="+", metavar="RUN_DIR", default=None,
        help="fit the step model on these gssgd bench comm runs and store it (no advice)")
    add("--write", type=Path, default=None,
        help="with --calibrate: where to write fit.json (default: the package's data)")
    parser.set_defaults(run=run)
    return parser


def _add_study_flags(add: Any) -> None:
    """The advise -> study -> advise loop: --study-spec and its knobs."""
    add("--study-spec", type=Path, default=None, metavar="FILE",
        help="write a gssgd study spec for this model and these workers: dense, dense16 "
        "and the methods the step model ranks fastest, each with the same learning-rate "
        "range, then run it with gssgd study FILE")
    add("--study-methods", default="4",
        help="with --study-spec: how many methods besides dense and dense16 (default 4)")
    add("--study-budget", default="3",
        help="with --study-spec: trials per method (default 3)")
    add("--study-seeds", default="3",
        help="with --study-spec: seeds each method's best is re-run at (default 3)")


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


def _architecture(args: argparse.Namespace) -> str | None:
    """The architecture whose study's evidence applies: a shipped model's own (the trainer
    names it), or ``--arch``'s."""
    if args.model is not None:
        from gssgd.train.models import architecture_of as model_architecture

        return model_architecture(args.model)
    return architecture_of(args.arch)


def _model(args: argparse.Namespace) -> tuple[int, tuple[tuple[int, ...], ...], str]:
    """The model's parameters, layer shapes and family, from --model (and --dataset) or
    --params/--arch. A model's shapes and family come from the trainer, which builds it."""
    if args.model is not None:
        if args.arch is not None:
            raise ValueError("--arch goes with --params; a --model has its own shapes")
        from gssgd.train.models import model_family, model_shapes

        shapes = model_shapes(args.model, args.dataset)
        return (sum(math.prod(s) for s in shapes), shapes,
                model_family(args.model, args.dataset))
    if args.dataset is not None:
        raise ValueError("--dataset goes with --model (the data your model is built on)")
    if args.params is None:
        raise ValueError("give the model: --model NAME or MODULE:FUNCTION, or --params N "
                         f"with --arch ({', '.join(ARCHITECTURES)}), e.g. --params 25.6M "
                         "--arch resnet")
    if args.arch is None:
        raise ValueError(
            f"--params {args.params} needs --arch ({', '.join(ARCHITECTURES)}): PowerSGD's "
            "message depends on the layer shapes, and the family decides which study's "
            "evidence applies; e.g. --params 25.6M --arch resnet"
        )
    params = parse_params(args.params)
    return params, layer_shapes(args.arch, params), family_of(args.arch)


def _user_study(dirs: list[str], family: str, architecture: str | None) -> Study:
    """The user's own study (``--evidence``): its summaries, one per worker count."""
    summaries = []
    for d in dirs:
        path = Path(d)
        path = path / "summary.json" if path.is_dir() else path
        if not path.is_file():
            raise ValueError(f"--evidence {d!r} holds no summary.json; give the --out folder "
                             "of a finished gssgd study (gssgd study SPEC --out DIR)")
        summaries.append(json.loads(path.read_text()))
    name = summaries[0].get("study", "your study")
    record = study_from_summaries(f"your study {name}", summaries, family,
                                  architecture=architecture or "",
                                  source=", ".join(str(d) for d in dirs))
    return Study.from_record(name, record)


def _run(args: argparse.Namespace) -> None:
    if args.calibrate is not None:
        _calibrate(args)
        return
    for flag, value in (("--workers", args.workers), ("--link", args.link)):
        if value is None:
            raise ValueError(f"{flag} is required (e.g. --workers 32 --link 10gbit)")
    params, shapes, family = _model(args)
    study_size = (_count("--study-methods", args.study_methods, 0) or 0,
                  _count("--study-budget", args.study_budget, 1) or 1,
                  _count("--study-seeds", args.study_seeds, 1) or 1)  # checked even unused
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
    architecture = _architecture(args)
    study: Study | None | str = "package"
    if args.evidence is not None:
        study = _user_study(args.evidence, family, architecture)
    advice = advise(
        params=params, workers=parse_workers(args.workers),
        link=Link(parse_link(args.link), parse_latency(args.latency)), device=device,
        density=density, shapes=shapes, family=family, fwdbwd_s=fwdbwd_s, methods=methods,
        architecture=architecture,
        warmup_steps=_count("--warmup-steps", args.warmup_steps, 0),
        run_steps=_count("--steps", args.steps, 1) or DEFAULT_RUN_STEPS, study=study,
    )
    if args.study_spec is not None:
        if args.model is None:
            raise ValueError("--study-spec needs --model (a shipped model or your "
                             "MODULE:FUNCTION): a study trains the model itself")
        methods_, budget, seeds = study_size
        text = study_spec(advice, args.model, args.dataset, methods=methods_, budget=budget,
                          seeds=seeds)
        args.study_spec.write_text(text)
        out = f"runs/study-{args.study_spec.stem}"
        print(f"wrote {args.study_spec}; measure it with: gssgd study {args.study_spec} "
              f"--out {out}; then add --evidence {out} to this advise command")
        return
    if args.json:
        json.dump(advice.as_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(render(advice, model=args.model or f"{args.arch}"))


def _calibrate(args: argparse.Namespace) -> None:
    """Fit on the runs, check holding out runs, worker counts and sizes, write fit.json."""
    from gssgd.costmodel import store
    from gssgd.costmodel.fit import calibration_record

    runs = [Path(r) for r in args.calibrate]
    missing = [str(r) for r in runs if not (r / "results.json").exists()]
    if missing:
        raise ValueError(f"not gssgd bench comm runs (no results.json): {', '.join(missing)}")
    record = calibration_record(runs)
    if args.write is None:
        path = store.write("fit.json", record)
    else:
        args.write.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        path = args.write
    print("\n".join(error_lines({**record["held_out"], "validated_on": record["validated_on"]})))
    print(f"wrote {path}")


# --------------------------------------------------------------------------- report


def render(advice: Advice, model: str | None = None) -> str:
    """The human-readable report: every method's step and evidence in three groups, the
    recommendation and why, the evidence's caveats, the device, and the step model's
    held-out error."""
    lines = [
        f"{model + ', ' if model else ''}{advice.params:,} parameters ({advice.family} "
        f"family), {advice.workers} workers on {advice.device.name}, links of {advice.link}, "
        f"density {advice.density:g}",
    ]
    n = advice.run_steps
    groups = (
        ("measured reaching the target (recommendable)", lambda c: c.eligible),
        ("measured short of the target: step time only",
         lambda c: c.evidence.measured and not c.eligible),
        (f"step time only: quality not measured for the {advice.family} family",
         lambda c: not c.evidence.measured),
    )
    for title, member in groups:
        rows = [c for c in advice.candidates if member(c)]
        if not rows:
            continue
        lines += ["", title + ":",
                  f"  {'method':<12} {'step ms':>9} {'compute':>9} {'comm':>9} {'hidden':>8} "
                  f"{'MB/step':>8} {'target s':>9} {'margin':>7}  evidence"]
        for c in rows:
            s, to = c.step, c.target_seconds(n)
            lines.append(
                f"  {c.name:<12} {s.total * 1e3:>9.1f} {s.compute * 1e3:>9.1f} "
                f"{s.communication * 1e3:>9.1f} {s.hidden * 1e3:>8.1f} "
                f"{c.warmup.step_bytes_sent / 1e6:>8.3g} "
                f"{'-' if to is None else f'{to:.4g}':>9} {c.margin:>7.0%}  "
                f"{c.evidence.describe()}")
    rec = advice.recommended
    dense = next((c for c in advice.candidates if c.name == REFERENCE_METHOD), None)
    speedup = "" if dense is None else f", {dense.step.total / rec.step.total:.2f}x dense's step"
    to = rec.target_seconds(n)
    lines += [
        "",
        f"recommended: {rec.name} ({rec.step.total * 1e3:.1f} ms per step{speedup}"
        + ("" if to is None else f"; {to:.4g} s for dense's {n} steps to the target") + ")",
        f"  why:       {advice.why}",
    ]
    fastest = advice.fastest_step
    if fastest is not rec and not fastest.eligible:
        lines.append(f"  not {fastest.name}, the fastest step: {fastest.evidence.describe()}")
    lines += [
        f"  train:     {advice.train_command()}",
        f"  DDP:       {advice.hook_call()}",
        "",
        *_evidence_lines(advice),
        _device_line(advice),
        *error_lines(held_out_error()),
    ]
    return "\n".join(lines)


def _evidence_lines(advice: Advice) -> list[str]:
    study = advice.study
    if study is None:
        return [f"evidence: no study measured a {advice.family} model, so nothing but dense is "
                "recommended; measure the others on your model: add --study-spec FILE"]
    wanted = advice.architecture
    other = (f"; its model: {study.architecture}, as no study measured a {wanted}"
             if wanted and study.architecture and study.architecture != wanted else "")
    sizes = ", ".join(f"P={p}: {d:,} parameters" for p, d in sorted(study.d.items()))
    out = [f"evidence: {study.title} ({study.source}{other}); {sizes or 'size not recorded'}; "
           f"target {study.target}. 'target s' is dense's --steps {advice.run_steps} times "
           "each method's measured steps ratio. A method is recommendable where it reached "
           "the target at every worker count the study ran it at. Its margin: the step "
           "model's communication error for its family times the communication's share of "
           "its step, plus 5 % per doubling of workers and per tenfold in size between the "
           "study and you."]
    out += [f"  caveat: {c}" for c in study.caveats]
    if other or any(c.evidence.confidence == "far" for c in advice.candidates
                    if c.evidence.measured):
        out.append("  for evidence on your own model: add --study-spec FILE (a gssgd study "
                   "spec), run it, then --evidence its --out folder")
    return out


def _device_line(advice: Advice) -> str:
    record = device_record(advice.device.name)
    estimated = record.get("estimated") or {}
    note = "".join(f"; {k} estimated, not measured" for k in sorted(estimated))
    return f"device: {advice.device.summary}{note}"


def _pct(record: dict[str, Any]) -> str:
    return f"{record['median_abs_rel_error']:.1%} (max {record['max_abs_rel_error']:.0%})"


def error_lines(held: dict[str, Any]) -> list[str]:
    """The step model's held-out error in words: the step's and the communication's
    medians by run, worker count and size, each family's communication error (its margin
    before scaling), and what the runs covered."""
    cover = held["validated_on"]
    families = sorted(held["run"]["communication"]["per_family"])
    per = ", ".join(f"{f} {margin_of(held, f):.0%}" for f in families)
    rates = "-".join(f"{r / 1e9:g} Gbit/s" if r >= 1e9 else f"{r / 1e6:g} Mbit/s"
                     for r in (cover["link_bps"][0], cover["link_bps"][-1]))
    by = (("run", "by run"), ("workers", "by worker count"), ("d", "by size"))
    return [
        "step model error, held out (median): the step "
        + ", ".join(f"{words} {_pct(held[key])}" for key, words in by)
        + "; its communication alone "
        + ", ".join(f"{words} {_pct(held[key]['communication'])}" for key, words in by)
        + f"; per family (communication, the worst hold-out): {per}. Its first choice was "
        f"the measured fastest or within 10 % in {held['recommended_within_10pct']} of "
        f"{held['recommendation_runs']} runs.",
        f"  validated on this machine's CPU over emulated links ({rates}), P = "
        f"{', '.join(map(str, cover['workers']))}, d = "
        f"{', '.join(f'{d / 1e6:g}M' for d in cover['d'])} ({held['runs']} runs), with each "
        "run's measured compute; GPU-cluster predictions (the device's compute, NCCL) are "
        "unvalidated until a device measures them.",
    ]
