"""Seed 002's fluid model: per-type equilibrium and a fluid throughput bound.

Ao, Luo, Simchi-Levi and Wang (seed 002 §3; digest ``shared/notes/002.md`` §2)
model a server that runs one batch at a time, every batch lasting

    tau(B) = d0 + d1 * (KV of the batch, the token written this iteration included)   (Eq. 1)

with request types j of prompt l_j, output l'_j and Poisson rate lambda_j.

Mapping seed 002 onto our (InferMax) accounting
-----------------------------------------------
A seed-002 prompt (l, l') takes one prefill iteration and l' decode iterations,
and holds ``l + s`` KV at stage s = 0 .. l' (the prefill produces no token; the
first output token comes with stage 1). In our semantics a request (I, O) takes
O iterations: a prefill (KV I during the batch, generating token 1) and O - 1
decodes, the k-th iteration holding ``I + k`` KV during the batch, peak
I + O - 1. So **(l, l') is our (I = l, O = l' + 1)** (:func:`from_paper`), a
paper stage s is our iteration k = s (the request has generated s tokens), and
the paper's KV ``l + s`` *is* our KV held during the batch. The paper's
throughput counts l' decode tokens a request; ours counts O = l' + 1 generated
tokens (:func:`fluid_bound` takes either).

Eq. (1) is our ``infermax-linear`` model with ``a0 = d0`` and ``a1 = b1 = p2 =
d1`` (every other coefficient 0): a batch item costs d1 times its processed
tokens plus the KV it held before, which is its KV during the batch, for a
decode, a whole prefill or a chunk alike (:func:`eq1_cost_model`,
:func:`eq1_coefficients`). The ``unit`` model is ``d0 = 1, d1 = 0``.

Per type, over its O iterations a request's *lifetime KV mass* is
``S = sum_{k=0}^{O-1} (I + k) = O (I + (O - 1) / 2)`` (the paper's
``(l' + 1)(l + l'/2)``). With paged KV the memory mass rounds every term up to
whole blocks; the time mass does not (cost models count tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvsched.errors import InputError
from kvsched.highs import new_highs, run_highs
from kvsched.instances.model import Instance, Limits, TimeModel
from kvsched.stop import Deadline

Objective = Literal["tokens", "decode-tokens", "requests"]


def from_paper(l: int, lp: int) -> tuple[int, int]:  # noqa: E741 -- the paper's symbol
    """Seed 002's prompt (l, l') as our (I, O): one prefill plus l' decodes is O = l' + 1 iterations."""
    return int(l), int(lp) + 1


def eq1_cost_model(d0: float, d1: float) -> TimeModel:
    """Seed 002's Eq. (1), ``d0 + d1 * KV of the batch``, as an ``infermax-linear`` time model."""
    params = dict(a0=d0, a1=d1, b0=0.0, b1=d1, p0=0.0, p1=0.0, p2=d1, p3=0.0)
    return TimeModel("infermax-linear", {k: float(v) for k, v in params.items()})


def eq1_coefficients(time_model: TimeModel) -> tuple[float, float]:
    """The (d0, d1) of Eq. (1) that ``time_model`` is, exactly.

    Raises
    ------
    InputError
        When the model is not of the Eq. (1) form (pass d0 and d1 explicitly then).
    """
    if time_model.name == "unit":
        return 1.0, 0.0
    if time_model.name == "infermax-linear":
        from kvsched.costmodel.infermax import InfermaxLinear

        c = InfermaxLinear(**time_model.params).coefficients()
        d1 = c["a1"]
        if c["b0"] == c["p0"] == c["p1"] == c["p3"] == 0.0 and c["b1"] == c["p2"] == d1:
            return c["a0"], d1
    # The parameters named only when they are few: a calibrated set has about 60, one line must stay a line.
    params = dict(time_model.params)
    shown = f" {params}" if len(params) <= 6 else f" ({len(params)} parameters)"
    raise InputError(
        f"time model {time_model.name!r}{shown} is not seed 002's Eq. (1) "
        "(d0 + d1 * batch KV); give d0 and d1 explicitly"
    )


