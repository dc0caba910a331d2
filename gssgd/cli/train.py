"""``gssgd train``: data-parallel training with one aggregation method.

The flags map onto :class:`gssgd.train.config.TrainConfig`: the run's settings one to one,
and the method's options: ``--opt NAME=VALUE`` sets any of them (a plugin's too) by its
name, and the named flags (``--rows``, ``--local-momentum`` for ``momentum``, ...) write the
same options (:meth:`TrainConfig.build <gssgd.train.config.TrainConfig.build>`).
``gssgd compare`` reuses the flags through :func:`add_training_flags` and
:func:`settings_from_args`.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from gssgd.aggregators.feedback import FEEDBACKS
from gssgd.aggregators.gs import ALLREDUCES
from gssgd.aggregators.options import PAYLOAD_DTYPES
from gssgd.amp import AMP_DTYPES
from gssgd.cli.errors import run_command
from gssgd.ddp.settings import OVERLAP_MODES
from gssgd.local_steps import DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM
from gssgd.lr_schedule import LR_SCHEDULES
from gssgd.methods import METHODS
from gssgd.optim import UNSEEN_RULES, VARIANCES
from gssgd.recipes import (
    ADAMW_FREEZE_STEPS,
    ADAMW_LM_LR,
    ADAMW_LR,
    DENSE_RECIPE,
    SPARSE_RECIPE,
    SPARSE_WARMUP_STEPS,
    TEXT_RECIPE,
    TEXT_SPARSE_RECIPE,
)
from gssgd.train.checks import OPTIMIZERS
from gssgd.train.config import TrainConfig
from gssgd.train.launch import DEVICES
from gssgd.train.loop import STATUS_COMPLETED, run_training
from gssgd.train.method_settings import OPTION_FLAGS, merge_opts, parse_opt, setting_applies_to
from gssgd.train.models import MODELS

__all__ = ["Formatter", "add_parser", "add_training_flags", "run", "settings_from_args"]


def method_list() -> str:
    """The registered methods, one line each (for ``--help``)."""
    return "\n".join(f"  {m.name:<14} {m.summary}" for m in METHODS.values())


DESCRIPTION = """\
Train a model data-parallel on N workers, averaging gradients with one method:

{methods}

Started plainly, it spawns --workers local processes (gloo over the loopback
interface). Under torchrun it is one worker of torchrun's group (gloo on the CPU,
NCCL with --device cuda). Rank 0 shows progress and writes OUT/metrics.jsonl (one
line per step), OUT/summary.json and OUT/checkpoints/ (atomic; the newest two kept).
"""

EPILOG = """\
examples:
  gssgd train --dataset digits --workers 2 --steps 50           # a quick run
  gssgd train --method gs --dataset mnist --model cnn --workers 4 --steps 500 \\
              --density 0.001 --out runs/gs
  gssgd train --method gs --opt rows=3 --opt candidates=16        # any option by name
  gssgd train --plugin examples.randomk --method randomk --opt seed=3   # a plugin's option
  gssgd train --method topk --checkpoint-every 100 --out runs/t   # then, after a crash:
  gssgd train --method topk --resume runs/t                       # continues to --steps
  torchrun --standalone --nproc-per-node 4 -m gssgd.cli.main train --method gs

