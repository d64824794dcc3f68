"""``kvsched capacity`` and ``kvsched calibrate``: KV capacity and fitted cost models."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from kvsched.commands.common import (
    check_output_path,
    check_outputs,
    positive_int,
    seed_int,
    write_text_atomic,
)
from kvsched.errors import InputError


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
    copies = r.kv_bytes_gqa // model.kv_bytes_per_token  # > 1 where tp exceeds the KV heads (replicated)
    replicated = f" x {copies} copies (one KV head per GPU on {args.tp} GPUs)" if copies > 1 else ""
    table.add_row(
        "KV per token, GQA",
        f"{r.kv_bytes_gqa:,} B (2 x L x kv_heads x head_dim x D = 2 x {model.layers} x {model.kv_heads} x "
        f"{model.head_dim} x {model.dtype_bytes}{replicated})",
    )
    stated = f"; the paper states {r.stated:,}, which these numbers do not give" if r.stated else ""
    table.add_row("M, paper formula", f"{r.tokens_paper:,} tokens (seed 004 Sec. 7{stated})")
    table.add_row("M, GQA-correct", f"{r.tokens_gqa:,} tokens")
    console = Console(soft_wrap=True)  # notes one line each, not cut at 80 columns
    console.print(table)
    if model.kv_heads != model.heads:
        console.print(
            f"{model.name} has {model.kv_heads} KV heads for {model.heads} query heads (GQA): the paper's "
            f"2 x L x H x D overstates the KV per token {r.kv_bytes_paper / r.kv_bytes_gqa:g}x.",
            markup=False,
            highlight=False,
        )
    console.print(f"M = {r.tokens_gqa} tokens", markup=False, highlight=False)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from kvsched.costmodel.calibrate import calibrate, coefficient_name
    from kvsched.costmodel.coeffile import dump_coefficients

    if (args.table is None) == (args.from_replay is None):
        raise InputError("calibrate: give either a compute profiling table or --from-replay MEASURED.csv")
    # A replay table's metadata (the JSON beside it) is read too: --out must not replace it.
    side = []
    if args.from_replay is not None:
        from kvsched.executor.measure import sidecar

        side = [sidecar(args.from_replay)]
    check_outputs(
        args, ["out"], inputs=["table", "from_replay", "attention", "all_reduce"], extra_inputs=side
    )
    if args.from_replay is not None:
        from kvsched.commands.executor import cmd_calibrate_from_replay

        return cmd_calibrate_from_replay(args)
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
    # soft_wrap: lines (a written path above all) stay whole when the output is not a terminal, as for
    # cmd_capacity; rich would otherwise cut them at 80 columns.
    console = Console(soft_wrap=True)
    capped = (
        f", leave-one-out: --folds {cal.folds_requested} exceeds the {cal.folds} rows"
        if cal.folds_requested not in (None, cal.folds)
        else ""
    )
    table = Table(
        title=f"fidelity: {cal.model.name} on {cal.gpu.name}, tp={cal.tp} "
        f"(held-out relative error, {cal.folds}-fold{capped})"
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
    out = check_output_path(args.out or coefficient_name(cal.model.name, cal.gpu.name, cal.tp), "--out")
    write_text_atomic(out, dump_coefficients(cal.document()))
    Console(stderr=True, soft_wrap=True).print(
        f"wrote {cal.form} coefficients to {out}", markup=False, highlight=False
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``kvsched`` parser."""
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
        type=positive_int,
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
    p.add_argument("table", nargs="?", help="compute profiling table (Vidur's mlp.csv)")
    p.add_argument(
        "--from-replay",
        metavar="MEASURED.csv",
        help="fit every coefficient to measured batches instead (a kvsched replay or profile batches table; "
        "--form stepped or linear)",
    )
    p.add_argument("--model", help="model preset (default: recognised from the table's dimensions)")
    p.add_argument("--gpu", help="GPU preset (default: a directory in the table's path, e.g. .../a100/...)")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
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
        "--folds", type=positive_int, default=10, help="k of the k-fold cross-validation (default 10)"
    )
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the fold assignment (default 0)")
    p.add_argument("--out", "-o", help="coefficient file to write (default ./MODEL_GPU_tpN.json)")
    p.set_defaults(func=cmd_calibrate)
