"""InferMax's batch under construction: the accumulators of one GETNEXTBATCH call.

:class:`Build` collects the items a call admits (decodes in bulk as array parts, other
items one by one) and hands them over as the batch's two arrays, in the order they joined.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsched.costmodel.small import SMALL
from kvsched.heuristics.base import SchedulerView

_INT64 = np.dtype(np.int64)


def _filled(part: Sequence[int], extra: list[int]) -> np.ndarray:
    """``np.concatenate((part, extra), dtype=np.int64)`` (``extra`` non-empty), filled in place."""
    k = len(part)
    out = np.empty(k + len(extra), _INT64)
    out[:k] = part
    if len(extra) == 1:
        out[k] = extra[0]  # a scalar write: a fraction of a list's conversion
    else:
        out[k:] = extra
    return out


@dataclass(slots=True, init=False)
class Build:
    """Accumulators of one GETNEXTBATCH call.

    Running requests are addressed by their *rank*: their index in ``order``,
    the global priority order of running requests (victims come from its tail).
    Items join one by one (``requests``, ``tokens``) or, for runs of decodes, as
    whole arrays (``parts``); :meth:`items` puts them back in the order they joined.
    """

    view: SchedulerView
    order: np.ndarray  # running requests in priority order
    kv: np.ndarray  # KV held, by rank
    decode: np.ndarray  # whether the next item is a decode, by rank
    num_decodes: int
    free: int  # KV blocks not reserved
    running: int  # requests holding a reservation
    tail: int  # next victim candidate: order[tail] and before (lowest-priority rule)
    requests: list[int]  # items added one by one, since the last part
    tokens: list[int]
    parts: list[Sequence[int]]  # requests, in the order they joined
    token_parts: list[Sequence[int]]  # their tokens
    tok: int  # tokens in the batch so far
    decode_batch: bool | None  # phase of the batch (for the hybrid check)
    evicted: list[int]
    admitted: list[int]  # indices in the waiting list
    waiting_closed: bool
    heap: list[tuple[int, int]] | None  # victims by (kv, -rank) (smallest-kv rule)
    # The parts are the ranks 0 to next_rank - 1 of order, in order (-2: they are not), added by
    # add_decodes with nothing one by one before them.
    next_rank: int
    # Every running decode's reservation was exactly its KV when the call began (set by the policy).
    exact: bool

    def __init__(
        self,
        view: SchedulerView,
        order: np.ndarray,
        kv: np.ndarray,
        decode: np.ndarray,
        num_decodes: int,
        free: int,
        running: int,
        tail: int,
    ) -> None:
        # Written out (one call per decision): the generated __init__ calls a factory per list field.
        self.view, self.order, self.kv, self.decode = view, order, kv, decode
        self.num_decodes, self.free, self.running, self.tail = num_decodes, free, running, tail
        self.requests, self.tokens, self.parts, self.token_parts = [], [], [], []
        self.evicted, self.admitted = [], []
        self.tok = 0
        self.decode_batch = None
        self.waiting_closed = False
        self.heap = None
        self.next_rank = 0
        self.exact = False

    def add_decodes(self, pos: np.ndarray, ones: np.ndarray, rank: int) -> None:
        """Append decodes of the requests ``pos``; ``ones`` is their tokens (one each); ``rank`` is the
        first one's rank when they are consecutive ranks of ``order``, else -1."""
        self.next_rank = rank + pos.size if rank == self.next_rank and not self.requests else -2
        if self.requests:
            self.parts.append(self.requests)
            self.token_parts.append(self.tokens)
            self.requests, self.tokens = [], []
        self.parts.append(pos)
        self.token_parts.append(ones)
        self.tok += pos.size
        if self.decode_batch is None:
            self.decode_batch = True

    @property
    def empty(self) -> bool:
        return not self.requests and not self.parts

    def items(self) -> tuple[Sequence[int], Sequence[int]]:
        """Requests and tokens of the batch, in the order they joined."""
        if not self.parts:
            return self.requests, self.tokens
        if len(self.requests) + sum(map(len, self.parts)) <= SMALL:
            # Python lists (fresh: the parts are views of the policy's own arrays), which the core
            # turns into its batch's arrays in one call each: cheaper than joining arrays on a few items.
            requests: list[int] = []
            tokens: list[int] = []
            for part, token_part in zip(self.parts, self.token_parts, strict=True):
                requests += part.tolist() if isinstance(part, np.ndarray) else part
                tokens += token_part.tolist() if isinstance(token_part, np.ndarray) else token_part
            return requests + self.requests, tokens + self.tokens
        # Every running request in priority order (the parts its first ranks, the items one by one the
        # others): `order` itself, whose reads the core's batch takes when it is the policy's frozen
        # running array (SchedulerView.read_items).
        k = self.next_rank
        whole = k >= 0 and (
            k == self.order.size
            if not self.requests
            else k + len(self.requests) == self.order.size and self.order[k:].tolist() == self.requests
        )
        if len(self.parts) == 1:
            part, token_part = self.parts[0], self.token_parts[0]
            if not self.requests:
                # Copies: the parts are views of the policy's own arrays.
                req, tok = (self.order if whole else np.array(part)), np.array(token_part)
            else:
                # Decodes, then a few chunks (the usual mixed batch): filled in place, about a third
                # less than joining an array and a list (which converts the list on its own first).
                req = self.order if whole else _filled(part, self.requests)
                tok = _filled(token_part, self.tokens)
        else:
            parts, token_parts = self.parts, self.token_parts
            if self.requests:
                parts, token_parts = [*parts, self.requests], [*token_parts, self.tokens]
            req = self.order if whole else np.concatenate(parts, dtype=np.int64)
            tok = np.concatenate(token_parts, dtype=np.int64)
        # Fresh and read-only (write=False): the core's batch shares them instead of copying them again.
        req.setflags(False)
        tok.setflags(False)
        return req, tok