exit status: 0 trained, 1 the run failed or stopped (non-finite loss, a worker died),
2 invalid flags.
"""


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Keeps the description's layout and shows each flag's default.

    Flags whose help already states the default, switches, and None defaults (resolved
    later, e.g. by the method) show none.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or isinstance(action.default, bool) or "default" in text:
            return text
        return super()._get_help_string(action)


def _fail_at(text: str) -> tuple[int, int]:
    """Parse ``RANK:STEP``."""
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not RANK:STEP with two integers >= 0, e.g. 1:10"
        )
    return int(parts[0]), int(parts[1])


def add_training_flags(parser: argparse.ArgumentParser, compare: bool = False) -> None:
    """Add the flags shared by ``train`` and ``compare``, group by group.

    Args:
        parser: the subcommand's parser.
        compare: leave out what ``compare`` sets itself (--method, --out, --resume,
            --overwrite, --fail-at) and use its defaults.
    """
    _what_flags(parser, compare)
    _optimisation_flags(parser)
    _worker_flags(parser)
    _aggregation_flags(parser)
    _local_step_flags(parser)
    _output_flags(parser, compare)
    if not compare:
        _fault_flags(parser)


def _local_step_flags(parser: argparse.ArgumentParser) -> None:
    local = parser.add_argument_group(
        "local steps", "DiLoCo-style: H inner steps with no communication, then an outer step "
        "that aggregates the weights' change (the pseudo-gradient) with --method and its error "
        "feedback (a dense method: DiLoCo; a sparse one: SparseLoCo-style) and applies it "
        "with Nesterov SGD on every worker")
    local.add_argument("--local-steps", type=int, default=None, metavar="H",
                       help="inner steps per outer step (default: off, every step aggregates); "
                       "the inner optimizer takes dense's recipe (--optimizer, --lr)")
    local.add_argument("--outer-lr", type=float, default=None,
                       help=f"the outer step's learning rate (default {DILOCO_OUTER_LR}, DiLoCo's)")
    local.add_argument("--outer-momentum", type=float, default=None,
                       help=f"the outer step's Nesterov momentum (default "
                       f"{DILOCO_OUTER_MOMENTUM}, DiLoCo's)")
    local.add_argument("--outer-error-decay", type=float, default=None, metavar="BETA",
                       help="decay the outer step's residual by BETA before each "
                       "pseudo-gradient joins it (default 1: classic error feedback); "
                       "SparseLoCo's recipe: --outer-error-decay 0.95 --outer-momentum 0 "
                       "--outer-lr 1 with a sparse method")


def _applies(name: str) -> str:
    """``(topk, gs; ...)``: the methods a setting applies to, from the registry."""
    return ", ".join(setting_applies_to(name))


def _what_flags(parser: argparse.ArgumentParser, compare: bool) -> None:
    c = TrainConfig  # the defaults live in one place: the dataclass
    what = parser.add_argument_group("what to train")
    if not compare:
        what.add_argument("--method", default=c.method,
                          help="how gradients are averaged: a method listed above (or one a "
                          "--plugin registers)")
    what.add_argument("--dataset", default=c.dataset,
                      help="digits, mnist, fashion-mnist, shakespeare, npz:PATH (x_train, "
                      "y_train, x_test, y_test), text:PATH (UTF-8) or MODULE:FUNCTION (your "
                      "function that returns the data; examples/user_model.py)")
    what.add_argument("--model", default=None, metavar=f"{{{','.join(MODELS)}}} or MODULE:FUNCTION",
                      help="the model: a shipped one or MODULE:FUNCTION (your function that "
                      "builds it from the data; examples/user_model.py); default: cnn for "
                      "images, mlp for flat features, lm for text")
    what.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                      help="import MODULE first, on every worker too (it registers methods of "
                      "your own with gssgd.register_method); repeatable")


def _optimisation_flags(parser: argparse.ArgumentParser) -> None:
    c = TrainConfig
    opt = parser.add_argument_group("optimisation")
    opt.add_argument("--steps", type=int, default=c.steps,
                     help="total steps (a resumed run continues up to this many)")
    opt.add_argument("--batch-size", type=int, default=c.batch_size,
                     help="samples (text: windows) per worker per step")
    opt.add_argument("--optimizer", choices=OPTIMIZERS, default=c.optimizer,
                     help="sgd (default) or adamw")
    opt.add_argument("--lr", type=float, default=None,
                     help="learning rate (the peak of --lr-schedule); default: SGD's recipe, "
                     f"{DENSE_RECIPE[0]} for dense methods, {SPARSE_RECIPE[0]} for sparse ones, "
                     f"on a language model {TEXT_RECIPE[0]} for dense methods and "
                     f"{TEXT_SPARSE_RECIPE[0]} for sparse ones; AdamW: {ADAMW_LR} (the character "
                     f"LSTM: {ADAMW_LM_LR})")
    opt.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=c.lr_schedule,
                     help="the learning rate after its warm-up: constant (default) or cosine "
                     "(a half cosine from --lr down to 0 at the last step)")
    opt.add_argument("--lr-warmup-steps", type=int, default=c.lr_warmup_steps, metavar="N",
                     help="a linear warm-up of the learning rate over the first N steps "
                     "(default 0: none; a tenth of the run is usual)")
    opt.add_argument("--momentum", type=float, default=None,
                     help="SGD momentum, applied after aggregation; default: "
                     f"{DENSE_RECIPE[1]} for dense methods, {SPARSE_RECIPE[1]} for sparse ones "
                     f"on images (there it hurt the error-fed update); on a language model "
                     f"{TEXT_RECIPE[1]} for dense methods, and for sparse ones 0 with the "
                     f"aggregator's local momentum {TEXT_SPARSE_RECIPE[2]} (DGC's; with "
                     "--momentum given, none)")
    opt.add_argument("--weight-decay", type=float, default=c.weight_decay,
                     help="weight decay (AdamW: decoupled); default 0")
    opt.add_argument("--betas", type=float, nargs=2, default=c.betas, metavar=("B1", "B2"),
                     help="AdamW's betas (default 0.9 0.999)")
    opt.add_argument("--freeze-variance-after", type=int, default=None, metavar="N",
                     help="AdamW, sparse methods: 1-bit Adam's recipe: N dense AdamW steps, "
                     "then the momentum compressed and the variance frozen or kept moving (sets "
                     "--start-iter N, --feedback onebit, --local-momentum B1); default "
                     f"{ADAMW_FREEZE_STEPS} unless --feedback, --start-iter or "
                     "--local-momentum is given; 0 = off (AdamW on the error-fed update)")
    opt.add_argument("--adam-variance", choices=VARIANCES, default=None,
                     help="with --freeze-variance-after N: the variance after those N steps, "
                     "frozen (default, 1-bit Adam's) or moving (updated from the averaged "
                     "gradient the compressed momentum implies)")
    opt.add_argument("--adam-unseen", choices=UNSEEN_RULES, default=None,
                     help="with the frozen variance: coordinates the dense steps gave no "
                     "gradient (an embedding row not seen yet) keep their variance moving "
                     "(default), are masked, floored at their tensor's mean, or frozen at 0 "
                     "(steps of lr*m/eps: the old rule)")
    opt.add_argument("--seq-len", type=int, default=c.seq_len, help="characters per window (text)")
    opt.add_argument("--seed", type=int, default=c.seed,
                     help="seeds the model init, the batches and the sketch hashes")
    opt.add_argument("--amp", choices=tuple(AMP_DTYPES), default=None,
                     help="mixed precision: fp16 (autocast and a GradScaler; an overflowing "
                     "step is skipped on every worker and the scale backs off) or bf16 "
                     "(autocast, no scaler); default: float32")


def _worker_flags(parser: argparse.ArgumentParser) -> None:
    c = TrainConfig
    run_ = parser.add_argument_group("workers")
    run_.add_argument("--workers", type=int, default=None,
                      help="worker processes to spawn (default: 4; under torchrun: its WORLD_SIZE)")
    run_.add_argument("--device", choices=DEVICES, default=c.device,
                      help="cpu (gloo), cuda (NCCL, one GPU per worker) or auto")
    run_.add_argument("--threads", type=int, default=c.threads, help="torch threads per worker")
    run_.add_argument("--simulate", action="store_true",
                      help="run the --workers ranks as a simulated world in this process (the "
                      "same aggregators and byte counts, ranks as coroutines): P = 16 to 256 "
                      "and more on one machine; bytes are exact, times are not step times")
    run_.add_argument("--global-batch", type=int, default=None, metavar="N",
                      help="samples per step over all workers (overrides --batch-size with "
                      "N / workers): the optimisation stays the same when --workers changes")
    run_.add_argument("--timeout", type=float, default=c.timeout, metavar="SECONDS",
                      help="how long a collective waits for a peer before the run fails")


def _aggregation_flags(parser: argparse.ArgumentParser) -> None:
    agg = parser.add_argument_group(
        "aggregation", "the method's options and the hook's settings; a setting the method "
        "does not take is an error. --opt NAME=VALUE sets any option of the method by its "
        "name; the named flags are the common ones"
    )
    agg.add_argument("--opt", dest="options", action="append", type=_opt, default=None,
                     metavar="NAME=VALUE",
                     help="set the method's option NAME (a field of its options dataclass, "
                     "a plugin's too), VALUE read as its type (an integer, a number, true/false, "
                     "a string or none), e.g. --opt rows=3; repeatable. A named flag below is "
                     "the same option (--local-momentum is --opt momentum, --payload-dtype "
                     "--opt dtype, --powersgd-rank --opt rank)")
    _sparse_flags(agg)
    _sketch_flags(agg)
    _hook_flags(agg)


def _opt(text: str) -> tuple[str, str]:
    """argparse's type for ``--opt``: ``NAME=VALUE`` as ``(NAME, VALUE)``."""
    try:
        return parse_opt(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _sparse_flags(agg: argparse._ArgumentGroup) -> None:
    """The options of the methods that send k of d coordinates with error feedback."""
    sparse = agg.add_mutually_exclusive_group()
    sparse.add_argument("--density", type=float, default=None,
                        help="fraction of coordinates sent, k = max(1, round(density*d)) "
                        f"({_applies('density')}; default 0.01)")
    sparse.add_argument("--k", type=int, default=None,
                        help="coordinates sent per worker, instead of --density")
    agg.add_argument("--local-momentum", type=float, default=None,
                     help="the error feedback's momentum, with momentum stopping: each "
                     "worker's own (--feedback ef: DGC's; ef21: EF21-SGDM's), the "
                     "aggregator's on the averaged update (global), or the sketch's "
                     f"(fetchsgd) ({_applies('local_momentum')}; default 0 = off, "
                     f"{TEXT_SPARSE_RECIPE[2]} on a language model without --momentum)")
    agg.add_argument("--warmup-steps", type=int, default=None,
                     help="density warm-up (DGC): the first N aggregation steps send "
                     "exponentially fewer coordinates, from --warmup-density down to --density "
                     f"({_applies('warmup_steps')}; default {SPARSE_WARMUP_STEPS}; 0 = off)")
    agg.add_argument("--warmup-density", type=float, default=None,
                     help="the density of the first warm-up step (default 0.25)")
    agg.add_argument("--local-clip", type=float, default=None, metavar="NORM",
                     help="local gradient clipping (DGC): each worker's gradient is scaled to "
                     f"a norm of at most NORM/sqrt(P) ({_applies('local_clip')}; default off)")
    agg.add_argument("--feedback", choices=FEEDBACKS, default=None,
                     help=f"{_applies('feedback')}: error feedback: ef (classic: the sparse "
                     "update goes to the optimizer), ef21 (EF21-SGDM: a dense estimate of the "
                     "workers' mean (momentum) gradient, kept alike on every worker), global "
                     "(momentum on the averaged update, masked where coordinates are "
                     "delivered) or fetchsgd (the sketching methods: FetchSGD's momentum and "
                     "error in sketch space; with --no-exact and --rows > 1); --local-momentum "
                     "is its momentum; default ef")
    agg.add_argument("--payload-dtype", choices=tuple(PAYLOAD_DTYPES), default=None,
                     help=f"{_applies('payload_dtype')}: dtype of the all-reduced gradient "
                     "(default float32; 16 bits are scaled by 1/P first)")
    agg.add_argument("--powersgd-rank", type=int, default=None,
                     help=f"{_applies('powersgd_rank')}: matrix approximation rank (default 2)")


def _sketch_flags(agg: argparse._ArgumentGroup) -> None:
    """The options of the methods that send a Count Sketch."""
    agg.add_argument("--rows", type=int, default=None,
                     help=f"sketch rows, odd ({_applies('rows')}; default 1)")
    agg.add_argument("--cols", type=int, default=None,
                     help="sketch columns (default 40·k, capped at d/(4 rows); from 16 "
                     "workers 16·k)")
    agg.add_argument("--candidates", type=int, default=None,
                     help="m: the sketch proposes m*k candidates (default 32, capped at m*k <= "
                     "d/8; from 16 workers 8)")
    agg.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None,
                     help=f"{_applies('exact')}: fetch exact sums of the candidates (default --exact)")
    agg.add_argument("--allreduce", choices=ALLREDUCES, default=None,
                     help=f"{_applies('allreduce')}: how sketches are summed (default "
                     "backend, whose ring bytes do not grow with P; recursive_doubling takes "
                     "log2 P rounds, fewer messages on fast links; halving_doubling the "
                     "ring's bytes in 2 log2 P rounds)")
    agg.add_argument("--table-dtype", choices=tuple(PAYLOAD_DTYPES), default=None,
                     help=f"{_applies('table_dtype')}: dtype of the sketch tables on the wire "
                     "(default float16, half float32's bytes; streamed gs: float32)")
    agg.add_argument("--guard", choices=("grow", "raise", "off"), default=None,
                     help=f"{_applies('guard')}: when an audit finds the sketch collapsed, grow "
                     "it (default), raise, or off")
    agg.add_argument("--prefilter", type=int, default=None, metavar="F",
                     help=f"{_applies('prefilter')}: each worker sketches only its own F*k "
                     "largest coordinates (a local pre-filter); 0: all of them (default 8)")
    agg.add_argument("--reuse", type=int, default=None, metavar="R",
                     help=f"{_applies('reuse')}: sketch only every R-th step; the steps between "
                     "fetch the exact sums at the last sketched candidates, sending no table "
                     "(Ok-Topk's reuse; default 1: sketch every step)")
    agg.add_argument("--chunk", type=int, default=None, metavar="C", help=f"{_applies('chunk')}: "
                     "select each chunk of C coordinates' share (DeMo, SparseLoCo; default 0: off)")


