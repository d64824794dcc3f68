"""The correctness oracle: every request's tokens equal those of running it alone.

Running a request alone with greedy decoding gives tokens t_1 .. t_O, each the
argmax after the prompt and the tokens before it. One cache-free causal
forward pass over ``prompt + e_1 .. e_{O-1}`` (the executor's tokens) gives, at
every position j, the reference logits after the prompt and the *executor's*
tokens before j ("teacher forcing"). The executor's token e_j *agrees* when it
is an argmax of those logits. If every token agrees, the executor's tokens are
exactly the solo run's; at the first disagreement the prefixes are still equal,
so that is where the executor went wrong. The reference side has no KV cache,
no paging, no chunking and no batching -- the same weights, through the
plainest attention there is (one causal scaled-dot-product attention over the
whole sequence), and one pass per request.

With float32 on CPU every token must agree. In bfloat16/float16 the batched and
the single-request computations round differently and near-ties flip (with a
large vocabulary, exact ties of bfloat16 logits are common). Because each
position is judged on the executor's own prefix, agreement is meaningful at
every position, not only up to the first flip: :class:`OracleReport` gives the
agreement rate, and classes each disagreement as a *near-tie* (the executor's
token is within ``tie_ulps`` units in the last place of the reference maximum)
or a *miss* (anything larger, which points at a bug).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kvsched.executor.model import Decoder
from kvsched.instances.model import Instance


def causal_attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of a whole sequence over itself, causal, without any cache."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )
    return o.transpose(0, 1)


@dataclass(frozen=True, slots=True, eq=False)
class Reference:
    """The reference at each output position j (after the prompt and ``tokens[:j]``)."""

    argmax: np.ndarray  # greedy token
    top: np.ndarray  # largest logit
    chosen: np.ndarray  # logit of the token given at j


@torch.inference_mode()
def reference(model: Decoder, prompt: np.ndarray, tokens: Sequence[int]) -> Reference:
    """Reference logits' argmax, maximum, and the logit of ``tokens[j]``, after each prefix ``prompt + tokens[:j]``."""
    n = len(tokens)
    if n == 0:
        empty = np.zeros(0)
        return Reference(np.zeros(0, np.int64), empty, empty)
    seq = np.concatenate([np.asarray(prompt, np.int64), np.asarray(tokens[:-1], np.int64)])
    ids = torch.as_tensor(seq, device=model.device)
    positions = torch.arange(seq.size, device=model.device)
    rows = torch.arange(prompt.size - 1, seq.size, device=model.device)
    logits = model(ids, positions, causal_attend, rows)
    top, argmax = logits.max(dim=-1)
    given = torch.as_tensor(np.asarray(tokens, np.int64), device=model.device)
    chosen = logits.gather(1, given[:, None])[:, 0]
    return Reference(argmax.cpu().numpy(), top.cpu().numpy(), chosen.cpu().numpy())


@dataclass(frozen=True, slots=True)
class RequestCheck:
    """One request's tokens judged against the reference.

    Attributes
    ----------
    tokens
        Tokens generated.
    agree
        Tokens that are an argmax of the reference logits after the same prefix.
    prefix
        Tokens before the first disagreement (all of them when every token agrees).
    near_ties
        Disagreements within the tie tolerance.
    deficit
        Largest relative gap (reference maximum - logit of the executor's token) / |maximum|
        over the disagreements; None when every token agrees.
    """

    request: str
    tokens: int
    agree: int
    prefix: int
    near_ties: int
    deficit: float | None

    @property
    def ok(self) -> bool:
        return self.agree == self.tokens


@dataclass(frozen=True, slots=True)
class OracleReport:
    """Per-request checks and their totals."""

    checks: tuple[RequestCheck, ...]
    tie_tolerance: float

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.checks)

    @property
    def tokens_agree(self) -> int:
        return sum(c.agree for c in self.checks)

    @property
    def near_ties(self) -> int:
        return sum(c.near_ties for c in self.checks)

    @property
    def misses(self) -> int:
        return self.tokens - self.tokens_agree - self.near_ties

    @property
    def requests_identical(self) -> int:
        """Requests whose every token is the solo run's."""
        return sum(c.ok for c in self.checks)

    @property
    def match_rate(self) -> float:
        """Tokens that agree with the reference over tokens generated."""
        return self.tokens_agree / self.tokens if self.tokens else 1.0

    def summary(self) -> str:
        text = (
            f"oracle: {self.requests_identical}/{len(self.checks)} requests identical to the request run alone; "
            f"{self.tokens_agree}/{self.tokens} tokens agree ({self.match_rate:.2%})"
        )
        if not self.ok:
            first = next(c for c in self.checks if not c.ok)
            text += (
                f", {self.near_ties} near-ties (within {self.tie_tolerance:.3g} relative), {self.misses} misses; "
                f"first disagreement: request {first.request!r} at output token {first.prefix}"
            )
        return text

    def as_dict(self) -> dict[str, float | int]:
        return {
            "requests": len(self.checks),
            "requests_identical": self.requests_identical,
            "tokens": self.tokens,
            "tokens_agree": self.tokens_agree,
            "near_ties": self.near_ties,
            "misses": self.misses,
            "match_rate": self.match_rate,
            "tie_tolerance": self.tie_tolerance,
        }


def check_oracle(
    model: Decoder,
    instance: Instance,
    prompts: Sequence[np.ndarray],
    generated: Sequence[Sequence[int]],
    limit: int | None = None,
    tie_ulps: float = 4.0,
) -> OracleReport:
    """Judge every request's generated tokens (the first ``limit`` requests) against the reference.

    A disagreement is a near-tie when the reference maximum exceeds the logit of
    the executor's token by at most ``tie_ulps`` units in the last place of the
    model's dtype, relative to the maximum.

    Raises
    ------
    InputError
        When ``limit`` is not None or a whole number >= 1: 0 once reported a passing oracle that checked
        nothing ("0/0 ... 100.00%"), and -1, used as a slice, silently skipped the last request.
    """
    if limit is not None:
        from kvsched.executor.runner import check_count  # (runner imports nothing of this module)

        limit = check_count(limit, "limit", 1)
    tol = tie_ulps * torch.finfo(model.dtype).eps
    checks = []
    for k, req in enumerate(instance.requests[:limit]):
        toks = list(generated[k])
        ref = reference(model, prompts[k], toks)
        gap = ref.top - ref.chosen
        agree = gap <= 0  # the executor's token is a maximum (ties included)
        rel = gap / np.maximum(np.abs(ref.top), np.finfo(np.float32).tiny)
        near = ~agree & (rel <= tol)
        miss = np.flatnonzero(~agree)
        checks.append(
            RequestCheck(
                request=req.id,
                tokens=len(toks),
                agree=int(agree.sum()),
                prefix=int(miss[0]) if miss.size else len(toks),
                near_ties=int(near.sum()),
                deficit=float(rel[~agree].max()) if miss.size else None,
            )
        )
    return OracleReport(tuple(checks), tol)
