"""Small linear expressions for building the batch-indexed and token-indexed models row by row."""

from __future__ import annotations

from collections.abc import Iterable


class Lin:
    """A small linear expression: ``sum coef * x[var] + const``."""

    __slots__ = ("k", "t")

    def __init__(self, t: dict[int, float] | None = None, k: float = 0.0) -> None:
        self.t = dict(t) if t else {}
        self.k = float(k)

    @classmethod
    def _own(cls, t: dict[int, float], k: float) -> Lin:
        """A Lin that takes ``t`` (a dict no one else holds) and ``k`` (a float) as they are: the operators'
        results, without the constructor's copy (the batch-indexed build makes about 150,000 of them)."""
        out = object.__new__(cls)
        out.t = t
        out.k = k
        return out

    def __add__(self, other: Lin | float) -> Lin:
        if isinstance(other, Lin):
            t = self.t.copy()
            for v, c in other.t.items():
                t[v] = t.get(v, 0.0) + c
            return Lin._own(t, self.k + other.k)
        return Lin._own(self.t.copy(), self.k + float(other))

    __radd__ = __add__

    def __neg__(self) -> Lin:
        return Lin._own({v: -c for v, c in self.t.items()}, -self.k)

    def __sub__(self, other: Lin | float) -> Lin:
        # x - c is x + (-c) exactly in floating point: the same terms, in the same order, as self + (-other).
        if isinstance(other, Lin):
            t = self.t.copy()
            for v, c in other.t.items():
                t[v] = t.get(v, 0.0) - c
            return Lin._own(t, self.k - other.k)
        return Lin._own(self.t.copy(), self.k - float(other))

    def __rsub__(self, other: float) -> Lin:
        return (-self) + other

    def __mul__(self, s: float) -> Lin:
        return Lin._own({v: c * s for v, c in self.t.items()}, float(self.k * s))

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
