"""``kvsched replay`` and ``kvsched profile``: run schedules and microbenchmarks on a real model.

Both need torch (``pip install -e .[gpu]``); without it they print one line
saying how to install it. ``kvsched calibrate --from-replay`` (registered in
:mod:`kvsched.commands.costmodel`) fits a replay table and needs no torch.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvsched.commands.common import (
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    check_output_path,
    check_outputs,
    interrupted_exit,
    positive_int,
    seed_int,
    write_text_atomic,
)
from kvsched.errors import InputError
from kvsched.instances.io import check_output_folder
from kvsched.threads import check_threads

#: dtypes for which the oracle must hold exactly.
EXACT_DTYPES = ("float32", "float64")
#: The files ``kvsched profile`` writes into its --out folder (:func:`kvsched.executor.profile.run_profile`).
PROFILE_FILES = ("mlp.csv", "attention.csv", "batches.csv", "batches.json")
#: The most --repeat and --warmup take (:data:`kvsched.executor.runner.MAX_REPEAT`, ``MAX_WARMUP``; that
#: module imports torch, and a bad flag is refused before torch loads).
MAX_COUNT = 1000


def _count(low: int) -> Any:
    """An argparse type: a whole number from ``low`` to :data:`MAX_COUNT` (``--repeat 1000000000`` ran until
    killed, and Ctrl-C then kept nothing)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= MAX_COUNT:
            raise argparse.ArgumentTypeError(f"{text!r} must be from {low} to {MAX_COUNT}")
        return value

    return parse


def _prediction_model(args: argparse.Namespace, instance: Any) -> tuple[Any, str]:
    """The cost model whose predictions go next to the measurements, and how it was named.

    ``--cost-param`` alone changes the instance's own model (as in every command), and a model that
    cannot time a batch (``slot=0``) is one error naming the flags, before any model is built.
    """
    from kvsched.commands.common import time_model_from_args
    from kvsched.schedule.validate import instance_cost_model

    chosen = time_model_from_args(args, instance.time_model)
    if chosen is None:
        return instance_cost_model(instance), f"the instance's {instance.time_model.name!r}"
    from kvsched.commands.common import checked_cost_model

    # A model whose batches take no time, or overflow, on this instance (the check simulate makes).
    cost = checked_cost_model(replace(instance, time_model=chosen))
    if args.cost_model is not None:
        return cost, args.cost_model
    given = ", ".join(args.cost_param)
    return cost, f"the instance's {chosen.name!r} with {given}"


def _durations_model(instance: Any, schedule: Any, predict: Any, given: bool) -> Any:
    """The cost model the schedule's durations were made with: the instance's, or ``predict`` when the
    command line names one (a schedule made by ``simulate --cost-model X`` replays with
    ``--cost-model X``). An illegal schedule is a :class:`ScheduleError` here, before any model is built:
    its first violation may lie at the end, after minutes of tensor work.
    """
    from kvsched.schedule.records import Rule, ScheduleError
    from kvsched.schedule.validate import instance_cost_model, replay

    own = instance_cost_model(instance)
    found = replay(instance, schedule, own, strict=False).violations
    only_durations = found and all(v.rule == Rule.WRONG_DURATION for v in found)
    if only_durations and given and not replay(instance, schedule, predict, strict=False).violations:
        return predict
    if found:
        raise ScheduleError(found)
    return own


def _durations_hint(violations: Any, meta: dict[str, Any], instance: Any, given: bool) -> str:
    """A hint where every violation is a wrong duration: the schedule was made with another cost model
    (``simulate --cost-model X``), and replay needs that model named; else ``""``."""
    from kvsched.schedule.records import Rule

    if not all(v.rule == Rule.WRONG_DURATION for v in violations):
        return ""
    own = instance.time_model.name
    named = meta.get("cost_model")  # a producer that records its model (the simulator does not, yet)
    if isinstance(named, str) and named:
        return f"; it was made under cost model {named!r}: pass --cost-model {named}"
    if given:
        return (
            f"; its durations are neither the instance's cost model's ({own!r}) nor --cost-model's: pass the "
            "model it was made with"
        )
    return (
        f"; every violation is a duration: it was made with another cost model than the instance's "
        f"({own!r}), e.g. by simulate --cost-model X: pass the same --cost-model X"
    )


