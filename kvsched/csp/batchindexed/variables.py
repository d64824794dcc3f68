"""The batch-indexed model's variables, returned by value with the model they belong to."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsched.csp.batchindexed.expr import Lin


@dataclass(eq=False)
class Variables:
    """Indices of the model's variables: ``X[i][j]`` for request i and batch j (0 = the initial state).

    See the package docstring for what each one means. ``e[i][j]`` is -1 where
    no eviction variable exists (then ``mb[i][j]`` is ``m[i][j-1]``); ``alpha``
    and ``eta`` are None for a request that needs none.
    """

    J: int
    G: list[list[int]]
    d: list[list[int]]
    m: list[list[int]]
    c: list[list[int]]
    g: list[list[int]]
    e: list[list[int]]
    mb: list[list[int]]
    H: list[list[int]]
    rho: list[list[int]]
    delta: list[list[int]]
    x: list[list[int]]
    alpha: list[list[int] | None]
    eta: list[list[int] | None]
    u: list[int]
    tau: list[int]
    E: list[int]
    #: Completion (or first-token) time variables of the timed objectives.
    fin: list[int] = field(default_factory=list)
    #: Per request, the cumulative KV-area variables of the "full" cuts.
    zs: list[list[int]] = field(default_factory=list)
    #: ``(var, i, k, j)`` of each token variable "request i has generated k tokens by batch j".
    zvars: list[tuple[int, int, int, int]] = field(default_factory=list)
    #: Per batch, the product variables of the infermax-linear duration.
    prods: dict[int, dict] = field(default_factory=dict)
    #: Each batch's duration as an expression (index 0 unused).
    durations: list[Lin] = field(default_factory=list)