def _hook_flags(agg: argparse._ArgumentGroup) -> None:
    """The DDP hook's settings (every aggregator method's)."""
    agg.add_argument("--start-iter", type=int, default=None,
                     help="steps of plain all-reduce before compression starts (default 2)")
    agg.add_argument("--per-bucket", action="store_true",
                     help="compress each DDP bucket apart instead of the whole model at once")
    agg.add_argument("--overlap", choices=OVERLAP_MODES, default=None,
                     help=f"{_applies('overlap')}: 'stream' cuts gs's sketch table by DDP "
                     "bucket and all-reduces each bucket's part during backward; 'buckets' "
                     "(with --per-bucket) averages each bucket on a thread while backward "
                     "runs (default none: each bucket before backward goes on)")
    agg.add_argument("--bucket-cap-mb", type=float, default=None,
                     help="DDP bucket size in MB (default: DDP's 25); smaller buckets let a "
                     "per-bucket hook overlap communication with the backward pass")


def _output_flags(parser: argparse.ArgumentParser, compare: bool) -> None:
    c = TrainConfig
    out = parser.add_argument_group("output")
    if not compare:
        out.add_argument("--out", default=None, metavar="DIR",
                         help="run directory (default: runs/METHOD-DATASET-TIME, or the "
                         "--resume directory)")
    out.add_argument("--eval-every", type=int, default=c.eval_every, metavar="N",
                     help="evaluate on the test split every N steps and after the last "
                     "(0: last only)")
    out.add_argument("--checkpoint-every", type=int, default=c.checkpoint_every, metavar="N",
                     help="checkpoint every N steps and after the last (0: last only)")
    if not compare:
        out.add_argument("--resume", default=None, metavar="DIR",
                         help="continue the run in DIR (its --out) or from a checkpoint file")
        out.add_argument("--overwrite", action="store_true",
                         help="start afresh in an --out that holds an earlier run (deletes it)")
    out.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    if not compare:
        out.add_argument("--tensorboard", default=None, metavar="DIR",
                         help="also write the step scalars (loss, accuracy, bytes, lr, step "
                         "time) as TensorBoard events to DIR (needs: pip install tensorboard)")