def _model(args: argparse.Namespace) -> Any:
    from kvsched.executor.device import require_torch, resolve_device, resolve_dtype

    if args.threads:  # before torch loads: --threads 100000 crashed torch (segmentation fault)
        check_threads(args.threads)
    torch = require_torch()
    from kvsched.executor.model import Decoder, decoder_config

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = decoder_config(args.model, args.layers, str(dtype).removeprefix("torch."), args.seed)
    return Decoder(cfg, device)


def _engine(args: argparse.Namespace, model: Any) -> Any:
    """The engine options of the command line (None = the device's default)."""
    from kvsched.executor.engine import engine_options

    return engine_options(
        model.device,
        attention=args.attention,
        kernels=args.kernels,
        prefill=args.prefill,
        graphs=args.cuda_graphs,
        compile=args.compile,
        mixed_graphs=args.mixed_graphs,
        splits=args.kv_splits,
        partition=args.kv_partition,
        tile=args.tile,
    )


def _errors_row(table: Table, label: str, s: Any) -> None:
    table.add_row(label, str(s.n), f"{s.mean:.2%}", f"{s.p50:.2%}", f"{s.p90:.2%}", f"{s.max:.2%}")


def _error_table(title: str) -> Table:
    table = Table(title=title)
    for col in ("", "batches", "mean", "p50", "p90", "max"):
        table.add_column(col, justify="left" if not col else "right")
    return table


