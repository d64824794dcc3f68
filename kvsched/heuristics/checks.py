"""Argument checks the policies' constructors share (one wording for every policy's bad option).

The registry turns the ``ValueError`` into an :class:`~kvsched.errors.InputError`
that names the option, so a bad ``-p name:option=value`` ends in one line.
"""

from __future__ import annotations

from typing import Any, get_args

import numpy as np


def check_choice(name: str, value: Any, choices: Any) -> None:
    """Reject ``value`` unless it is one of the ``Literal`` type ``choices``' values."""
    allowed = get_args(choices)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def _is_count(value: Any) -> bool:
    """A positive integer (a bool is not one, nor a float such as ``inf``)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and value >= 1


def check_positive(name: str, value: int | None) -> None:
    """Reject anything but a positive integer or ``None`` (bools included)."""
    if value is not None and not _is_count(value):
        raise ValueError(f"{name} must be a positive integer or None; got {value!r}")


def check_count(name: str, value: Any) -> None:
    """Reject anything but a positive integer (bools, floats such as ``inf`` and ``None`` included)."""
    if not _is_count(value):
        raise ValueError(f"{name} must be a positive integer; got {value!r}")


def check_flag(name: str, value: Any) -> None:
    """Reject anything but ``True`` or ``False`` (``bool("no")`` is True: a string would turn it on)."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be true or false; got {value!r}")


def check_non_negative_number(name: str, value: Any, *, none: bool = False) -> None:
    """Reject anything but a finite real number >= 0 (``None`` too where ``none``; bools and NaN refused)."""
    if value is None and none:
        return
    if (
        not isinstance(value, int | float | np.integer | np.floating)
        or isinstance(value, bool)
        or not np.isfinite(value)
        or value < 0
    ):
        more = " or None" if none else ""
        raise ValueError(f"{name} must be a finite number >= 0{more}; got {value!r}")


def check_eq1_options(batch_size: Any, d0: Any, d1: Any) -> None:
    """The WAIT family's ``batch_size`` (B of the paper's thresholds) and Eq. (1)'s ``d0``, ``d1`` (None: from
    the instance): a positive integer, and finite numbers >= 0."""
    check_positive("batch_size", batch_size)
    check_non_negative_number("d0", d0, none=True)
    check_non_negative_number("d1", d1, none=True)
