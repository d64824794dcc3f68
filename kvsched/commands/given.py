"""What a comparison is given on the command line: policies by name, and schedules made elsewhere (files).

Shared by ``compare`` and ``report``, so that both read ``--policies``, ``--schedule [NAME=]FILE`` and
``--retime`` alike.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from kvsched.errors import InputError

if TYPE_CHECKING:
    from kvsched.instances.model import Instance
    from kvsched.schedule.ir import Schedule


def add_given_args(p: argparse.ArgumentParser) -> None:
    """``--policies``, ``--schedule`` and ``--retime``."""
    p.add_argument(
        "--policies",
        default="all",
        help="comma-separated policy names, all (default) or none (only the --schedule files); your own "
        "scheduler as FILE.py:CLASS",
    )
    p.add_argument(
        "--schedule",
        action="append",
        metavar="[NAME=]FILE",
        help="also compare this schedule, made elsewhere (your scheduler's, an engine's log written as a "
        "kvsched or InferMax schedule file): replayed through the semantic core, a row named NAME (default: "
        "the file's stem); repeatable",
    )
    p.add_argument(
        "--retime",
        action="store_true",
        help="give the --schedule files the cost model's batch durations before replaying them (for "
        "durations measured on a real engine)",
    )


def policy_names(text: str, *, allow_none: bool = True, files: bool = False) -> list[str]:
    """``--policies``: ``all``, ``none`` (where ``allow_none``) or comma-separated registered names, and
    with ``files`` policies of one's own as ``FILE.py:CLASS`` (see :func:`own_policies`)."""
    from kvsched.analysis.compare import policy_names as checked_names

    if text.strip() == "none" and allow_none:
        return []
    names = checked_names(text, "--policies", files=files)
    if not names:
        other = ", all or none" if allow_none else " or all"
        raise InputError(f"--policies: give at least one policy name{other}")
    return names


def own_policies(names: list[str]) -> list[object]:
    """``names`` with each ``FILE.py:CLASS`` replaced by the policy it builds (one error naming a bad one)."""
    from kvsched.heuristics.own import is_file_ref, load_policy_file

    out: list[object] = []
    for name in names:
        if not is_file_ref(name):
            out.append(name)
            continue
        try:
            out.append(load_policy_file(name))
        except InputError as exc:
            raise InputError(f"--policies: {exc}") from None
    return out


def schedule_paths(values: list[str] | None) -> dict[str, str]:
    """``--schedule [NAME=]FILE`` values by row name (the file's stem where no name is given)."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path:  # a plain path
            name, path = Path(value).stem, value
        name = name.strip()
        if name in out:
            raise InputError(f"--schedule: two schedules named {name!r} (name them NAME=FILE)")
        out[name] = path
    return out


def load_given_schedules(
    paths: dict[str, str], instance: Instance, names: list[str], retime_them: bool
) -> dict[str, Schedule]:
    """Each ``--schedule`` file read (one error naming it where it cannot be), retimed to the instance's cost
    model with ``--retime``; none named like a policy. The comparison replays each through the core."""
    from kvsched.schedule.io import load_schedule
    from kvsched.schedule.retime import retime
    from kvsched.schedule.validate import instance_cost_model

    clash = sorted(set(names) & set(paths))
    if clash:
        raise InputError(f"--schedule: {clash[0]!r} is also a policy's name (name it NAME=FILE)")
    out = {}
    for name, path in paths.items():
        if not Path(path).is_file():
            raise InputError(f"--schedule {name}: {path} is not a file")
        try:
            schedule = load_schedule(path, instance)
            if retime_them:
                schedule = retime(instance, schedule, instance_cost_model(instance))
        except InputError as exc:
            raise InputError(f"--schedule {name}: {exc}") from None
        out[name] = schedule
    return out


def given_inputs(args: argparse.Namespace) -> list[str]:
    """The files ``--schedule`` and ``--policies`` read (schedules, policies' Python files): never outputs."""
    from kvsched.heuristics.own import is_file_ref

    files = list(schedule_paths(args.schedule).values())
    files += [p.strip().rpartition(":")[0] for p in args.policies.split(",") if is_file_ref(p.strip())]
    return files


def read_given(args: argparse.Namespace, instance: Instance) -> tuple[list[object], dict[str, Schedule]]:
    """``--policies`` (names, and policies of one's own built from their files) and ``--schedule`` (read,
    retimed with ``--retime``), as :func:`kvsched.analysis.compare` takes them; every mistake one error."""
    policies = own_policies(policy_names(args.policies, files=True))
    labels = [p if isinstance(p, str) else p.name for p in policies]  # type: ignore[attr-defined]
    return policies, load_given_schedules(schedule_paths(args.schedule), instance, labels, args.retime)