def cmd_replay(args: argparse.Namespace) -> int:
    from kvsched.executor.device import require_torch
    from kvsched.executor.measure import output_sidecar

    # The metadata JSON beside the table is an output too: it must not replace an input or the table.
    # (None beside a device, -o /dev/null: nothing is written there.)
    if args.oracle_limit is not None and not args.check_oracle:
        # A limit alone was silently ignored: whoever typed it believes the oracle ran.
        raise InputError(
            "--oracle-limit: limits --check-oracle's check; add --check-oracle (or drop the limit)"
        )
    metadata = output_sidecar(args.out) if args.out else None
    side = [("--out's metadata", metadata)] if metadata is not None else []
    check_outputs(args, ["out", "trace"], inputs=["instance", "schedule"], extra_outputs=side)
    require_torch()
    from kvsched.executor.measure import ErrorSummary, end_to_end, write_replay
    from kvsched.executor.oracle import check_oracle
    from kvsched.executor.runner import replay_on_model
    from kvsched.instances.io import load_instance
    from kvsched.schedule.io import load_schedule
    from kvsched.schedule.records import ScheduleError
    from kvsched.stop import INTERRUPTS, interrupted

    instance = load_instance(args.instance)
    schedule = load_schedule(args.schedule, instance)
    predict, predict_label = _prediction_model(args, instance)
    given = args.cost_model is not None or bool(args.cost_param)
    try:
        durations = _durations_model(instance, schedule, predict, given)
    except ScheduleError as exc:
        more = len(exc.violations) - 1
        print(
            f"kvsched replay: error: {args.schedule} is not a legal schedule of {args.instance}: "
            f"{exc.violations[0]}"
            + (f" (and {more} more; kvsched validate lists them)" if more else "")
            + _durations_hint(exc.violations, schedule.meta, instance, given),
            file=sys.stderr,
        )
        return EXIT_INVALID
    model = _model(args)
    options = _engine(args, model)
    console = Console()
    err = Console(stderr=True, soft_wrap=True)  # each note and error one line, not cut at 80 columns
    if predict.name == "unit":
        err.print(
            "kvsched replay: note: the cost model is 'unit' (one slot a batch), not seconds; pass --cost-model "
            "with a calibrated coefficient set to compare predictions with measured seconds",
            markup=False,
            highlight=False,
        )
    result = replay_on_model(
        model,
        instance,
        schedule,
        predict=predict,
        durations=durations,
        pool_capacity=args.pool_capacity,
        repeat=args.repeat,
        warmup=args.warmup,
        seed=args.prompt_seed,
        progress=args.progress,
        options=options,
    )
    table = result.table
    measured, predicted = table["measured_s"].to_numpy(), table["predicted_s"].to_numpy()
    summary = ErrorSummary.of(measured, predicted)
    cfg = model.cfg
    scaled = (
        f", times x {cfg.layer_scale:g} for {cfg.shape.layers} layers"
        if cfg.layers != cfg.shape.layers
        else ""
    )
    title = (
        f"{cfg.name} ({cfg.layers} layers{scaled}) on {result.meta['device_name']}: "
        f"batch time, measured vs {predict_label}"
    )
    meta: dict[str, Any] = {
        **result.meta,
        "instance": instance.name or Path(args.instance).name,
        "schedule": Path(args.schedule).name,
        "schedule_meta": schedule.meta,
        "predicted_with": predict_label,
        "summary": summary.as_dict(),
    }
    if result.interrupted:
        return _keep_interrupted(args, table, meta, title, summary, console, err)
    out = _error_table(title)
    _errors_row(out, "relative error", summary)
    console.print(out)
    e2e = end_to_end(instance, schedule, measured, predicted)
    e2e_table = Table(title="end to end (each timeline retimed from the same batches)")
    for col in ("metric", "measured", "predicted", "rel. error"):
        e2e_table.add_column(col, justify="left" if col == "metric" else "right")
    for name, row in e2e.iterrows():
        e2e_table.add_row(str(name), f"{row.measured:.6g}", f"{row.predicted:.6g}", f"{row.rel_err:.2%}")
    console.print(e2e_table)
    console.print(
        f"replayed {len(table)} batches: {measured.sum():.4g} s measured, {predicted.sum():.4g} predicted",
        highlight=False,
        soft_wrap=True,
    )
    meta["end_to_end"] = {str(k): v for k, v in e2e.to_dict(orient="index").items()}
    status, stopped = 0, False
    if args.check_oracle:
        try:
            report = check_oracle(model, instance, result.prompts, result.generated, args.oracle_limit)
        except INTERRUPTS as exc:  # Ctrl-C in the oracle: the measured table is still written
            if not interrupted(exc):
                raise
            stopped = True
            meta["oracle"] = {"interrupted": True}
        else:
            console.print(report.summary(), markup=False, highlight=False, soft_wrap=True)
            meta["oracle"] = report.as_dict()
            if not report.ok and cfg.dtype in EXACT_DTYPES:
                err.print(
                    f"kvsched replay: the oracle fails in {cfg.dtype}, where it must hold exactly",
                    markup=False,
                    highlight=False,
                )
                status = EXIT_INVALID
    _say_written(err, args.out, write_replay(table, meta, args.out, "--out"))
    if args.trace and not stopped:
        from kvsched.commands.outputs import write_trace
        from kvsched.schedule.retime import retime

        # The measured timeline: the same batches back to back with their measured seconds.
        write_trace(args.trace, instance, retime(instance, schedule, measured), name="measured", unit="s")
        err.print(
            f"wrote the Perfetto trace (measured timeline) to {args.trace}", markup=False, highlight=False
        )
    return interrupted_exit("replay", stopped, status)


def _say_written(err: Console, out: str, written: Path | None) -> None:
    """Say on stderr where the replay table and its metadata went."""
    if written is None:
        err.print(
            f"wrote the replay table to {out}; its metadata was not written ({out} is not a "
            "regular file, and NAME.json beside it would be a new file in its folder)",
            markup=False,
            highlight=False,
        )
    else:
        err.print(
            f"wrote the replay table to {out} and its metadata to {written}", markup=False, highlight=False
        )


