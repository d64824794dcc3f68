"""Reading the numeric columns of a Vidur/Splitwise-style CSV trace, without pandas.

:func:`kvsched.instances.io.load_csv_trace` reads traces through this module:
importing pandas cost every ``kvsched simulate TRACE.csv`` 0.2-0.35 s, more
than parsing a 100,000-request trace. A file of plain numeric rows is parsed by
``numpy.loadtxt`` (compiled); anything it refuses (quoted fields, text in a
column, a row of another width) is read again by the :mod:`csv` module, and a
fault is named by :func:`first_bad_row`: its line, column and value.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvsched.errors import InputError

#: The first bytes of every gzip stream (RFC 1952): a compressed trace is read whatever its name.
GZIP_MAGIC = b"\x1f\x8b"


def read_file_bytes(path: Path) -> bytes:
    """The bytes of ``path``, gzip-decompressed when the file is a gzip stream (a ``.csv.gz`` trace, as the
    Vidur/Splitwise traces ship, or a ``.json.gz`` instance); one clear :class:`InputError` line otherwise.

    By the first bytes, not the name: a plain file named ``.gz`` is read as it is.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not a file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not data.startswith(GZIP_MAGIC):
        return data
    import gzip  # here: only a compressed file needs it
    import zlib

    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:  # a truncated or damaged archive
        raise InputError(f"{path}: gzip-compressed, but cannot be decompressed ({exc})") from None


def gunzip_head(head: bytes, size: int) -> bytes:
    """At most ``size`` decompressed bytes from ``head``, a gzip stream's first bytes (``b""`` if they are
    not one): enough to read a compressed file's first line without reading the file."""
    import zlib

    try:
        return zlib.decompressobj(wbits=31).decompress(head, size)  # 31: expect a gzip header
    except zlib.error:
        return b""


def read_csv_text(path: Path) -> str:
    """The UTF-8 text of ``path`` (gzip-decompressed if it is compressed, a byte-order mark dropped), or
    one clear :class:`InputError` line."""
    data = read_file_bytes(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not a readable CSV file (not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def csv_header(path: Path, text: str) -> list[str]:
    """The column names in the first line of ``text`` (an :class:`InputError` if there are none).

    Names are stripped of surrounding spaces: ``arrived_at, num_prefill_tokens`` (a space after each
    comma, as some writers put it) names the columns it means, not ``' num_prefill_tokens'``.
    """
    first = text.partition("\n")[0].rstrip("\r")
    try:
        header = next(csv.reader([first]), [])
    except csv.Error as exc:
        raise InputError(f"{path}: not a readable CSV file (line 1: {exc})") from None
    if not header:
        raise InputError(f"{path}: not a readable CSV file (no columns in its first line)")
    return [name.strip() for name in header]


def _rows(path: Path, text: str, width: int) -> Any:  # -> Iterator[tuple[int, list[str]]]
    """(line, fields) of every data row, blank lines skipped; a row wider than the header is an error."""
    reader = csv.reader(io.StringIO(text))
    try:
        next(reader, None)
        for row in reader:
            if not row or row == [""]:
                continue
            if len(row) > width:
                raise InputError(
                    f"{path}: not a readable CSV file (line {reader.line_num} has {len(row)} fields, "
                    f"the header {width})"
                )
            yield reader.line_num, row
    except csv.Error as exc:
        raise InputError(f"{path}: not a readable CSV file (line {reader.line_num}: {exc})") from None


def _same_width(body: str, width: int) -> bool:
    """Whether every line of ``body`` (no quotes in it) that is not blank has ``width`` fields.

    ``numpy.loadtxt`` checks only that the columns it reads exist, so a row
    wider than the header would pass; counted here with numpy over the bytes.
    """
    raw = np.frombuffer(body.encode(), dtype=np.uint8)
    ends = np.append(np.flatnonzero(raw == 10), raw.size)  # each line's end (its newline, or the text's)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    commas = np.flatnonzero(raw == 44)
    per_line = np.searchsorted(commas, ends) - np.searchsorted(commas, starts)
    # A blank line ("" or a lone carriage return) has no field; numpy.loadtxt skips it.
    blank = (ends - starts == 0) | ((ends - starts == 1) & (raw[np.minimum(starts, raw.size - 1)] == 13))
    return bool(((per_line == width - 1) | (blank & (per_line == 0))).all())


def csv_columns(path: Path, text: str, header: list[str], at: list[int]) -> list[np.ndarray] | None:
    """Columns ``at`` (indices into ``header``) of the data rows as float64 arrays.

    ``None`` when some cell there is not a number (the caller names it with
    :func:`first_bad_row`); a row wider than the header is an :class:`InputError`.
    """
    body = text.partition("\n")[2]
    if not body.strip():
        return [np.zeros(0) for _ in at]
    if '"' not in body and _same_width(body, len(header)):
        try:
            table = np.loadtxt(
                io.StringIO(body), delimiter=",", usecols=at, dtype=np.float64, comments=None, ndmin=2
            )
            return [np.ascontiguousarray(table[:, j]) for j in range(len(at))]
        except ValueError:
            pass  # read again row by row below, which finds the fault
    values: list[list[float]] = [[] for _ in at]
    for _, row in _rows(path, text, len(header)):
        for i, out in zip(at, values, strict=True):
            try:
                out.append(float(row[i]) if i < len(row) else float("nan"))
            except ValueError:
                return None
    return [np.array(v, dtype=np.float64) for v in values]


def number_or_text(text: str) -> Any:
    """``text`` as the number it spells (int before float), else the text itself (a CSV cell in an error
    message, a ``--param`` value)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def first_bad_row(
    path: Path, text: str, header: list[str], checks: dict[str, tuple[Callable[[Any], bool], str]]
) -> InputError:
    """The error for the first value (in file order) of the columns in ``checks`` that fails its check.

    ``checks`` maps a column to its check and the words of its rule (``"a whole number from 1 to ..."``),
    which the error states, as a JSON instance's errors state theirs.
    """
    at = [(header.index(name), name, ok, words) for name, (ok, words) in checks.items() if name in header]
    for line, row in _rows(path, text, len(header)):
        for i, name, ok, words in at:
            value = number_or_text(row[i].strip()) if i < len(row) else ""
            if not ok(value):
                return InputError(f"{path}: line {line}: {name}: {value!r} is not valid (must be {words})")
    return InputError(f"{path}: not a readable CSV file")  # not reached: some value failed its check


def row_lines(path: Path, text: str, rows: int) -> list[int]:
    """The file line of each of the first ``rows`` data rows of ``text`` (blank lines skipped, a quoted
    field over several lines counted as the reader counts it): how an error names a request of a trace."""
    lines: list[int] = []
    for line, _ in _rows(path, text, 2**31):
        if len(lines) == rows:
            break
        lines.append(line)
    return lines