def _fault_flags(parser: argparse.ArgumentParser) -> None:
    fault = parser.add_argument_group("fault injection")
    fault.add_argument("--fail-at", type=_fail_at, default=None, metavar="RANK:STEP",
                       help="that rank exits abruptly at that step (reliability tests)")
    fault.add_argument("--stall-at", type=_fail_at, default=None, metavar="RANK:STEP",
                       help="that rank stops answering at that step, alive but silent "
                       "(reliability tests)")


#: The argparse destinations that are TrainConfig fields (everything but method/methods)
#: or named option flags.
_SETTINGS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "method"
                  ) + tuple(OPTION_FLAGS)


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The :meth:`TrainConfig.build <gssgd.train.config.TrainConfig.build>` keyword
    arguments the parsed flags hold: the run's settings, the named option flags, and
    ``--opt`` as ``options`` (its values still text: the method's option types read them).

    Raises:
        ValueError: one ``--opt`` name given two values.
    """
    settings = {name: getattr(args, name) for name in _SETTINGS if hasattr(args, name)}
    if "plugins" in settings:
        settings["plugins"] = tuple(settings["plugins"])
    if "options" in settings:
        settings["options"] = merge_opts(settings["options"])
    return settings


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    """Register ``gssgd train``."""
    parser = subparsers.add_parser(
        "train",
        help=summary,
        description=DESCRIPTION.format(methods=method_list()),
        epilog=EPILOG,
        formatter_class=Formatter,
        allow_abbrev=False,
    )
    add_training_flags(parser)
    parser.set_defaults(run=run, parser=parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Train; return the exit status (0 done, 1 failed or stopped, 2 invalid settings,
    130 interrupted)."""

    def body() -> int:
        summary = run_training(TrainConfig.build(args.method, **settings_from_args(args)))
        if summary is None:  # a torchrun rank other than 0
            return 0
        return 0 if summary["status"] == STATUS_COMPLETED else 1

    return run_command(
        "gssgd train", body, interrupted="continue from the last checkpoint with --resume OUT"
    )