def _keep_interrupted(
    args: argparse.Namespace,
    table: Any,
    meta: dict[str, Any],
    title: str,
    summary: Any,
    console: Console,
    err: Console,
) -> int:
    """After Ctrl-C in the replay: write the batches measured before it (metadata ``interrupted: true``)
    and say what was kept; exit 130. The end-to-end metrics, the oracle and the trace need every batch."""
    from kvsched.executor.measure import write_replay

    done, total = meta["batches_measured"], meta["batches"]
    if not done:
        err.print(
            f"kvsched replay: interrupted (Ctrl-C) before any batch was measured; nothing written to {args.out}",
            markup=False,
            highlight=False,
        )
        return EXIT_INTERRUPTED
    out = _error_table(f"{title} (interrupted: {done} of {total} batches)")
    _errors_row(out, "relative error", summary)
    console.print(out)
    written = write_replay(table, meta, args.out, "--out")
    _say_written(err, args.out, written)
    err.print(
        f"kvsched replay: kept the {done} of {total} batches measured before Ctrl-C in {args.out}"
        + (" (its metadata says interrupted: true)" if written else "")
        + "; no end-to-end metrics, oracle or trace: they need every batch",
        markup=False,
        highlight=False,
    )
    return interrupted_exit("replay", True)


def cmd_profile(args: argparse.Namespace) -> int:
    from kvsched.executor.device import require_torch

    # Every file written is an output like any other: never into the bundled examples, never over an input
    # (a coefficient file --cost-model names) or a file of another kind (an instance, a CSV trace).
    folder = Path(args.out)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--out: {folder} is a file, not a folder")
    check_outputs(
        args, [], inputs=["cost_model"], extra_outputs=[("--out", folder / f) for f in PROFILE_FILES]
    )
    check_output_folder(args.out, "--out")
    require_torch()
    from kvsched.executor.profile import BLOCK_SIZE, GRIDS, run_profile

    predict = None
    if args.cost_model:
        from kvsched.costmodel import make_cost_model
        from kvsched.costmodel.coeffile import resolve_cost_model

        name, params = resolve_cost_model(args.cost_model)
        predict = make_cost_model(name, params)
    if args.pool_tokens is not None and args.pool_tokens < BLOCK_SIZE:  # before the model is built
        raise InputError(
            f"--pool-tokens: {args.pool_tokens} holds no KV block of {BLOCK_SIZE} tokens; give {BLOCK_SIZE} or more"
        )
    model = _model(args)
    options = _engine(args, model)
    res = run_profile(
        model,
        args.out,
        grid=GRIDS[args.grid],
        repeat=args.repeat,
        pool_tokens=args.pool_tokens,
        predict=predict,
        warmup=args.warmup,
        options=options,
        what="--out",
    )
    console = Console()
    for kind, path in (("compute", res.compute), ("attention", res.attention), ("batches", res.batches)):
        if path is None:
            shown = "not measured (interrupted), not written"
        else:
            shown = f"{res.rows[kind]} rows -> {path}"
        console.print(f"{kind}: {shown}", markup=False, highlight=False, soft_wrap=True)
    if res.skipped:
        console.print(
            f"{res.skipped} rows skipped: their KV does not fit the pool (--pool-tokens)",
            markup=False,
            highlight=False,
        )
    err = Console(stderr=True, soft_wrap=True)
    if model.cfg.name == "tiny" and res.compute is not None:
        # calibrate reads operator tables of a preset model's shape only (it recognises the model by them).
        err.print(
            "kvsched profile: note: the tiny model's mlp.csv and attention.csv are for the executor's own "
            "checks: calibrate fits operator tables of a preset's shape (--model llama-2-7b-shape, ...); "
            "fit batches.csv with kvsched calibrate --from-replay",
            markup=False,
            highlight=False,
        )
    if res.interrupted:
        if any(res.rows.values()):
            err.print(
                f"kvsched profile: kept what was measured before Ctrl-C in {args.out}: "
                + ", ".join(f"{kind} {n} rows" for kind, n in res.rows.items())
                + " (batches.json says interrupted: true)",
                markup=False,
                highlight=False,
            )
        else:
            err.print(
                "kvsched profile: interrupted before any row was measured; nothing written", markup=False
            )
    return interrupted_exit("profile", res.interrupted)


