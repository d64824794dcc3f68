"""The calibrated batch-time model: InferMax's terms with a piecewise-linear token term.

::

    T(B) = N(tau)                                                    # non-attention
         + [B has a decode]  * (b0 + b1 * sum_dec m + b2 * #decodes)
         + [B has a prefill] * (p0 + p1 * sum_pf (c^2 + 2mc) + p2 * sum_pf m
                                   + p3 * #prefills + p4 * sum_pf c^2)

    N(tau) = a0 + a1 * tau + sum_k step_k * [tau > k]
                           + sum_k hinge_k * max(0, tau - k)
                           + sum_t tile_t * ceil(tau / t)

with tau the batch's token load, m the KV a request holds before the batch,
and refill counted as prefill. With no step, hinge or tile terms and
b2 = p4 = 0 it is exactly ``infermax-linear`` (seed 003, Sec. 3.2); a single
hinge is seed 001's Eq. (2.3); a single tile term is seed 001 v3's staircase
and, with a1, the token terms of seed 000's Eq. (7).

b2 (per decode) and p4 (per unit of c^2) extend InferMax's form. The attention
sample shows a per-request decode cost InferMax's terms do not carry, and
prefill work that grows with c^2 faster than the causal share c^2 + 2mc gives
it. p4 breaks the identity that sum(c^2 + 2mc) telescopes to I^2 over a
prompt's chunks (it charges chunking less), so solvers that rely on it use the
linear surrogate (:mod:`kvsched.costmodel.surrogate`), which has no p4. Every term is linear in the batch sums of
:class:`~kvsched.costmodel.features.BatchFeatures` except the step, hinge and
tile terms, which are linear within each segment between knots.

Parameters are flat floats so that an instance's ``time_model.params`` holds
them: ``a0``, ``a1``, ``b0`` ... ``p4``, and ``step<k>``, ``hinge<k>``,
``tile<t>`` for each knot or tile size (e.g. ``step128``).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from dataclasses import dataclass, field

import numpy as np

from kvsched.costmodel.base import BatchView
from kvsched.costmodel.features import BatchFeatures
from kvsched.costmodel.small import SMALL, isum

#: Scalar coefficients, in the order files list them.
SCALARS = ("a0", "a1", "b0", "b1", "b2", "p0", "p1", "p2", "p3", "p4")
#: Keyed parameters: ASCII digits only (``\d`` would take other scripts' digits, which int() reads too).
_KEYED = re.compile(r"^(step|hinge|tile)([0-9]+)$")
#: Decode runs of up to this many batches are priced on Python floats (measured break-even: 30-40).
_LIST_RUN = 32
#: Token loads whose token term a model remembers (batches hold at most a few thousand tokens).
_TOKEN_MEMO = 65_536
#: decode_run_until's slack on the end of SMALL batches bounded above (their float sum's rounding).
_MARGIN = 1.0 + 1e-9
#: Durations from Python floats: ``np.fromiter(out, _F64, len(out))``, the same doubles, costs about 200
#: instructions an item where ``np.array``'s type discovery costs 280 (runs price 267,000 batches at azure-10k).
_F64 = np.dtype(np.float64)


def _pairs(values: tuple[tuple[int, float], ...] | dict[int, float]) -> tuple[tuple[int, float], ...]:
    items = values.items() if isinstance(values, dict) else values
    return tuple(sorted((int(k), float(v)) for k, v in items))


@dataclass(frozen=True, slots=True)
class CalibratedCost:
    """The calibrated model (see the module docstring). Times are in seconds.

    Parameters
    ----------
    a0, a1
        Non-attention bias and per-token slope.
    b0, b1, b2
        Decode attention: bias, per KV token read, per decode request.
    p0, p1, p2, p3, p4
        Prefill attention: bias, per unit of c^2 + 2mc, per KV token read by
        the chunks, per prefill request, per unit of c^2.
    steps
        ``(k, s)`` pairs: s is added when the token load exceeds k. Steps may
        be negative (a GEMM kernel switch can make a larger batch faster).
    hinges
        ``(k, h)`` pairs: h per token above k (h >= 0).
    tiles
        ``(t, u)`` pairs: u per started block of t tokens (u >= 0).
    """

    a0: float = 0.0
    a1: float = 0.0
    b0: float = 0.0
    b1: float = 0.0
    b2: float = 0.0
    p0: float = 0.0
    p1: float = 0.0
    p2: float = 0.0
    p3: float = 0.0
    p4: float = 0.0
    steps: tuple[tuple[int, float], ...] = ()
    hinges: tuple[tuple[int, float], ...] = ()
    tiles: tuple[tuple[int, float], ...] = ()
    name: str = "calibrated"
    _knots: np.ndarray = field(init=False, repr=False, compare=False)
    _cum: np.ndarray = field(init=False, repr=False, compare=False)
    _knot_list: list[float] = field(init=False, repr=False, compare=False)
    _cum_list: list[float] = field(init=False, repr=False, compare=False)
    _token_memo: dict[float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for attr in ("steps", "hinges", "tiles"):
            object.__setattr__(self, attr, _pairs(getattr(self, attr)))
        for key in SCALARS:
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"cost model calibrated: coefficient {key} must be >= 0, got {value}")
        for prefix, pairs, signed in (
            ("step", self.steps, True),
            ("hinge", self.hinges, False),
            ("tile", self.tiles, False),
        ):
            if len({k for k, _ in pairs}) < len(pairs):
                dup = next(k for (k, _), (k2, _) in itertools.pairwise(pairs) if k == k2)
                raise ValueError(f"cost model calibrated: {prefix}{dup} is given twice")
            for k, v in pairs:
                if not math.isfinite(v) or (v < 0 and not signed):
                    raise ValueError(f"cost model calibrated: coefficient {prefix}{k} must be >= 0, got {v}")
                if k < 0 or (prefix == "tile" and k == 0):
                    raise ValueError(f"cost model calibrated: {prefix}{k}: bad knot {k}")
        knots = np.array([k for k, _ in self.steps], dtype=np.float64)
        # cum[j] = sum of the first j steps: the step total for a load just above knots[j-1].
        cum = np.concatenate([[0.0], np.cumsum([v for _, v in self.steps])])
        object.__setattr__(self, "_knots", knots)
        object.__setattr__(self, "_cum", cum)
        object.__setattr__(self, "_knot_list", knots.tolist())
        object.__setattr__(self, "_cum_list", cum.tolist())
        object.__setattr__(self, "_token_memo", {})
        # The token term is piecewise linear: checking 1 token and just past each knot covers every piece.
        probe = np.concatenate([[1.0], knots + 1.0])
        with np.errstate(all="ignore"):  # an overflow (inf) is refused per instance (schedule.data)
            loads = self.non_attention(probe)
        if np.any(loads < 0):
            raise ValueError("cost model calibrated: the token term is negative for some token load")

    # ------------------------------------------------------------ parameters
    @classmethod
    def from_params(cls, **params: float) -> CalibratedCost:
        """Build from flat parameters (``a0`` ... ``p4``, ``step<k>``, ``hinge<k>``, ``tile<t>``)."""
        scalars: dict[str, float] = {}
        keyed: dict[str, dict[int, float]] = {"step": {}, "hinge": {}, "tile": {}}
        for key, value in params.items():
            if key in SCALARS:
                scalars[key] = float(value)
                continue
            match = _KEYED.match(key)
            if match is None:
                raise TypeError(
                    f"calibrated: unexpected parameter {key!r} "
                    "(expected a0..p4, step<k>, hinge<k> or tile<t>)"
                )
            prefix, digits = match.groups()
            knot = int(digits)
            # One spelling per knot: with step0128 read as step128, two keys of one file or a --cost-param
            # and the file would name the same knot, and whichever came last would silently win.
            if digits != str(knot):
                raise TypeError(
                    f"calibrated: parameter {key!r}: write the knot without leading zeros ({prefix}{knot})"
                )
            if knot in keyed[prefix]:
                raise TypeError(f"calibrated: parameter {prefix}{knot} is given twice")
            keyed[prefix][knot] = float(value)
        return cls(
            **scalars,
            steps=_pairs(keyed["step"]),
            hinges=_pairs(keyed["hinge"]),
            tiles=_pairs(keyed["tile"]),
        )

    def params(self, *, zeros: bool = False) -> dict[str, float]:
        """Flat parameters, as an instance's ``time_model.params`` stores them (zeros left out).

        ``zeros=True`` lists every scalar, zeros included, as coefficient files do: a file that leaves a
        zero out cannot be told from one that lost a coefficient (:mod:`kvsched.costmodel.coeffile`).
        """
        out = {key: getattr(self, key) for key in SCALARS if zeros or getattr(self, key) != 0.0}
        for prefix, pairs in (("step", self.steps), ("hinge", self.hinges), ("tile", self.tiles)):
            out.update({f"{prefix}{k}": v for k, v in pairs})
        return out

    @property
    def is_linear(self) -> bool:
        """True when every term is linear in the batch sums (no step, hinge or tile)."""
        return not (self.steps or self.hinges or self.tiles)

    # ------------------------------------------------------------ terms
    def non_attention(self, tokens: np.ndarray | float) -> np.ndarray:
        """N(tau) for each token load in ``tokens``."""
        tau = np.asarray(tokens, dtype=np.float64)
        out = self.a0 + self.a1 * tau
        if self.steps:
            # Number of knots strictly below tau: side="left" on tau gives #knots < tau.
            out = out + self._cum[np.searchsorted(self._knots, tau, side="left")]
        for k, h in self.hinges:
            out = out + h * np.maximum(0.0, tau - k)
        for t, u in self.tiles:
            out = out + u * np.ceil(tau / t)
        return out

    def decode_attention(self, n_decode: np.ndarray, decode_kv: np.ndarray) -> np.ndarray:
        """Decode-attention time of batches with ``n_decode`` decodes reading ``decode_kv`` KV (0 if none)."""
        n = np.asarray(n_decode, dtype=np.float64)
        t = self.b0 + self.b1 * np.asarray(decode_kv, dtype=np.float64) + self.b2 * n
        return np.where(n > 0, t, 0.0)

    def prefill_attention(
        self, n_prefill: np.ndarray, quad: np.ndarray, kv: np.ndarray, sq: np.ndarray
    ) -> np.ndarray:
        """Prefill-attention time from the batch sums (0 for batches without prefill)."""
        n = np.asarray(n_prefill, dtype=np.float64)
        t = (
            self.p0
            + self.p1 * np.asarray(quad, dtype=np.float64)
            + self.p2 * np.asarray(kv, dtype=np.float64)
            + self.p3 * n
            + self.p4 * np.asarray(sq, dtype=np.float64)
        )
        return np.where(n > 0, t, 0.0)

    def _token_scalar(self, tau: float) -> float:
        # Scalar twin of non_attention: simulators call this once per batch (and run), on a token load
        # that is one of a few hundred integers, so each value is computed once (the same float).
        t = self._token_memo.get(tau)
        if t is None:
            t = self._token_term(tau)
            if type(tau) is float and len(self._token_memo) < _TOKEN_MEMO:
                self._token_memo[tau] = t
        return t

    def _token_term(self, tau: float) -> float:
        t = self.a0 + self.a1 * tau
        if self.steps:
            t += self._cum_list[bisect.bisect_left(self._knot_list, tau)]
        for k, h in self.hinges:
            if tau > k:
                t += h * (tau - k)
        for size, u in self.tiles:
            t += u * math.ceil(tau / size)
        return t

    def time_of(self, f: BatchFeatures) -> float:
        """Batch time from precomputed batch sums."""
        t = self._token_scalar(f.tokens)
        if f.n_decode:
            t += self.b0 + self.b1 * f.decode_kv + self.b2 * f.n_decode
        if f.n_prefill:
            t += (
                self.p0
                + self.p1 * f.prefill_quad
                + self.p2 * f.prefill_kv
                + self.p3 * f.n_prefill
                + self.p4 * f.prefill_sq
            )
        return t

    def batch_time(self, view: BatchView) -> float:
        return self.time_of(BatchFeatures.of(view))

    def time_of_counts(
        self,
        tokens: np.ndarray,
        context: np.ndarray,
        phases: np.ndarray,
        is_decode: np.ndarray,
        num_decodes: int,
        num_tokens: int,
    ) -> float:
        """:meth:`batch_time` of integer ``tokens`` and ``context`` from the caller's counts
        (:func:`~kvsched.costmodel.base.time_of_counts`): the same features, so the same float."""
        if num_decodes and num_decodes == tokens.size:
            # Decode-only: :meth:`time_of` on (tokens, n, sum m, no prefill), in its order of operations.
            decode = self.b0 + self.b1 * float(isum(context)) + self.b2 * float(num_decodes)
            return self._token_scalar(float(num_tokens)) + decode
        size = tokens.size
        if size > SMALL:
            return self.time_of(BatchFeatures.of_counts(tokens, context, is_decode, num_decodes, num_tokens))
        # BatchFeatures.of_counts' one pass over the lists and time_of's arithmetic, inlined: the same
        # exact integer sums, then the same float operations in the same order (no features object).
        decode_kv = quad = kv = sq = 0
        for ci, mi, di in zip(tokens.tolist(), context.tolist(), is_decode.tolist(), strict=True):
            if di:
                decode_kv += mi
            else:
                sq += ci * ci
                quad += ci * mi
                kv += mi
        t = self._token_scalar(float(num_tokens))
        if num_decodes:
            t += self.b0 + self.b1 * float(decode_kv) + self.b2 * float(num_decodes)
        if size - num_decodes:
            fsq = float(sq)
            t += (
                self.p0
                + self.p1 * (fsq + 2.0 * float(quad))
                + self.p2 * float(kv)
                + self.p3 * float(size - num_decodes)
                + self.p4 * fsq
            )
        return t

    def decode_run_times(self, context: np.ndarray, k: int) -> np.ndarray:
        """:meth:`batch_time` of ``k`` decode batches with KV ``context + j``, in its exact float order."""
        n = float(context.size)
        base = self._token_scalar(n)
        if k <= _LIST_RUN:
            # The same float operations in the same order on Python floats (IEEE doubles both): a few
            # batches cost less than seven numpy calls.
            kv0, b0, b1, b2n = float(isum(context)), self.b0, self.b1, self.b2 * n
            out = [(((j * n + kv0) * b1) + b0 + b2n) + base for j in range(k)]
            return np.fromiter(out, _F64, k)
        # In place, in batch_time's order: base + ((b0 + b1 kv) + b2 n) with kv = sum(m) + n j, exact as
        # integers < 2**53 (each step is one commutative float operation, so the bits are the same).
        t = np.arange(k, dtype=np.float64)
        t *= n
        t += float(isum(context))
        t *= self.b1
        t += self.b0
        t += self.b2 * n
        t += base
        return t

    def decode_run_until(
        self, context: np.ndarray, k: int, start: float, until: float, tol: float
    ) -> tuple[np.ndarray, float] | None:
        """:func:`~kvsched.costmodel.base.decode_run_until`: :meth:`decode_run_times`' floats, priced
        one by one while the batch starts before ``until``, for up to SMALL batches (``None`` past)."""
        n = float(context.size)
        base = self._token_scalar(n)
        kv = float(sum(context.tolist()) if n <= SMALL else isum(context))  # (isum, without the call)
        b0, b1, b2n = self.b0, self.b1, self.b2 * n
        if k > SMALL:
            # When SMALL batches of the longest duration among them (affine in kv: an end's, and float
            # rounding is monotone) end well before ``until``, the cut certainly lies further: the caller
            # prices the run on arrays as after the loop below, without its SMALL batches priced first
            # (4% of the calls at azure-10k, each 64 batches priced one by one, then again on arrays).
            longest = max(kv * b1, (kv + (SMALL - 1) * n) * b1) + b0 + b2n + base
            if longest > 0.0 and start + SMALL * longest * _MARGIN + tol < until:
                return None
        out: list[float] = []
        add = out.append
        t = start
        # kv: j n + kv0 for batch j, added up: the same exact integer (below 2**53) as the product's.
        for _ in range(k if k < SMALL else SMALL):
            if t + tol >= until:
                break
            d = ((kv * b1) + b0 + b2n) + base  # (decode_run_times' operations, in its order)
            t += d
            add(d)
            kv += n
        else:
            if k > SMALL:
                return None  # the cut lies further: the caller prices the run on arrays
        return np.fromiter(out, _F64, len(out)), t

    def chunk_run_times(
        self, context: np.ndarray, chunk_context: int, chunk_tokens: int, k: int, last: int = 0
    ) -> np.ndarray:
        """:meth:`batch_time` of ``k`` mixed batches (:func:`~kvsched.costmodel.base.chunk_run_times`).

        Batch j: decodes with KV ``context + j`` and one chunk of c tokens on
        m + j c (``last`` tokens in the last batch if ``last`` > 0). The token load
        n + c is constant (one token-term value); the decode sum grows by n and
        the chunk's m by c per batch. :meth:`time_of`'s float operations in its
        order, on the same exact integer sums (< 2**53).
        """
        n = context.size
        kv0, m0, step = isum(context), int(chunk_context), int(chunk_tokens)
        b0, b1, b2n = self.b0, self.b1, self.b2 * float(n)
        p0, p1, p2, p3, p4 = self.p0, self.p1, self.p2, self.p3, self.p4
        out = []
        c = step
        base, fsq = self._token_scalar(float(n + c)), float(c * c)
        for j in range(k):
            if last and j == k - 1:
                c = last
                base, fsq = self._token_scalar(float(n + c)), float(c * c)
            t = base
            if n:
                t += b0 + b1 * float(kv0 + n * j) + b2n
            m = m0 + j * step
            t += p0 + p1 * (fsq + 2.0 * float(c * m)) + p2 * float(m) + p3 * 1.0 + p4 * fsq
            out.append(t)
        return np.fromiter(out, _F64, k)


def calibrated(**params: float) -> CalibratedCost:
    """Registry factory: :meth:`CalibratedCost.from_params`."""
    return CalibratedCost.from_params(**params)
