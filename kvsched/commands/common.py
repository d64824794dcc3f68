"""Argument helpers shared by the ``kvsched`` commands."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from kvsched.errors import InputError
from kvsched.instances.atomic import atomic_output
from kvsched.instances.csvtrace import number_or_text
from kvsched.instances.io import make_folder, same_file_key
from kvsched.instances.model import Instance, Limits, TimeModel
from kvsched.schedule.collector import collector_paused as paused
from kvsched.stop import Deadline

if TYPE_CHECKING:
    from kvsched.costmodel import CostModel
    from kvsched.instances.io import OutputKind

EXIT_INVALID = 1  # the schedule is illegal
EXIT_ERROR = 2  # bad input
EXIT_INTERNAL = 3  # a bug in kvsched
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell reports it)
#: The engine-limit flags and the :class:`Limits` field each one overrides.
LIMIT_FLAGS = {
    "kv_capacity": "--kv-capacity",
    "block_size": "--block-size",
    "max_batch_tokens": "--max-batch-tokens",
    "max_prefill_tokens": "--max-prefill-tokens",
    "max_running": "--max-running",
}


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


def time_model_from_args(args: argparse.Namespace, base: TimeModel | None = None) -> TimeModel | None:
    """The time model ``--cost-model``/``--cost-param`` name, checked (``None``: neither given).

    ``--cost-param`` alone overrides parameters of ``base`` (the instance's own model).
    """
    from kvsched.instances.io import check_time_model

    pairs = kv_pairs(getattr(args, "cost_param", None) or [], "--cost-param")
    if getattr(args, "cost_model", None) is None:
        if not pairs or base is None:
            return None
        model = TimeModel(base.name, {**base.params, **pairs})
    else:
        from kvsched.costmodel.coeffile import resolve_cost_model

        # A coefficient file becomes (name, params): the instance then carries the coefficients itself.
        name, params = resolve_cost_model(args.cost_model)
        model = TimeModel(name, {**params, **pairs})
    check_time_model(model, "--cost-model/--cost-param")
    return model


def limit_overrides(args: argparse.Namespace) -> dict[str, int]:
    """The engine limits the command line names (only those: the file keeps its others)."""
    return {f: getattr(args, f) for f in LIMIT_FLAGS if getattr(args, f, None) is not None}


def limits_from_args(args: argparse.Namespace) -> Limits | None:
    """Full :class:`Limits` from the flags (unset budgets: unlimited), or ``None`` without -M."""
    from kvsched.instances.io import limits_with

    given = limit_overrides(args)
    if "kv_capacity" not in given:
        return None
    return limits_with(None, given, "engine limits")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number >= 0 (a seed, a count of warm-up rounds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


#: The largest seed every consumer takes (torch's manual_seed: a signed 64-bit integer).
MAX_SEED = 2**63 - 1


def seed_int(text: str) -> int:
    """An argparse type: a seed, a whole number in [0, :data:`MAX_SEED`]."""
    value = non_negative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text!r} is larger than {MAX_SEED} (2**63 - 1)")
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
        "--block-size",
        type=positive_int,
        help="paged-KV block size in tokens (default: the instance's, else 1)",
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
    """Load INSTANCE; each limit or cost flag overrides only what it names."""
    from dataclasses import replace

    from kvsched.instances.io import check_trace_feasible, is_csv_name, load_instance

    instance = load_instance(path, limit_overrides=limit_overrides(args), check_feasible=False)
    time_model = time_model_from_args(args, instance.time_model)
    if time_model is not None:
        instance = replace(instance, time_model=time_model)
    # The file's requests were checked as it was read; a trace's misfit is named by its line.
    if is_csv_name(path):
        check_trace_feasible(instance, path)
    else:
        instance.check_feasible(requests=False)
    # Every command refuses the model up front, not only those that build the problem data (`info` showed
    # "unit (slot=nan)" and exited 0 where `simulate` refuses it), the file's own as well as the flags'.
    checked_cost_model(
        instance, "--cost-model/--cost-param" if time_model is not None else f"{path}: time_model"
    )
    return instance


def checked_cost_model(instance: Instance, what: str = "--cost-model/--cost-param") -> CostModel:
    """The cost model of ``instance`` (its file's time model, or the one ``--cost-model``/``--cost-param``
    chose), checked as :class:`~kvsched.schedule.data.ProblemData` checks it (a batch of this instance must
    take some time, and finitely little); a refusal is one :class:`InputError` naming ``what``.
    """
    from kvsched.schedule.data import checked_cost_model as checked

    try:  # (independent of the request count: a few batch probes)
        return checked(instance)
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None


# ----------------------------------------------------------------------------- outputs
def check_outputs(
    args: argparse.Namespace,
    outputs: Iterable[str],
    inputs: Iterable[str] = (),
    *,
    extra_outputs: Iterable[tuple[str, str | Path]] = (),
    extra_inputs: Iterable[str | Path] = (),
    kind: OutputKind = "output",
) -> None:
    """Check every output flag of ``args`` before the work starts.

    ``outputs`` and ``inputs`` name attributes of ``args`` (unset ones are
    skipped); ``extra_outputs`` (label, path) and ``extra_inputs`` are files a
    command writes or reads beside its flags (a replay table's metadata). An
    output must not be an input of the command (nothing is lost to a typo), nor
    another output's file (the second would replace the first), must not be a
    folder, and its folder must exist or be creatable. None may replace a bundled
    example, a kvsched instance file, a results database or a CSV trace: each is
    an input, if not of this command then of another; except that outputs of a
    ``kind`` (see :func:`kvsched.instances.io.check_not_input`) may replace a
    file of that kind: ``"instance"`` (``generate --out``) an instance file,
    ``"database"`` (``sweep --db``, which resumes it) a database.
    """
    given_inputs = [*(getattr(args, name, None) for name in inputs), *_read_files(args)]
    sources = {
        same_file_key(Path(p)) for p in [*given_inputs, *extra_inputs] if isinstance(p, str | Path) and p
    }
    named = [(f"--{name.replace('_', '-')}", getattr(args, name, None)) for name in outputs]
    written: dict[tuple[object, ...], str] = {}
    for flag, value in [*named, *extra_outputs]:
        if not value:
            continue
        check_output_path(value, flag, sources, kind=kind)
        path = Path(value)
        if path.exists() and not path.is_file():
            continue  # a device or pipe (-o /dev/stdout): written in place, several outputs may share it
        key = same_file_key(path)
        if key in written:
            raise InputError(
                f"{flag}: {value} is also the file of {written[key]}; give each output its own name"
            )
        written[key] = flag


#: Flags naming files a command reads beside its inputs: policies written in files (``FILE.py:CLASS``,
#: comma-separated where several) and the cost model (a shipped name, or a coefficient file).
_POLICY_FLAGS = ("policy", "policies", "warm_start")


def _read_files(args: argparse.Namespace) -> list[str]:
    """The files ``args``' policy and cost-model flags read (``replay --cost-model fit.json -o fit.json``
    replaced the coefficient file it was reading with its own output)."""
    found: list[str] = []
    model = getattr(args, "cost_model", None)
    if isinstance(model, str) and Path(model).is_file():
        found.append(model)
    for name in _POLICY_FLAGS:
        value = getattr(args, name, None)
        for text in value if isinstance(value, list | tuple) else [value]:
            for part in text.split(",") if isinstance(text, str) else ():
                if ".py:" in part:
                    # (imported here: the policies' module costs every command 40 ms, and few name a file)
                    from kvsched.heuristics.own import is_file_ref

                    if is_file_ref(part):
                        found.append(part.rpartition(":")[0])
    return found


def check_output_path(
    value: str | Path,
    flag: str,
    sources: set[tuple[object, ...]] | None = None,
    *,
    kind: OutputKind = "output",
) -> Path:
    """One output file checked (see :func:`check_outputs`; ``kind``: what the output is); its folder is
    created."""
    from kvsched.instances.io import check_not_input

    path = Path(value)
    if sources and same_file_key(path) in sources:
        raise InputError(f"{flag}: {path} is also an input of this command; refusing to overwrite it")
    check_not_input(path, flag, kind=kind)
    if path.is_dir():
        raise InputError(f"{flag}: {path} is a folder; give a file name")
    folder = path.parent
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{flag}: {folder} is not a folder")
    make_folder(folder, flag)
    if not os.access(folder, os.W_OK):
        raise InputError(f"{flag}: cannot write in {folder} (permission denied)")
    return path


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a command's loading, simulation and outputs.

    An instance's requests and a simulated trace are millions of objects
    (records, arrays) without reference cycles, kept to the end of the command:
    each full pass of the collector over them frees nothing and costs about
    0.4 s at 100,000 requests (the first allocations after the loop, the printed
    tables, set one off; loading the requests another, 0.03-0.06 s). The
    collector runs again, as it was, when the block ends.
    """
    with paused():  # (resumed with the objects made meanwhile counted as old: no pass over them then)
        yield


#: What commands left to the end of the process (:func:`keep_until_exit`).
KEPT: list[object] = []


def keep_until_exit(*objects: object) -> None:
    """Leave ``objects`` (a trace, its metrics, the instance) to the end of the process.

    Freeing them object by object is work nobody waits for: a 100,000-request
    trace's records take about 0.5 s. The command line
    (:func:`kvsched.cli.main` without arguments) ends the process without it;
    a call from Python drops them when :func:`~kvsched.cli.main` returns.
    """
    KEPT.extend(objects)


def write_text_atomic(path: str | Path, text: str, what: str = "") -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (``what``: its flag, as for :func:`atomic_output`)."""
    with atomic_output(path, what) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def parse_value(text: str) -> object:
    """A ``--param`` value: none, true/false, an int, a float, or the string itself."""
    low = text.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    return number_or_text(text)


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
    from kvsched.schedule.serving import time_unit as unit_of  # the one rule, beside the serving metrics

    return unit_of(instance)


def interrupted_exit(command: str, stopped: bool, code: int = 0) -> int:
    """``code``, or :data:`EXIT_INTERRUPTED` with a note on stderr where Ctrl-C ``stopped`` the command's
    work: what it wrote is what it had found before (the best schedule and bound, the rows finished), and
    a script must not read that as a finished run."""
    if not stopped:
        return code
    print(
        f"kvsched {command}: interrupted (Ctrl-C): what was written is what was found before it",
        file=sys.stderr,
    )
    return EXIT_INTERRUPTED


def note_late(
    deadline: Deadline,
    seconds: dict[str, float],
    *,
    command: str = "solve",
    stage: str = "the solve",
    reason: str = "a first schedule is always made, and it can take longer",
) -> None:
    """Say on stderr when the command ended past its limit (beyond ``max(1 s, 5%)``), and where the time went.

    ``seconds["solved"]`` is when ``stage`` (the solve; for ``compare`` and ``report``, the policies and the
    solve) returned, in seconds since the command started. The solve always returns a schedule, so a limit
    below what the instance's first schedule takes (at 100k requests several seconds, finished against
    reserved peaks) or below its output cannot be met; the command says so rather than leave a script to find
    out from the clock. ``reason`` says why ``stage`` may overrun (``kvsched bound`` makes no schedule).
    """
    late = time.monotonic() - deadline.end
    if not deadline.bounded or late <= max(1.0, 0.05 * deadline.limit):
        return
    solved = seconds["solved"]
    if solved > deadline.limit:
        # (Not "the first schedule took that long": the stage that overran is not known here.)
        why = f"{stage} returned at {solved:.1f} s; {reason}"
    else:
        why = f"the output took {late + deadline.limit - solved:.1f} s after {stage}"
    print(
        f"kvsched {command}: note: ended {late:.1f} s past --time-limit {deadline.limit:g} ({why})",
        file=sys.stderr,
    )
