"""The MC-SF paper's request convention, mapped onto ours (InferMax accounting).

Seed 004 (Jaillet, Jiang, Podimata, Zhou, *Online Scheduling for LLM Inference
with KV Cache Constraints*; its online algorithm, "Algorithm 2", is what this
project calls MC-SF) describes a request by a prompt size ``s`` and an output
length ``o``:

* Sec. 3, *Prompt phase*: the prompt is processed and the first output token is
  generated; the request needs memory ``s``.
* Sec. 3, *Token phase*: processing the j-th output token, j = 1..o, needs
  memory ``s + j``; the peak is ``s + o``, all of it freed after the last token.
* Every batch (a *round*) lasts one time unit; there is no chunking, no token
  budget and no eviction in the model.

The paper itself counts a request's active rounds in two ways:

``"eq1"`` -- Sec. 3 and the feasibility test of Sec. 4, Eq. (1)
    Request i started at p_i occupies ``s + (t' - p_i)`` while
    ``o_i >= t' - p_i``: rounds ``p_i, ..., p_i + o_i``, that is **o + 1
    rounds** with memory ``s, s+1, ..., s+o`` and **peak s + o**.

``"ip"`` -- the hindsight integer program, Appendix B.1
    ``y_{i,t} = 1`` while ``t - p_i < o_i``, with memory ``s + t - p_i``: rounds
    ``p_i, ..., p_i + o_i - 1``, that is **o rounds** with memory
    ``s, ..., s+o-1`` and **peak s + o - 1**.

Ours (seed 003, InferMax): a request with prompt I and output O processes its
prompt (KV = I, first token generated), then O - 1 one-token decodes (KV = I +
1, ..., I + O - 1); it is active O rounds with peak I + O - 1, and the KV
counted in a round is what is held *during* that batch (appends included,
completion release after). Matching rounds and memory gives

* ``"eq1"``: ``(s, o) -> (I = s, O = o + 1)``: the paper's "o-th output token"
  is *processed* in the last round, so it generates one more token than ``o``
  in our terms (our O counts the final token, which is generated but never
  processed).
* ``"ip"``: ``(s, o) -> (I = s, O = o)``.

This is the off-by-one the digest ``shared/notes/003_004.md`` (B1) flags: Eq. (1)
and the IP disagree by one round, and both write the objective as
``sum_i (p_i + o_i)``. With round t occupying the time slot ``[t, t + 1)``, our
completion time (the end of the request's last batch) is ``p + o + 1`` under
``"eq1"`` and ``p + o`` under ``"ip"`` (see :func:`completion_time`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from kvsched.instances.model import Instance, Limits, Request, TimeModel

Convention = Literal["eq1", "ip"]
CONVENTIONS: tuple[Convention, ...] = ("eq1", "ip")


def _check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown MC-SF convention {convention!r} (expected 'eq1' or 'ip')")


def from_mcsf(s: int, o: int, convention: Convention = "eq1") -> tuple[int, int]:
    """Our ``(I, O)`` for the paper's request ``(s, o)``.

    ``"eq1"`` (Sec. 3 / Eq. (1): active o + 1 rounds, peak s + o) gives
    ``(s, o + 1)``; ``"ip"`` (App. B.1: active o rounds, peak s + o - 1) gives
    ``(s, o)``. The paper takes ``o >= 1``; under ``"eq1"`` ``o = 0`` (a
    prompt-only request, one round) is accepted too, as the inverse of O = 1.
    """
    _check_convention(convention)
    if s < 1:
        raise ValueError(f"prompt size s must be >= 1, got {s}")
    if convention == "eq1":
        if o < 0:
            raise ValueError(f"output length o must be >= 0 under 'eq1', got {o}")
        return s, o + 1
    if o < 1:
        raise ValueError(f"output length o must be >= 1 under 'ip', got {o}")
    return s, o


def to_mcsf(prompt: int, output: int, convention: Convention = "eq1") -> tuple[int, int]:
    """The paper's ``(s, o)`` for our ``(I, O)``; the inverse of :func:`from_mcsf`."""
    _check_convention(convention)
    if prompt < 1 or output < 1:
        raise ValueError(f"need I >= 1 and O >= 1, got I = {prompt}, O = {output}")
    return (prompt, output - 1) if convention == "eq1" else (prompt, output)


