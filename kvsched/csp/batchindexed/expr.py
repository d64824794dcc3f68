"""Small linear expressions for building the batch-indexed and token-indexed models row by row."""

from __future__ import annotations

from collections.abc import Iterable


class Lin:
    """A small linear expression: ``sum coef * x[var] + const``."""

    __slots__ = ("k", "t")

    def __init__(self, t: dict[int, float] | None = None, k: float = 0.0) -> None:
        self.t = dict(t) if t else {}
        self.k = float(k)

    def __add__(self, other: Lin | float) -> Lin:
        out = Lin(self.t, self.k)
        if isinstance(other, Lin):
            for v, c in other.t.items():
                out.t[v] = out.t.get(v, 0.0) + c
            out.k += other.k
        else:
            out.k += float(other)
        return out

    __radd__ = __add__

    def __neg__(self) -> Lin:
        return Lin({v: -c for v, c in self.t.items()}, -self.k)

    def __sub__(self, other: Lin | float) -> Lin:
        return self + (-other)

    def __rsub__(self, other: float) -> Lin:
        return (-self) + other

    def __mul__(self, s: float) -> Lin:
        return Lin({v: c * s for v, c in self.t.items()}, self.k * s)

    __rmul__ = __mul__


def term(var: int, coef: float = 1.0) -> Lin:
    """``coef * x[var]``."""
    return Lin({var: coef})


def lin_sum(exprs: Iterable[Lin]) -> Lin:
    """The sum of ``exprs`` (one pass, no intermediate copies)."""
    out = Lin()
    for e in exprs:
        for v, c in e.t.items():
            out.t[v] = out.t.get(v, 0.0) + c
        out.k += e.k
    return out
