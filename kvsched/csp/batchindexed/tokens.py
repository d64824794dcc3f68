"""Token rows, valid for every legal schedule, and the normal-form dominance rows (see the package docstring).

``add_token_rows`` takes the builder as ``self`` on purpose: it is one more of
its constraint families, kept in its own module for size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.csp.batchindexed.data import BatchData
from kvsched.csp.batchindexed.expr import Lin, lin_sum, term
from kvsched.csp.model import INF

if TYPE_CHECKING:
    from kvsched.csp.batchindexed.builder import Builder


def clique_sets(data: BatchData) -> list[dict[int, int]]:
    """Maximal sets of (request, first token index) whose tokens pairwise exceed M together.

    A request generating its k-th token holds ``w = I + k - 1`` KV during that
    batch, in every legal schedule. For a threshold ``t <= M / 2`` and a
    request ``a``, the tokens of ``a`` with ``w >= t`` and the tokens of the
    others with ``w > M - t`` pairwise exceed M, and ``a`` generates at most
    one token per batch: at most one of them per batch. Each set maps a
    request to the first token index in it (its later tokens weigh more).
    """
    n, cap = data.n, int(data.kv_cap)
    weights = sorted({int(data.prompt[i]) + k for i in range(n) for k in range(int(data.output[i]))})
    sets: set[tuple[int | None, ...]] = set()
    for t in [w for w in weights if 2 * w <= cap] + [cap // 2 + cap % 2]:
        for a in range(n):
            first = []
            for i in range(n):
                k = max(1, (t if i == a else cap - t + 1) - int(data.prompt[i]) + 1)
                first.append(k if k <= data.output[i] else None)
            if sum(k is not None for k in first) >= 2:
                sets.add(tuple(first))

    def covers(a: tuple, b: tuple) -> bool:
        return all(y is None or (x is not None and x <= y) for x, y in zip(a, b, strict=True))

    maximal = [b for b in sets if not any(a != b and covers(a, b) for a in sets)]
    return [{i: k for i, k in enumerate(b) if k is not None} for b in sorted(maximal, key=str)]


def add_token_rows(self: Builder) -> None:
    """Token-indexed strengthening: ``z[i,k,j]`` = request i has generated k tokens by batch j.

    Valid for every legal schedule: ``G = sum_k z``, ``z`` grows with j, at
    most one token per batch (``z[i,k,j] <= z[i,k-1,j-1]``), ``d = z[i,O,j]``;
    the tokens generated in batch j weigh ``I + k - 1`` each and fit in M
    (their KV is held during the batch), with the clique rows of
    :func:`clique_sets`. With :attr:`dominance`, the normal form: a request's
    KV during batch j is exactly the weight of the token it generates there
    (0 when it generates none).
    """
    m, J, V = self.m, self.J, self.v
    G, d, c, g, e, mb, kv, u = V.G, V.d, V.c, V.g, V.e, V.mb, V.m, V.u
    R = range(self.n)
    prompt, out = self.prompt, self.output

    def lin(v: int) -> Lin:
        return term(v)

    # zl[i][k][j]: z as an expression (a constant where G's bounds decide it).
    zl: list[list[list[Lin]]] = []
    for i in R:
        self.stop.check()
        o = int(out[i])
        rows = [[Lin()] * (J + 1) for _ in range(o + 1)]
        for j in range(1, J + 1):
            glo, ghi = m.lb[G[i][j]], m.ub[G[i][j]]
            for k in range(1, o + 1):
                if k <= glo:
                    rows[k][j] = Lin(k=1.0)
                elif k > ghi:
                    rows[k][j] = Lin()
                else:
                    var = m.add_var(f"z[{i},{k},{j}]", 0, 1)
                    V.zvars.append((var, i, k, j))
                    rows[k][j] = lin(var)
        zl.append(rows)
    gen: list[list[Lin]] = [[Lin()] * (J + 1) for _ in R]  # weighted token generated in batch j
    for i in R:
        self.stop.check()
        o, z = int(out[i]), zl[i]
        for j in range(1, J + 1):
            self.row(lin(G[i][j]) - lin_sum(z[k][j] for k in range(1, o + 1)), 0, 0, f"zG[{i},{j}]")
            self.row(lin(d[i][j]) - z[o][j], 0, 0, f"zd[{i},{j}]")
            for k in range(1, o + 1):
                if j >= 2:
                    self.row(z[k][j - 1] - z[k][j], -INF, 0, f"zmono[{i},{k},{j}]")
                if k >= 2:
                    self.row(z[k][j] - z[k - 1][j - 1], -INF, 0, f"zprec[{i},{k},{j}]")
            gen[i][j] = lin_sum((z[k][j] - z[k][j - 1]) * float(prompt[i] + k - 1) for k in range(1, o + 1))
    cliques = clique_sets(self.data)
    for j in range(1, J + 1):
        self.stop.check()
        self.row(lin_sum(gen[i][j] for i in R) - self.kv_cap * lin(u[j]), -INF, 0, f"zkv[{j}]")
        for q, members in enumerate(cliques):
            row = lin_sum(
                zl[i][k][j] - zl[i][k][j - 1] for i, k0 in members.items() for k in range(k0, int(out[i]) + 1)
            )
            self.row(row, -INF, 1, f"clique[{q},{j}]")
    if not self.dominance:
        return
    evict = self.allow_eviction
    for i in R:
        self.stop.check()
        cc = int(self.cap[i])
        for j in range(1, J + 1):
            tag = f"{i},{j}"
            # A chunk that produces no token can wait for the batch that does (no budgets, unit time).
            self.row(lin(c[i][j]) - cc * lin(g[i][j]), -INF, 0, f"nf-chunk[{tag}]")
            if evict:
                # A paused request is evicted (refilling costs nothing under unit time without budgets),
                # so it holds exactly the KV of the token it generates, if any.
                self.row(lin(mb[i][j]) + lin(c[i][j]) - gen[i][j], 0, 0, f"nf-kv[{tag}]")
                if e[i][j] >= 0:  # and a request that generates is not evicted first (no gain)
                    self.row(lin(e[i][j]) + lin(g[i][j]), -INF, 1, f"nf-keep[{tag}]")
                o = int(out[i])
                done_now = zl[i][o][j] - zl[i][o][j - 1]
                self.row(lin(kv[i][j]) - gen[i][j] + float(self.peak[i]) * done_now, 0, 0, f"nf-m[{tag}]")