def mcsf_memory_profile(s: int, o: int, convention: Convention = "eq1") -> tuple[int, ...]:
    """Memory of request ``(s, o)`` in each of its active rounds, as the paper states it.

    ``"eq1"``: ``(s, s + 1, ..., s + o)`` (o + 1 rounds: the prompt round, then
    s + j while processing the j-th output token, Sec. 3 and Eq. (1));
    ``"ip"``: ``(s, s + 1, ..., s + o - 1)`` (o rounds, App. B.1 constraint 3).
    """
    from_mcsf(s, o, convention)  # validates
    rounds = o + 1 if convention == "eq1" else o
    return tuple(s + u for u in range(rounds))


def active_rounds(o: int, convention: Convention = "eq1") -> int:
    """Number of rounds a request with output length ``o`` is active."""
    _check_convention(convention)
    return o + 1 if convention == "eq1" else o


def completion_time(start: int, o: int, convention: Convention = "eq1") -> int:
    """Our completion time (end of the last batch) of a request started in round ``start``.

    Rounds are unit batches and round t runs in ``[t, t + 1)``. The paper's
    objective term ``p_i + o_i`` equals this under ``"ip"`` and is one less
    under ``"eq1"``.
    """
    return start + active_rounds(o, convention)


def mcsf_instance(
    s: int | Sequence[int],
    outputs: Sequence[int],
    kv_capacity: int,
    arrivals: Sequence[float] | None = None,
    *,
    convention: Convention = "eq1",
    name: str = "mcsf",
    ids: Sequence[str] | None = None,
) -> Instance:
    """An :class:`Instance` from MC-SF-style data: prompt size(s), output lengths, M, arrivals.

    Parameters
    ----------
    s
        The common prompt size (the theory's uniform s), or one size per
        request (the experiments' s_i, Sec. 7).
    outputs
        The paper's output lengths o_i, mapped with :func:`from_mcsf`.
    kv_capacity
        The memory limit M, in tokens.
    arrivals
        Arrival rounds; all zero (the semi-online model of Sec. 4) by default.
    convention
        ``"eq1"`` or ``"ip"`` (see the module docstring).

    The instance uses unit time (every batch is one round), no token or prefill
    budget, no block paging and no ``max_running`` (the paper has none of
    these). Output lengths are known on arrival in the paper, so
    ``predicted_output`` is the true O. Raises
    :class:`~kvsched.errors.InfeasibleInstanceError` when a request's peak
    exceeds M.
    """
    _check_convention(convention)
    n = len(outputs)
    sizes = [int(s)] * n if isinstance(s, int) else [int(x) for x in s]
    if len(sizes) != n:
        raise ValueError(f"{len(sizes)} prompt sizes for {n} output lengths")
    times = [0.0] * n if arrivals is None else [float(a) for a in arrivals]
    if len(times) != n:
        raise ValueError(f"{len(times)} arrivals for {n} output lengths")
    names = [f"r{k}" for k in range(n)] if ids is None else list(ids)
    if len(names) != n or len(set(names)) != n:
        raise ValueError("ids must be unique, one per request")
    requests = []
    for rid, size, o, arrival in zip(names, sizes, outputs, times, strict=True):
        prompt, output = from_mcsf(size, int(o), convention)
        requests.append(
            Request(id=rid, arrival=arrival, prompt=prompt, output=output, predicted_output=output)
        )
    instance = Instance(
        tuple(requests),
        Limits(kv_capacity=int(kv_capacity)),
        TimeModel("unit"),
        name=name,
        meta={"source": "mcsf", "convention": convention, "s": sizes, "o": [int(o) for o in outputs]},
    )
    instance.check_feasible()
    return instance


__all__ = [
    "CONVENTIONS",
    "Convention",
    "active_rounds",
    "completion_time",
    "from_mcsf",
    "mcsf_instance",
    "mcsf_memory_profile",
    "to_mcsf",
]