def kv_mass(prompt: np.ndarray, output: np.ndarray, block_size: int = 1) -> np.ndarray:
    """Lifetime KV mass ``sum_{k=0}^{O-1} blocks(I + k) * block_size`` per request or type."""
    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    if block_size == 1:
        return output * prompt + output * (output - 1) // 2
    return np.array(
        [
            block_size * int((-(-(i + np.arange(o)) // block_size)).sum())
            for i, o in zip(prompt, output, strict=True)
        ],
        dtype=np.int64,
    )


@dataclass(frozen=True, slots=True)
class FluidEquilibrium:
    """Seed 002's equilibrium (Eq. 8-10), in our accounting.

    Parameters
    ----------
    rho
        Load ``d1 * sum_j lambda_j S_j``; the fluid is stable only when < 1 (Prop. 1).
    iteration_time
        ``Delta T* = d0 / (1 - rho)`` (``inf`` when unstable).
    per_stage
        ``lambda_j * Delta T*``: prompts of type j at every stage (WAIT's threshold at equality).
    total
        ``per_stage * O_j``, the paper's v2 ``n_j*`` (active type-j prompts).
    memory
        ``M* = Delta T* * sum_j lambda_j S_j`` (token KV; ``inf`` when unstable).
    throughput
        ``sum_j lambda_j O_j``, generated tokens per time unit (the paper's
        ``sum_j lambda_j l'_j`` counts one token fewer per request).
    """

    rho: float
    iteration_time: float
    per_stage: np.ndarray
    total: np.ndarray
    memory: float
    throughput: float

    @property
    def stable(self) -> bool:
        return self.rho < 1.0


def fluid_equilibrium(
    rates: Sequence[float], prompt: Sequence[int], output: Sequence[int], d0: float, d1: float
) -> FluidEquilibrium:
    """The equilibrium of seed 002 §3 (Eq. 8-10) for types ``(I_j, O_j)`` arriving at ``rates``.

    Every stage of type j holds ``lambda_j Delta T*`` prompts, every iteration
    lasts ``Delta T* = d0 + d1 M*``, and arrivals during one iteration equal
    completions. Memory is in tokens (the paper has no blocks).
    """
    lam = np.asarray(rates, dtype=float)
    mass = kv_mass(np.asarray(prompt), np.asarray(output)).astype(float)
    out = np.asarray(output, dtype=float)
    if lam.shape != mass.shape or (lam < 0).any():
        raise InputError("rates, prompt and output must be equally long and rates >= 0")
    load = float((lam * mass).sum())
    rho = d1 * load
    if rho >= 1.0:
        inf = float("inf")
        return FluidEquilibrium(
            rho, inf, np.full(lam.shape, inf), np.full(lam.shape, inf), inf, float(lam @ out)
        )
    dt = d0 / (1.0 - rho)
    per_stage = lam * dt
    return FluidEquilibrium(rho, dt, per_stage, per_stage * out, dt * load, float(lam @ out))


@dataclass(frozen=True, slots=True)
class FluidBound:
    """The best fluid operating point under the engine limits (see :func:`fluid_bound`).

    Parameters
    ----------
    throughput
        Objective per time unit at the optimum (an upper bound; see :func:`fluid_bound`).
    per_stage
        Prompts of each type per stage per batch at the optimum.
    iteration_time
        ``d0 + d1 * batch KV`` at the optimum.
    memory
        KV (memory mass, blocks times block size) the optimum holds.
    binding
        Which limits bind: any of ``"arrivals"``, ``"memory"``, ``"tokens"``,
        ``"running"`` (``"time"`` when none does: compute, ``d1 > 0``, only).
    """

    throughput: float
    per_stage: np.ndarray
    iteration_time: float
    memory: float
    binding: tuple[str, ...]


def fluid_bound(
    rates: Sequence[float] | None,
    prompt: Sequence[int],
    output: Sequence[int],
    d0: float,
    d1: float,
    limits: Limits,
    *,
    objective: Objective = "tokens",
    mix: Sequence[float] | None = None,
) -> FluidBound:
    """Upper bound on the long-run throughput of *any* policy, by a linear-fractional program.

    Let ``x_j`` be the type-j completions per batch and ``K`` the mean KV a batch
    holds. A completed request holds at least its memory mass ``S_j`` over its
    batches and costs at least its token mass in time, is processed in at least
    O_j batches and processes ``I_j + O_j - 1`` tokens (evictions, pauses and
    chunking only add), so::

        max  sum_j x_j w_j / (d0 + d1 K)
        s.t. sum_j x_j S_j <= K <= M,    sum_j x_j (I_j + O_j - 1) <= C,
             sum_j x_j O_j <= max_running,   x_j <= lambda_j (d0 + d1 K)

    (w_j = O_j tokens, O_j - 1 decode tokens as the paper counts, or 1 request).
    Charnes-Cooper (``t = 1 / (d0 + d1 K)``, ``y = x t``, ``k = K t``) makes it an LP,
    solved with HiGHS. ``rates=None`` drops the arrival constraint (a saturated
    queue: the overload regime of seed 002's experiments, Remark 1). ``mix``
    fixes the completions' type proportions (``x_j`` proportional to ``mix_j``).

    For a *finite* run in which every request completes, ``rates=None`` with
    ``mix`` = the counts per type bounds total weight over makespan exactly:
    with ``x_j = N_j / (number of batches)`` the constraints hold batch by batch
    on average (idle time only lowers throughput).

    When the instance is stable (``rho < 1`` and ``M* <= M``) the bound is Eq. (10),
    ``sum_j lambda_j w_j``; otherwise it is tighter than the paper's Prop. 2. It
    is a bound on rates over a long horizon (end effects of a finite run aside),
    for the Eq. (1) time model with ``d0 > 0``.
    """
    import highspy

    I = np.asarray(prompt, dtype=float)  # noqa: E741 -- the README's symbol
    O = np.asarray(output, dtype=float)  # noqa: E741
    m = I.size
    weight = {"tokens": O, "decode-tokens": O - 1.0, "requests": np.ones(m)}[objective]
    S_time = kv_mass(np.asarray(prompt), np.asarray(output)).astype(float)
    S_mem = kv_mass(np.asarray(prompt), np.asarray(output), limits.block_size).astype(float)
    if d0 <= 0 or d1 < 0:
        raise InputError(f"fluid bound needs d0 > 0 and d1 >= 0; got d0={d0}, d1={d1}")
    inf = highspy.kHighsInf
    # Columns: y_0..y_{m-1}, k (time KV mass), t.
    nv = m + 2
    ky, kt = m, m + 1
    cost = np.zeros(nv)
    cost[:m] = -weight  # HiGHS minimises
    upper = np.full(nv, inf)
    if rates is not None:
        upper[:m] = np.asarray(rates, dtype=float)
    rows: list[tuple[np.ndarray, float, float, str]] = []

    def row(coef: dict[int, float] | np.ndarray, lo: float, hi: float, tag: str) -> None:
        vec = np.zeros(nv)
        if isinstance(coef, dict):
            for c, v in coef.items():
                vec[c] = v
        else:
            vec[: coef.size] = coef
        rows.append((vec, lo, hi, tag))

    row({ky: d1, kt: d0}, 1.0, 1.0, "norm")
    v = np.zeros(nv)
    v[:m] = S_time
    v[ky] = -1.0
    row(v, -inf, 0.0, "time")  # sum y S <= k
    v = np.zeros(nv)
    v[:m] = S_mem
    v[kt] = -float(limits.kv_capacity // limits.block_size * limits.block_size)
    row(v, -inf, 0.0, "memory")
    if limits.max_batch_tokens is not None:
        v = np.zeros(nv)
        v[:m] = I + O - 1.0
        v[kt] = -float(limits.max_batch_tokens)
        row(v, -inf, 0.0, "tokens")
    if limits.max_running is not None:
        v = np.zeros(nv)
        v[:m] = O
        v[kt] = -float(limits.max_running)
        row(v, -inf, 0.0, "running")
    if mix is not None:
        w = np.asarray(mix, dtype=float)
        ref = int(np.argmax(w))
        for j in range(m):
            if j != ref:
                row({j: w[ref], ref: -w[j]}, 0.0, 0.0, "mix")
    h = new_highs(threads=1)  # a handful of columns; the thread pool must agree with the solvers'
    h.addVars(nv, np.zeros(nv), upper)
    h.changeColsCost(nv, np.arange(nv, dtype=np.int32), cost)
    for vec, lo, hi, _ in rows:
        idx = np.flatnonzero(vec).astype(np.int32)
        h.addRow(lo, hi, idx.size, idx, vec[idx])
    run_highs(h, Deadline.never(), interrupts=False)  # (a handful of columns: no limit needed)
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise InputError(f"fluid bound LP: {h.modelStatusToString(h.getModelStatus())}")
    sol = np.asarray(h.getSolution().col_value)
    y, t = sol[:m], sol[kt]
    dt = 1.0 / t
    x = y * dt
    binding: list[str] = []
    tol = 1e-7
    if rates is not None and np.any(np.asarray(rates) - y <= tol * np.maximum(1.0, np.asarray(rates))):
        binding.append("arrivals")
    for vec, _lo, hi, tag in rows[2:]:
        if tag == "mix":
            continue
        if abs(float(vec @ sol) - hi) <= tol * max(1.0, float(np.abs(vec * sol).max())):
            binding.append(tag)
    return FluidBound(
        throughput=float(weight @ y),
        per_stage=x,
        iteration_time=dt,
        memory=float(S_mem @ x),
        binding=tuple(binding) or ("time",),
    )


@dataclass(frozen=True, slots=True)
class Types:
    """Request types derived from an instance.

    Parameters
    ----------
    of
        Type index of every request (by position).
    prompt, output
        Each type's I and O (the mean, rounded, when ``by="cls"`` mixes lengths).
    count
        Requests of each type.
    rates
        Estimated arrival rate of each type: count over the arrival span (every
        request arriving at once gives ``inf``: a burst).
    """

    of: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    count: np.ndarray
    rates: np.ndarray


def instance_types(instance: Instance, by: Literal["io", "cls"] = "io") -> Types:
    """Seed 002's request types from an instance: distinct (I, O) pairs, or the ``cls`` field.

    Reads the true output lengths (hindsight): WAIT assumes lengths known at arrival.
    """
    reqs = instance.requests
    if by == "io":
        keys = [(r.prompt, r.output) for r in reqs]
    elif by == "cls":
        keys = [r.cls for r in reqs]
    else:
        raise InputError(f"types must be 'io' or 'cls'; got {by!r}")
    uniq = sorted(set(keys), key=lambda k: (k is None, str(k)) if by == "cls" else k)
    index = {k: j for j, k in enumerate(uniq)}
    of = np.array([index[k] for k in keys], dtype=np.int64)
    prompt = np.array([r.prompt for r in reqs], dtype=float)
    output = np.array([r.output for r in reqs], dtype=float)
    m = len(uniq)
    count = np.bincount(of, minlength=m)
    t_prompt = np.rint(np.bincount(of, prompt, m) / count).astype(np.int64)
    t_output = np.rint(np.bincount(of, output, m) / count).astype(np.int64)
    arrivals = np.array([r.arrival for r in reqs])
    span = float(arrivals.max() - arrivals.min()) if len(reqs) else 0.0
    rates = count / span if span > 0 else np.full(m, np.inf)
    return Types(of, t_prompt, t_output, count, rates)


__all__ = [
    "FluidBound",
    "FluidEquilibrium",
    "Types",
    "eq1_coefficients",
    "eq1_cost_model",
    "fluid_bound",
    "fluid_equilibrium",
    "from_paper",
    "instance_types",
    "kv_mass",
]
