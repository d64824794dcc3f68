"""The ``kvsched`` command line.

Every command reports bad input as one line on stderr and exits non-zero; a
traceback means a bug in kvsched.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvsched import __version__
from kvsched.errors import InputError, KvschedError
from kvsched.instances.model import Instance, Limits, TimeModel

EXIT_INVALID = 1  # the schedule is illegal
EXIT_ERROR = 2  # bad input
DEFAULT_KV_CAPACITY = 100_000


def _kv_pairs(pairs: Sequence[str], what: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"{what}: expected key=value, got {pair!r}")
        try:
            out[key] = float(value)
        except ValueError:
            raise InputError(f"{what}: {key}: {value!r} is not a number") from None
    return out


def _time_model(args: argparse.Namespace) -> TimeModel | None:
    if getattr(args, "cost_model", None) is None:
        return None
    from kvsched.costmodel.coeffile import resolve_cost_model

    # A coefficient file becomes (name, params): the instance then carries the coefficients itself.
    name, params = resolve_cost_model(args.cost_model)
    params.update(_kv_pairs(args.cost_param or [], "--cost-param"))
    return TimeModel(name, params)


def _limits_from_args(args: argparse.Namespace) -> Limits | None:
    if args.kv_capacity is None:
        return None
    return Limits(
        kv_capacity=args.kv_capacity,
        block_size=args.block_size,
        max_batch_tokens=args.max_batch_tokens,
        max_prefill_tokens=args.max_prefill_tokens,
        max_running=args.max_running,
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _add_limit_args(p: argparse.ArgumentParser, *, default_kv: int | None = None) -> None:
    g = p.add_argument_group("engine limits")
    g.add_argument(
        "--kv-capacity",
        "-M",
        type=_positive_int,
        default=default_kv,
        help="KV capacity M in tokens"
        + (f" (default {default_kv:,}, InferMax's default M, seed 003 Sec. 4.1)" if default_kv else ""),
    )
    g.add_argument(
        "--block-size", type=_positive_int, default=1, help="paged-KV block size in tokens (default 1)"
    )
    g.add_argument("--max-batch-tokens", "-C", type=_positive_int, help="token budget C per batch")
    g.add_argument("--max-prefill-tokens", "-P", type=_positive_int, help="prefill budget P per batch")
    g.add_argument("--max-running", type=_positive_int, help="maximum requests holding KV")


def _add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cost-model",
        help="cost model name, coefficient file (.json) or shipped coefficient set "
        "(default: the instance's own time model)",
    )
    p.add_argument("--cost-param", action="append", metavar="K=V", help="cost model parameter (repeatable)")


def _load_instance(path: str, args: argparse.Namespace) -> Instance:
    from kvsched.instances.io import load_instance

    limits = _limits_from_args(args) if hasattr(args, "kv_capacity") else None
    return load_instance(path, limits=limits, time_model=_time_model(args))


# ---------------------------------------------------------------- generate
def cmd_generate(args: argparse.Namespace) -> int:
    from kvsched.instances.generators import generate, parse_params
    from kvsched.instances.io import save_instance

    params = parse_params(args.kind, args.param or [])
    limits = _limits_from_args(args)
    if limits is None:  # unreachable: --kv-capacity has a default here
        raise InputError("--kv-capacity is required")
    time_model = _time_model(args) or TimeModel("unit")
    instance = generate(args.kind, n=args.n, seed=args.seed, limits=limits, time_model=time_model, **params)
    instance.check_feasible()
    out = Path(args.out) if args.out else Path(f"{instance.name or args.kind}.json")
    save_instance(instance, out)
    Console(stderr=True).print(f"wrote {len(instance)} requests to {out}")
    return 0


# -------------------------------------------------------------------- info
def cmd_info(args: argparse.Namespace) -> int:
    import numpy as np

    instance = _load_instance(args.instance, args)
    reqs = instance.requests
    lim = instance.limits
    prompt = np.array([r.prompt for r in reqs])
    output = np.array([r.output for r in reqs])
    arrival = np.array([r.arrival for r in reqs])
    peak = prompt + output - 1
    console = Console()
    head = Table(title=f"instance {instance.name or args.instance}", show_header=False)
    head.add_row("requests", str(len(reqs)))
    head.add_row("arrivals", f"{arrival.min():g} .. {arrival.max():g}")
    head.add_row("KV capacity M", f"{lim.kv_capacity} tokens (block size {lim.block_size})")
    head.add_row("token budget C", str(lim.max_batch_tokens or "unlimited"))
    head.add_row("prefill budget P", str(lim.max_prefill_tokens or "unlimited"))
    head.add_row("max running", str(lim.max_running or "unlimited"))
    params = ", ".join(f"{k}={v:g}" for k, v in instance.time_model.params.items())
    head.add_row("time model", instance.time_model.name + (f" ({params})" if params else ""))
    head.add_row(
        "peak KV / M", f"max {peak.max() / lim.kv_capacity:.3f}, sum {peak.sum() / lim.kv_capacity:.2f}"
    )
    console.print(head)
    stats = Table(title="lengths (tokens)")
    for col in ("", "min", "mean", "p50", "p99", "max", "total"):
        stats.add_column(col, justify="right")
    for label, arr in (("prompt I", prompt), ("output O", output), ("peak KV I+O-1", peak)):
        stats.add_row(
            label,
            str(arr.min()),
            f"{arr.mean():.1f}",
            f"{np.percentile(arr, 50):g}",
            f"{np.percentile(arr, 99):g}",
            str(arr.max()),
            str(arr.sum()),
        )
    console.print(stats)
    return 0


# ---------------------------------------------------------------- validate
def cmd_validate(args: argparse.Namespace) -> int:
    from kvsched.costmodel import make_cost_model
    from kvsched.schedule.io import load_schedule
    from kvsched.schedule.validate import replay, validate

    instance = _load_instance(args.instance, args)
    schedule = load_schedule(args.schedule, instance)
    if args.measured:
        trace = replay(instance, schedule, strict=False, check_durations=False)
    else:
        tm = instance.time_model
        trace = validate(instance, schedule, make_cost_model(tm.name, tm.params))
    console = Console()
    if trace.violations:
        shown = trace.violations[: args.max_violations]
        for v in shown:
            console.print(str(v), markup=False, highlight=False)
        more = len(trace.violations) - len(shown)
        tail = f" ({more} not shown)" if more > 0 else ""
        Console(stderr=True).print(
            f"INVALID: {len(trace.violations)} violation(s) in {len(schedule)} batches{tail}",
            markup=False,
            highlight=False,
        )
        return EXIT_INVALID
    console.print(f"valid: {len(schedule)} batches, {len(instance)} requests, makespan {schedule.makespan:g}")
    if args.metrics:
        from kvsched.schedule.metrics import print_summary

        print_summary(trace, console=console)
    return 0


# ----------------------------------------------------------------- convert
def cmd_convert(args: argparse.Namespace) -> int:
    from kvsched.schedule.io import infermax_document, load_schedule, save_schedule

    instance = _load_instance(args.instance, args)
    schedule = load_schedule(args.schedule, instance)
    if args.to == "infermax":
        Path(args.out).write_text(json.dumps(infermax_document(schedule, instance)) + "\n")
    else:
        save_schedule(schedule, instance, args.out)
    Console(stderr=True).print(f"wrote {len(schedule)} batches to {args.out} ({args.to} format)")
    return 0


# ---------------------------------------------------------------- capacity
def cmd_capacity(args: argparse.Namespace) -> int:
    from kvsched.costmodel.capacity import kv_capacity
    from kvsched.costmodel.presets import get_gpu, get_model

    model, gpu = get_model(args.model), get_gpu(args.gpu)
    r = kv_capacity(model, gpu, args.tp)
    table = Table(title=f"KV capacity: {model.name} on {args.tp} x {gpu.name}", show_header=False)
    table.add_row("memory", f"{r.memory_bytes / 1e9:,.1f} GB ({args.tp} x {gpu.memory_gb:g} GB)")
    table.add_row(
        "weights P x D",
        f"{r.weight_bytes / 1e9:,.1f} GB (P = {model.nominal_params / 1e9:g}e9, D = {model.dtype_bytes} B)",
    )
    table.add_row(
        "KV per token, paper",
        f"{r.kv_bytes_paper:,} B (2 x L x H x D = 2 x {model.layers} x {model.hidden} x {model.dtype_bytes})",
    )
    table.add_row(
        "KV per token, GQA",
        f"{r.kv_bytes_gqa:,} B (2 x L x kv_heads x head_dim x D = 2 x {model.layers} x {model.kv_heads} x "
        f"{model.head_dim} x {model.dtype_bytes})",
    )
    stated = f"; the paper states {r.stated:,}, which these numbers do not give" if r.stated else ""
    table.add_row("M, paper formula", f"{r.tokens_paper:,} tokens (seed 004 Sec. 7{stated})")
    table.add_row("M, GQA-correct", f"{r.tokens_gqa:,} tokens")
    console = Console()
    console.print(table)
    if model.kv_heads != model.heads:
        console.print(
            f"{model.name} has {model.kv_heads} KV heads for {model.heads} query heads (GQA): the paper's "
            f"2 x L x H x D overstates the KV per token {model.heads // model.kv_heads}x.",
            markup=False,
            highlight=False,
        )
    console.print(f"M = {r.tokens_gqa} tokens", markup=False, highlight=False)
    return 0


# --------------------------------------------------------------- calibrate
def cmd_calibrate(args: argparse.Namespace) -> int:
    from kvsched.costmodel.calibrate import calibrate, coefficient_name
    from kvsched.costmodel.coeffile import dump_coefficients

    cal = calibrate(
        args.table,
        model=args.model,
        gpu=args.gpu,
        tp=args.tp,
        form=args.form,
        attention=args.attention,
        attention_model=args.attention_model,
        attention_gpu=args.attention_gpu,
        all_reduce=args.all_reduce,
        folds=args.folds,
        seed=args.seed,
    )
    console = Console()
    table = Table(
        title=f"fidelity: {cal.model.name} on {cal.gpu.name}, tp={cal.tp} "
        f"(held-out relative error, {cal.folds}-fold)"
    )
    for col in ("rows", "form", "n", "mean", "p95", "max", ">10%", "R²"):
        table.add_column(col, justify="left" if col in ("rows", "form") else "right")
    for row in cal.fidelity:
        s = row.stats
        form = row.form + (" *" if row.form == cal.form else "")
        r2 = f"{row.r2:.4f}" if row.r2 == row.r2 else ""
        table.add_row(
            row.rows, form, str(s.n), f"{s.mean:.2%}", f"{s.p95:.2%}", f"{s.max:.2%}", str(s.over_10pct), r2
        )
    console.print(table)
    for term, text in cal.terms.items():
        console.print(f"{term}: {text}", markup=False, highlight=False)
    sur = cal.meta["linear_surrogate"]
    console.print(
        f"linear surrogate ({sur['name']}) vs this model on {sur['probe_batches']} probe batches: "
        f"mean {sur['mean_rel_err']:.2%}, max {sur['max_rel_err']:.2%}",
        markup=False,
        highlight=False,
    )
    out = Path(args.out or coefficient_name(cal.model.name, cal.gpu.name, cal.tp))
    out.write_text(dump_coefficients(cal.document()))
    Console(stderr=True).print(f"wrote {cal.form} coefficients to {out}", markup=False, highlight=False)
    return 0


# ------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvsched",
        description="Optimal schedules for LLM inference, and every practical scheduler measured against them.",
    )
    parser.add_argument("--version", action="version", version=f"kvsched {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "generate",
        help="generate an instance file",
        description="Generate a seeded instance: synthetic, InferMax grids and mixes, or real ShareGPT traces.",
    )
    p.add_argument("kind", help="generator: synthetic, infermax-grid, infermax-mix or sharegpt")
    p.add_argument("--n", type=_positive_int, default=100, help="number of requests (default 100)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--param", action="append", metavar="K=V", help="generator parameter (repeatable)")
    p.add_argument("--out", "-o", help="output file (default KIND.json)")
    _add_limit_args(p, default_kv=DEFAULT_KV_CAPACITY)
    _add_cost_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser(
        "info", help="summarise an instance", description="Summarise an instance file or CSV trace."
    )
    p.add_argument("instance", help="instance .json or trace .csv")
    _add_limit_args(p)
    _add_cost_args(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser(
        "validate",
        help="check a schedule against the exact semantics",
        description="Replay SCHEDULE on INSTANCE through the semantic core and report every violation "
        "(batch index, request id, rule). Exit 0 if legal, 1 if not, 2 on bad input.",
    )
    p.add_argument("instance", help="instance .json (or trace .csv with --kv-capacity)")
    p.add_argument("schedule", help="schedule .json (kvsched or InferMax format)")
    p.add_argument(
        "--max-violations", type=_positive_int, default=50, help="violations to print (default 50)"
    )
    p.add_argument("--metrics", action="store_true", help="print the metrics summary of a legal schedule")
    p.add_argument(
        "--measured",
        action="store_true",
        help="durations are measured: do not check them against the cost model",
    )
    _add_limit_args(p)
    _add_cost_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "convert",
        help="convert a schedule between kvsched and InferMax formats",
        description="Read SCHEDULE (either format) and write it in the format --to names.",
    )
    p.add_argument("instance", help="instance .json")
    p.add_argument("schedule", help="schedule .json (kvsched or InferMax format)")
    p.add_argument("--to", choices=("kvsched", "infermax"), required=True, help="output format")
    p.add_argument("--out", "-o", required=True, help="output file")
    _add_cost_args(p)
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser(
        "capacity",
        help="KV capacity M of a model on GPUs",
        description="KV capacity M in tokens for a model on TP GPUs, by seed 004 Sec. 7's formula "
        "(2 x L x H x D bytes per token) and by the GQA-correct one (2 x L x kv_heads x head_dim x D); "
        "both as (TP x memory - P x D) / bytes per token, with memory in GB.",
    )
    p.add_argument(
        "--model", required=True, help="model preset (llama-2-7b, llama-3-8b, llama-2-70b, mistral-7b, ...)"
    )
    p.add_argument("--gpu", required=True, help="GPU preset (a100-80gb, a100-40gb, h100-80gb, h200-141gb)")
    p.add_argument(
        "--tp",
        type=_positive_int,
        default=1,
        help="tensor-parallel degree: GPUs holding the model (default 1)",
    )
    p.set_defaults(func=cmd_capacity)

    p = sub.add_parser(
        "calibrate",
        help="fit a cost model from a profiling table",
        description="Fit the calibrated cost model from a Vidur compute profiling table (mlp.csv), print its "
        "held-out fidelity for every token-term form, and write a coefficient file that --cost-model accepts. "
        "Attention terms come from the attention table: measured where it matches the model, GPU and TP "
        "degree, derived by scaling otherwise.",
    )
    p.add_argument("table", help="compute profiling table (Vidur's mlp.csv)")
    p.add_argument("--model", help="model preset (default: recognised from the table's dimensions)")
    p.add_argument("--gpu", help="GPU preset (default: a directory in the table's path, e.g. .../a100/...)")
    p.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument(
        "--form",
        default="stepped",
        choices=("stepped", "linear", "hinge", "staircase", "rad"),
        help="token-term form written (default stepped; all are reported)",
    )
    p.add_argument(
        "--attention", help="attention profiling table (default: the packaged Llama-2-7B/A100 sample)"
    )
    p.add_argument(
        "--attention-model", help="model the attention table was measured on (default: see --attention)"
    )
    p.add_argument("--attention-gpu", help="GPU the attention table was measured on")
    p.add_argument(
        "--all-reduce", help="all-reduce table for --tp > 1 (default: the packaged one for the GPU)"
    )
    p.add_argument(
        "--folds", type=_positive_int, default=10, help="k of the k-fold cross-validation (default 10)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the fold assignment (default 0)")
    p.add_argument("--out", "-o", help="coefficient file to write (default ./MODEL_GPU_tpN.json)")
    p.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KvschedError as exc:
        print(f"kvsched {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"kvsched {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
