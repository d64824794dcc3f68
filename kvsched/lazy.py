"""Package names that load on first use (a module ``__getattr__``, PEP 562).

A package lists where each public name lives; the name's module is imported the
first time the name is read, and the value is then kept in the package's
namespace, so later reads skip ``__getattr__``. It keeps start-up light (a command
imports what it uses) without changing what ``from package import name`` gives.
It lives at the bottom of the package, beside :mod:`kvsched.stop`, because
packages of every layer use it; it imports nothing of kvsched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_names(
    package: str, where: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names ``where`` maps to their modules.

    ``namespace`` is the package's ``globals()``. A name not in ``where`` is an
    :class:`AttributeError` (Python then tries a submodule of that name).
    """

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(where[name]), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
