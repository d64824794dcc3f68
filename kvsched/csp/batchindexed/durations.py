"""The infermax-linear batch duration as a linear expression of the batch-indexed model's variables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.csp.batchindexed.expr import Lin, lin_sum, term
from kvsched.csp.model import INF

if TYPE_CHECKING:
    from kvsched.csp.batchindexed.builder import Builder


def linear_duration(builder: Builder, j: int) -> Lin:
    """The infermax-linear duration of batch j as a linear expression (lower-bounded products).

    Every cost coefficient is >= 0 and a longer batch never helps, so the
    products (``w = delta mb``, ``Y >= pi mb``, ``c (c + 2 mb)`` by binary
    expansion) are bounded below only: exact at an optimum (A4.3).
    """
    m, v = builder.m, builder.v
    c, mb, delta, x, u = v.c, v.mb, v.delta, v.x, v.u
    k = builder.coef
    R = range(builder.n)
    dur = k["a0"] * term(u[j]) + k["a1"] * lin_sum(term(c[i][j]) for i in R)
    if not builder.exact_phase:
        return dur
    prods = v.prods.setdefault(j, {})
    need_w = k["b1"] > 0 or k["p1"] > 0
    if k["b0"] > 0:
        vb = m.add_var(f"v[{j}]", 0, 1)
        prods["v"] = vb
        for i in R:
            builder.row(term(vb) - term(delta[i][j]), 0, INF, f"v[{i},{j}]")
        dur = dur + k["b0"] * term(vb)
    if k["p0"] > 0:
        z = m.add_var(f"z[{j}]", 0, 1)
        prods["z"] = z
        for i in R:
            builder.row(term(z) - term(x[i][j]) + term(delta[i][j]), 0, INF, f"z[{i},{j}]")
        dur = dur + k["p0"] * term(z)
    for i in R:
        uu, cc = int(builder.peak[i]), int(builder.cap[i])
        dl, xx, mbe, cv = term(delta[i][j]), term(x[i][j]), term(mb[i][j]), term(c[i][j])
        if need_w:
            w = m.add_var(f"w[{i},{j}]", 0, uu)
            prods[("w", i)] = w
            builder.row(term(w) - mbe, -INF, 0, f"w1[{i},{j}]")
            builder.row(term(w) - uu * dl, -INF, 0, f"w2[{i},{j}]")
            builder.row(term(w) - mbe - uu * dl, -uu, INF, f"w3[{i},{j}]")
            dur = dur + k["b1"] * term(w)
        if k["p2"] > 0:
            y = m.add_var(f"Y[{i},{j}]", 0, uu)
            prods[("Y", i)] = y
            builder.row(term(y) - mbe - uu * xx + uu * dl, -uu, INF, f"Y[{i},{j}]")
            dur = dur + k["p2"] * term(y)
        if k["p1"] > 0:
            nbits = max(1, cc.bit_length())
            bits = [m.add_var(f"beta[{i},{j},{b}]", 0, 1) for b in range(nbits)]
            builder.row(cv - lin_sum(term(bv, 2**b) for b, bv in enumerate(bits)), 0, 0, f"bits[{i},{j}]")
            big = cc + 2 * uu
            ells = []
            for b, bv in enumerate(bits):
                ell = m.add_var(f"ell[{i},{j},{b}]", 0, big)
                ells.append(ell)
                builder.row(term(ell) - cv - 2 * mbe - big * term(bv), -big, INF, f"ell[{i},{j},{b}]")
            prods[("bits", i)] = (bits, ells)
            q = lin_sum(term(ell, 2**b) for b, ell in enumerate(ells)) - dl - 2 * term(prods[("w", i)])
            dur = dur + k["p1"] * q
        if k["p3"] > 0:
            dur = dur + k["p3"] * (xx - dl)
    return dur
