"""Argument helpers shared by the ``kvsched`` commands."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kvsched.errors import InputError
from kvsched.instances.model import Instance, Limits, TimeModel

EXIT_INVALID = 1  # the schedule is illegal
EXIT_ERROR = 2  # bad input
DEFAULT_KV_CAPACITY = 100_000


def kv_pairs(pairs: Sequence[str], what: str) -> dict[str, float]:
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


def time_model_from_args(args: argparse.Namespace) -> TimeModel | None:
    if getattr(args, "cost_model", None) is None:
        return None
    from kvsched.costmodel.coeffile import resolve_cost_model

    # A coefficient file becomes (name, params): the instance then carries the coefficients itself.
    name, params = resolve_cost_model(args.cost_model)
    params.update(kv_pairs(args.cost_param or [], "--cost-param"))
    return TimeModel(name, params)


def limits_from_args(args: argparse.Namespace) -> Limits | None:
    if args.kv_capacity is None:
        return None
    return Limits(
        kv_capacity=args.kv_capacity,
        block_size=args.block_size,
        max_batch_tokens=args.max_batch_tokens,
        max_prefill_tokens=args.max_prefill_tokens,
        max_running=args.max_running,
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def add_limit_args(p: argparse.ArgumentParser, *, default_kv: int | None = None) -> None:
    g = p.add_argument_group("engine limits")
    g.add_argument(
        "--kv-capacity",
        "-M",
        type=positive_int,
        default=default_kv,
        help="KV capacity M in tokens"
        + (f" (default {default_kv:,}, InferMax's default M, seed 003 Sec. 4.1)" if default_kv else ""),
    )
    g.add_argument(
        "--block-size", type=positive_int, default=1, help="paged-KV block size in tokens (default 1)"
    )
    g.add_argument("--max-batch-tokens", "-C", type=positive_int, help="token budget C per batch")
    g.add_argument("--max-prefill-tokens", "-P", type=positive_int, help="prefill budget P per batch")
    g.add_argument("--max-running", type=positive_int, help="maximum requests holding KV")


def add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cost-model",
        help="cost model name, coefficient file (.json) or shipped coefficient set "
        "(default: the instance's own time model)",
    )
    p.add_argument("--cost-param", action="append", metavar="K=V", help="cost model parameter (repeatable)")


def load_instance_from_args(path: str, args: argparse.Namespace) -> Instance:
    from kvsched.instances.io import load_instance

    limits = limits_from_args(args) if hasattr(args, "kv_capacity") else None
    return load_instance(path, limits=limits, time_model=time_model_from_args(args))


def parse_value(text: str) -> object:
    """A ``--param`` value: none, true/false, an int, a float, or the string itself."""
    low = text.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def param_pairs(pairs: Sequence[str] | None, what: str = "--param") -> dict[str, object]:
    """``key=value`` strings as a dict of parsed values (one clear error for a malformed pair)."""
    out: dict[str, object] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"{what}: expected key=value, got {pair!r}")
        out[key] = parse_value(value)
    return out


def time_unit(instance: Instance) -> str:
    """The label of the instance's time unit: slots under unit time, seconds otherwise."""
    return "slot" if instance.time_model.name == "unit" else "s"