def cmd_calibrate_from_replay(args: argparse.Namespace) -> int:
    """``kvsched calibrate --from-replay``: fit the calibrated model to measured batches."""
    from kvsched.costmodel.coeffile import dump_coefficients
    from kvsched.costmodel.fitting import p3_pinned
    from kvsched.executor.measure import fit_replay

    fit = fit_replay(args.from_replay, form=args.form, folds=args.folds, seed=args.seed)
    table = _error_table(f"batch time: calibrated ({fit.form}) fitted to {fit.table.path.name}")
    if fit.before is not None:
        _errors_row(table, _before_label(fit.table.meta), fit.before)
    _errors_row(table, "after, in sample", fit.in_sample)
    _errors_row(table, f"after, held out ({fit.folds}-fold)", fit.held_out)
    console = Console()
    console.print(table)
    if fit.before is None:
        console.print(
            f"no 'before' line: {fit.table.path.name}'s predicted_s column is empty (a profile made without "
            "--cost-model predicts nothing)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"R² {fit.r2:.4f}; coefficients: {fit.cost.params()}", markup=False, highlight=False, soft_wrap=True
    )
    if p3_pinned(fit.table.features):  # said, as the Vidur path says it pins p3
        console.print(
            "p3 (per prefill) pinned to 0: no batch of the table has two prefills, so it cannot be told from p0 "
            "(per batch with a prefill)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    src = Path(args.from_replay)
    out = check_output_path(args.out or src.with_name(f"{src.stem}_fit.json"), "--out", None)
    write_text_atomic(out, dump_coefficients(fit.document()))
    Console(stderr=True, soft_wrap=True).print(
        f"wrote {fit.form} coefficients to {out}", markup=False, highlight=False
    )
    return 0


def _before_label(meta: dict[str, Any]) -> str:
    """The "before" line's label: whose prediction the table's predicted_s holds (a profile's
    batches.csv holds its --cost-model's, not a replay's)."""
    source = "profile's --cost-model" if meta.get("kind") == "kvsched.profile" else "replay's prediction"
    named = meta.get("predicted_with")
    name = named.get("name") if isinstance(named, dict) else named
    return f"before (the {source}{f', {name}' if isinstance(name, str) and name else ''})"


def _model_args(p: argparse.ArgumentParser, repeat: int) -> None:
    g = p.add_argument_group("model and device")
    g.add_argument(
        "--model",
        default="tiny",
        help="tiny, or a preset's shape with random weights: llama-2-7b-shape, llama-3-8b-shape, "
        "mistral-7b-shape, ... (default tiny)",
    )
    g.add_argument(
        "--layers",
        type=positive_int,
        help="build only this many layers; measured times are scaled by full layers / layers",
    )
    g.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    g.add_argument(
        "--dtype",
        choices=("float32", "float64", "bfloat16", "float16"),
        help="weights, activations and KV (default float32 on CPU, bfloat16 on CUDA)",
    )
    g.add_argument("--seed", type=seed_int, default=0, help="seed of the random weights (default 0)")
    g.add_argument("--threads", type=positive_int, help="CPU threads torch uses (default: torch's)")
    g.add_argument(
        "--repeat",
        type=_count(1),
        default=repeat,
        help=f"runs per measurement, median kept: 1 to {MAX_COUNT} (default {repeat})",
    )
    g.add_argument(
        "--warmup",
        type=_count(0),
        default=2,
        help=f"warm-up rounds before measuring: 0 to {MAX_COUNT} (default 2)",
    )
    e = p.add_argument_group("engine (defaults: the fast path on CUDA, the torch references on CPU)")
    e.add_argument(
        "--attention",
        choices=("paged", "gather"),
        help="paged: read the KV pool in place (default); gather: the first GPU run's padded groups",
    )
    e.add_argument(
        "--kernels",
        choices=("torch", "triton"),
        help="in-place attention kernels (default triton on CUDA, torch on CPU; triton on CPU needs "
        "TRITON_INTERPRET=1)",
    )
    e.add_argument(
        "--prefill",
        choices=("torch", "triton", "varlen"),
        help="chunks' attention (default varlen on CUDA: torch's flash varlen over the chunks' KV; "
        "else as --kernels)",
    )
    e.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        help="decode-only batches in CUDA graphs per bucket (default on CUDA)",
    )
    e.add_argument(
        "--mixed-graphs",
        action=argparse.BooleanOptionalAction,
        help="batches with prefill chunks in CUDA graphs per (decodes, chunk rows, chunks) bucket, the chunks "
        "through the Triton kernel (default on CUDA with --cuda-graphs)",
    )
    e.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="fuse the small operators with torch.compile inside the decode graphs (default on CUDA; "
        "with --no-cuda-graphs, in every batch)",
    )
    e.add_argument(
        "--kv-splits",
        type=int,
        default=0,
        help="KV splits of the Triton decode kernel (default 0: enough programs to fill the GPU twice)",
    )
    e.add_argument(
        "--kv-partition",
        type=int,
        default=0,
        help="keys per KV partition of the Triton decode kernel, a multiple of --tile: the KV splits by "
        "length, ceil(L / N) programs for L keys, as vLLM's v2 paged attention (default 0: by --kv-splits)",
    )
    e.add_argument(
        "--tile",
        type=int,
        default=64,
        help="keys (and chunk rows) per tile of the Triton kernels (default 64)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``kvsched`` parser."""
    p = sub.add_parser(
        "replay",
        help="replay a schedule on a real transformer and measure every batch",
        description="Replay SCHEDULE on INSTANCE batch by batch on a Llama-style PyTorch model with random "
        "weights, stepping the semantic core alongside (the schedule is validated strictly). Writes each "
        "batch's measured time next to the cost model's prediction, prints the relative error and the "
        "end-to-end metrics on the measured and the predicted timeline. --check-oracle checks that every "
        "request's tokens equal those of running it alone. Needs torch: pip install -e .[gpu].",
    )
    p.add_argument("instance", help="instance .json")
    p.add_argument("schedule", help="schedule: kvsched .json or .npz, or an InferMax .json")
    p.add_argument("--out", "-o", default="measured.csv", help="replay table (default measured.csv)")
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="write a Chrome/Perfetto trace of the measured timeline (the batches back to back with their "
        "measured seconds; open it in ui.perfetto.dev)",
    )
    p.add_argument(
        "--cost-model",
        help="cost model to compare with: name, coefficient file or shipped set (default: the instance's)",
    )
    p.add_argument("--cost-param", action="append", metavar="K=V", help="cost model parameter (repeatable)")
    p.add_argument(
        "--check-oracle", action="store_true", help="compare every request's tokens with it run alone"
    )
    p.add_argument(
        "--oracle-limit", type=positive_int, help="with --check-oracle: check only the first N requests"
    )
    p.add_argument(
        "--pool-capacity",
        type=positive_int,
        help="KV pool size in tokens (default the instance's M; smaller shows the pool refusing a schedule)",
    )
    p.add_argument("--prompt-seed", type=seed_int, default=0, help="seed of the prompt token ids (default 0)")
    p.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=False, help="progress bar (default off)"
    )
    _model_args(p, repeat=1)
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser(
        "profile",
        help="microbenchmarks for calibration, in Vidur's profiling-table columns (medians only)",
        description="Time every non-attention operator per token count (mlp.csv), one layer's attention for "
        "decode batches and prefill chunks (attention.csv), and whole decode, prefill and mixed batches "
        "(batches.csv, the replay table's columns) on a Llama-style PyTorch model. mlp.csv holds Vidur's "
        "median columns only (no min, max, mean or std), all that calibrate reads; "
        "batches.csv's start and duration are 0.0 (no schedule). Needs torch.",
    )
    p.add_argument("--out", "-o", required=True, help="directory for mlp.csv, attention.csv, batches.csv")
    p.add_argument("--grid", choices=("full", "quick"), default="full", help="sizes profiled (default full)")
    p.add_argument(
        "--pool-tokens",
        type=positive_int,
        help="KV pool for the batches (default: what the grid needs, capped by 70%% of free GPU memory)",
    )
    p.add_argument("--cost-model", help="cost model whose prediction goes into batches.csv")
    _model_args(p, repeat=5)
    p.set_defaults(func=cmd_profile)
