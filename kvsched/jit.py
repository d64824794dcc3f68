"""Compiled kernels under a deadline: call a numba kernel only where its first compile fits.

numba compiles a kernel on its first call and caches the machine code on disk
(``cache=True``), so only the first command after installing (or after editing
a kernel) pays for it: 7-9 s per kernel family on a loaded 2-core machine, up
to 30 s for all of them on a busier one. A command with a short ``--time-limit``
cannot afford that. Each caller asks :func:`use_compiled` first and, where the
kernels are cold and their compile does not fit, runs its interpreted reference
(the greedy, same decisions) or skips an optional stage (the chain Lagrangian, a
bound: the result keeps the bounds it has). ``kvsched warmup`` compiles every
kernel ahead of time.

It lives at the bottom of the package, beside :mod:`kvsched.stop`, because the
kernels live in several layers; it never imports numba or a kernel itself (the
callers hand it their dispatchers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvsched.stop import Deadline

#: Seconds a cold compile of one kernel is assumed to take; a family of several takes that many times as long
#: (:func:`compile_seconds`). Measured 7-9 s for the greedy's kernel and for the chain Lagrangian's family on
#: 2 loaded cores, but on a machine 1.8 times slower (2026-11-28) the greedy's one kernel took 19.6 s, the
#: knapsack greedy's 12.3 s, the chain Lagrangian's six 61.6 s and the seconds Lagrangian's two 19.1 s: at 15 s
#: a family, a 60 s solve on a fresh install could start a minute-long compile.
COMPILE_SECONDS = 20.0


def is_cached(dispatcher: Any) -> bool:
    """Whether numba's on-disk cache holds ``dispatcher`` for its current source and this machine.

    numba stamps its cache index with the source file's time and size (an
    edited kernel's index reads as empty) and keys each entry by the code
    generator. Anything unexpected in numba's cache layout reads as "not
    cached": the caller then takes its slower, always-correct path.
    """
    try:
        index = dispatcher._cache._cache_file._load_index()
        magic = dispatcher.targetctx.codegen().magic_tuple()
        return any(key[1] == magic for key in index)
    except Exception:  # an uncached dispatcher or another numba's layout
        return False


def is_compiled(dispatcher: Any) -> bool:
    """Whether calling ``dispatcher`` costs no compile: it has run in this process, or is cached."""
    return bool(dispatcher.signatures) or is_cached(dispatcher)


def compile_seconds(kernels: Iterable[Any]) -> float:
    """Seconds the cold ones of ``kernels`` are assumed to take to compile: :data:`COMPILE_SECONDS` each."""
    return COMPILE_SECONDS * sum(not is_compiled(k) for k in kernels)


def use_compiled(
    kernels: Iterable[Any], deadline: Deadline | None = None, *, interpreted_seconds: float = 0.0
) -> bool:
    """Whether to call the compiled ``kernels`` rather than the interpreted path (or nothing).

    Yes when every kernel is compiled already (:func:`is_compiled`), when their
    compile (:func:`compile_seconds`) fits in what is left of ``deadline``, or when the
    alternative is expected to take longer than the compile anyway (``interpreted_seconds``:
    the interpreted path's time; 0 where the alternative is to skip the stage).
    """
    kernels = list(kernels)
    need = compile_seconds(kernels)
    if not need:
        return True
    left = (deadline or Deadline.never()).remaining()
    return left >= need or interpreted_seconds > need
