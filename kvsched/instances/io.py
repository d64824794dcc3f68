"""Instance files: JSON (schema-versioned, validated by pydantic) and CSV traces.

JSON layout (``schema_version`` 1)::

    {
      "schema_version": 1,
      "kind": "kvsched.instance",
      "name": "tiny",
      "limits": {"kv_capacity": 64, "block_size": 1, "max_batch_tokens": 32,
                 "max_prefill_tokens": 32, "max_running": null},
      "time_model": {"name": "unit", "params": {}},
      "requests": [{"id": "r0", "arrival": 0.0, "prompt": 8, "output": 4}, ...],
      "meta": {}
    }

Unknown fields are errors, and so are values a JSON type would only coerce
(``true`` is not a prompt length, ``8.0`` is not a token count). Token counts
and limits are at most :data:`MAX_TOKENS`, times at most :data:`MAX_TIME`, so
that every later computation fits its 64-bit arrays. CSV traces use
Vidur/Splitwise columns ``arrived_at,num_prefill_tokens,num_decode_tokens``
(extra columns are ignored); ``num_decode_tokens`` is the output length O.

Every way a file can be wrong (not UTF-8, not JSON, nested too deeply, a field
out of range) is one :class:`~kvsched.errors.InputError` naming the file and the
field; :func:`instance_fingerprint` identifies an instance's requests, so that
a schedule can say which instance it was made for.
"""

from __future__ import annotations

import dataclasses
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvsched.errors import InputError, expect_path
from kvsched.instances import EXAMPLES_DIR
from kvsched.instances.model import (
    MAX_TIME,
    MAX_TOKENS,
    REQUEST_RULES,
    Instance,
    Limits,
    Request,
    TimeModel,
    expect_instance,
    expect_limits,
    expect_time_model,
    new_requests,
)

if TYPE_CHECKING:
    from typing import TypeVar

    import pandas as pd
    from pydantic import BaseModel, ValidationError

    #: A pydantic document schema (what :func:`validated` returns an instance of).
    SchemaT = TypeVar("SchemaT", bound=BaseModel)

SCHEMA_VERSION = 1
INSTANCE_KIND = "kvsched.instance"
CSV_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


#: How pydantic names a member of a union in an error's location (``dict[str,int]``, ``constrained-str``):
#: its own words, not the file's, so they are left out of the field named.
_UNION_TAGS = (
    "dict[",
    "list[",
    "tuple[",
    "set[",
    "function-",
    "constrained-",
    "nullable[",
    "union[",
    "tagged-union[",
)
#: JSON's names for the Python values a document's fields can hold.
_JSON_TYPES = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "true or false",
    int: "a number",
    float: "a number",
}


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One line naming the first offending field, e.g. ``f.json: requests.3.prompt: ...``."""
    errors = exc.errors()
    err = errors[0]
    parts = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith(_UNION_TAGS))]
    loc = ".".join(str(p) for p in parts) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif err["type"] == "value_error":  # a validator's own words, without pydantic's "Value error, "
        msg = msg.removeprefix("Value error, ")
    elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        # pydantic's own message names the schema class ("... or instance of InstanceSchema").
        got = "null" if err.get("input") is None else _JSON_TYPES.get(type(err.get("input")), "another value")
        msg = f"expected a JSON object, got {got}"
    more = f" (and {len(errors) - 1} more error{'s' * (len(errors) > 2)})" if len(errors) > 1 else ""
    return f"{source}: {loc}: {msg}{more}"


def read_text(path: Path) -> str:
    """The UTF-8 text of ``path`` (gzip-decompressed if it is compressed), or one clear :class:`InputError`
    line when it cannot be read."""
    from kvsched.instances.csvtrace import read_file_bytes

    data = read_file_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if data.startswith(SQLITE_HEADER):  # a results database where a document belongs
            raise InputError(
                f"{path}: an SQLite database (a results database?), not a JSON or CSV file"
            ) from None
        raise InputError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def parse_json(text: str, source: str) -> Any:
    """``json.loads`` with every failure as one :class:`InputError` line naming ``source``."""
    import json  # here: a command on a CSV trace reads and writes no JSON (the import is ~6M instructions)

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise InputError(f"{source}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal of more than 4300 digits
        raise InputError(f"{source}: not valid JSON ({exc})") from None


def read_json(path: str | Path) -> Any:
    """The parsed JSON document in ``path`` (one clear :class:`InputError` when it cannot be)."""
    return parse_json(read_text(Path(path)), str(path))


_read_json = read_json


def _is_tokens(value: Any) -> bool:
    return REQUEST_RULES["prompt"][0](value)


#: Each request field's schema rule (:class:`~kvsched.instances.schema.RequestSchema`), as a check of one parsed JSON value.
_REQUEST_CHECKS: dict[str, Callable[[Any], bool]] = {name: rule for name, (rule, _) in REQUEST_RULES.items()}
_REQUIRED = frozenset(("id", "arrival", "prompt", "output"))
#: The schema's float fields: a JSON integer there is read as a float.
_FLOATS = frozenset(("arrival", "ttft_slo", "tbt_slo"))


def requests_in_bulk(raw: Any) -> tuple[Request, ...] | None:
    """The requests of a well-formed ``requests`` list, checked field by field in bulk; else ``None``.

    Validating 100,000 request objects one by one through pydantic takes seconds
    (two to load a 100k-request file); these checks take a tenth of that. They
    accept only what :class:`~kvsched.instances.schema.RequestSchema` accepts (the same types, ranges and
    unique ids): anything else returns ``None``, and the caller lets pydantic
    find and name the fault, so every error message stays the schema's own.

    Parameters
    ----------
    raw
        The document's ``requests`` value, as parsed from JSON.

    Returns
    -------
    tuple[Request, ...] or None
        The requests (integer times read as floats), or None when anything is not plainly well formed.
    """
    if type(raw) is not list or not raw or not all(type(r) is dict for r in raw):
        return None
    fields = set().union(*raw)
    if not fields <= _REQUEST_CHECKS.keys() or not all(r.keys() >= _REQUIRED for r in raw):
        return None
    for name in fields:
        check = _REQUEST_CHECKS[name]
        if not all(check(r[name]) for r in raw if name in r):
            return None
    if len({r["id"] for r in raw}) != len(raw):
        return None
    plain = not fields & (_FLOATS - {"arrival"})  # no SLO field to read as a float
    return tuple(
        Request(**r)
        if plain and type(r["arrival"]) is float
        else Request(**{k: float(v) if k in _FLOATS and v is not None else v for k, v in r.items()})
        for r in raw
    )


def validated(schema: type[SchemaT], data: Any, source: str) -> SchemaT:
    """``data`` through ``schema``, or one :class:`InputError` naming the first faulty field.

    Shared by the instance and schedule readers (:mod:`kvsched.schedule.io`), so every document
    reports a fault, or one nested too deeply for the validator, in the same words.
    """
    from pydantic import ValidationError  # here, not at the top: loading a CSV trace need not import it

    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(source, exc)) from None
    except RecursionError:
        raise InputError(f"{source}: nested too deeply") from None


def instance_from_dict(data: Any, source: str = "instance") -> Instance:
    """Validate a parsed JSON document and build the :class:`Instance`.

    A well-formed request list is checked in bulk (:func:`requests_in_bulk`)
    and the rest of the document by the schema; any fault sends the whole
    document through the schema, which names it.
    """
    if isinstance(data, dict) and "schema_version" in data and data["schema_version"] != SCHEMA_VERSION:
        raise InputError(
            f"{source}: schema_version: {data['schema_version']!r} is not supported (this kvsched reads "
            f"{SCHEMA_VERSION})"
        )
    from pydantic import ValidationError

    from kvsched.instances.schema import InstanceSchema

    requests = requests_in_bulk(data.get("requests")) if isinstance(data, dict) else None
    doc = None
    if requests is not None:
        try:  # the schema checks everything but the requests (and the first of them again)
            doc = InstanceSchema.model_validate({**data, "requests": data["requests"][:1]})
        except (ValidationError, RecursionError):
            doc = None  # the whole document through the schema below names the fault, counted as ever
    if doc is None:
        doc = validated(InstanceSchema, data, source)
        requests = tuple(Request(**r.model_dump()) for r in doc.requests)
    instance = Instance(
        requests=requests,
        limits=Limits(**doc.limits.model_dump()),
        time_model=TimeModel(doc.time_model.name, dict(doc.time_model.params)),
        name=doc.name,
        meta=dict(doc.meta),
    )
    check_time_model(instance.time_model, source)
    return instance


def check_time_model(time_model: TimeModel, source: str) -> None:
    """Build the cost model ``time_model`` names once: an unknown name or parameter is an :class:`InputError`."""
    from kvsched.costmodel import make_cost_model

    expect_time_model(time_model, source)
    try:
        make_cost_model(time_model.name, time_model.params)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None


def own_coefficients(time_model: TimeModel) -> TimeModel:
    """``time_model``, or, where it names a shipped coefficient set (``TimeModel("llama-2-7b_a100-80gb_tp1")``),
    the model and coefficients of that set, its own ``params`` replacing single ones: what ``--cost-model``
    puts in an instance, so that the instance carries its coefficients and never refers back to the file."""
    from kvsched.costmodel import REGISTRY
    from kvsched.costmodel.coeffile import shipped_cost_model

    if time_model.name in REGISTRY:
        return time_model
    found = shipped_cost_model(time_model.name)
    if found is None:
        return time_model  # (not reached after check_time_model: the name is one or the other)
    name, params = found
    return TimeModel(name, {**params, **time_model.params})


def check_instance(instance: Instance, source: str = "instance") -> Instance:
    """Check an instance built in Python against the file schema (what loading it back would check)."""
    return instance_from_dict(instance_to_dict(instance), source)


def limits_with(base: Limits | None, overrides: Mapping[str, int | None], source: str = "limits") -> Limits:
    """``base`` with the fields ``overrides`` names replaced (the others kept), checked like a file's.

    Without ``base``, ``overrides`` must give ``kv_capacity``; unnamed budgets are unlimited.
    """
    fields = asdict(base) if base is not None else {}
    unknown = set(overrides) - {f.name for f in dataclasses.fields(Limits)}
    if unknown:
        raise InputError(f"{source}: unknown limit {sorted(unknown)[0]!r}")
    fields.update(overrides)
    # What the schema accepts, checked here (loading a CSV trace need not import pydantic); anything
    # else goes through the schema, which names the fault.
    size, capacity = fields.get("block_size", 1), fields.get("kv_capacity")
    if (
        _is_tokens(capacity)
        and _is_tokens(size)
        and size <= capacity
        and all(
            v is None or _is_tokens(v) for k, v in fields.items() if k not in ("kv_capacity", "block_size")
        )
    ):
        return Limits(**fields)
    from pydantic import ValidationError

    from kvsched.instances.schema import LimitsSchema

    try:
        doc = LimitsSchema.model_validate(fields)
    except ValidationError as exc:
        raise InputError(format_validation_error(source, exc)) from None
    return Limits(**doc.model_dump())


def check_instance_fingerprint(recorded: object, instance: Instance, what: str) -> None:
    """One :class:`InputError` when ``recorded``, the fingerprint of the instance a schedule was written or
    read for (``what`` begins the message: ``"FILE: this schedule was written"``), is not ``instance``'s;
    ``None`` (unknown: a file from before fingerprints, a schedule built in memory) passes."""
    if recorded is None:
        return
    actual = instance_fingerprint(instance)
    if recorded != actual:
        name = f" {instance.name!r}" if instance.name else ""
        raise InputError(
            f"{what} for another instance (fingerprint {recorded}; the instance{name} given has {actual}): "
            "give the instance it was made for"
        )


def instance_fingerprint(instance: Instance) -> str:
    """A stable hash of the instance's requests (id, arrival, I, O), e.g. ``"sha256:3f2a..."``.

    Limits and the time model are left out on purpose: checking a schedule
    against other limits (``-M``) is a legitimate question with violations for
    an answer, while a schedule for other requests is a different instance.
    """
    import json

    rows = [[r.id, float(r.arrival), int(r.prompt), int(r.output)] for r in instance.requests]
    text = json.dumps(rows, separators=(",", ":"), ensure_ascii=True)
    import hashlib  # here: only a saved instance is hashed (its import costs a command ~2 ms)

    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def instance_to_dict(instance: Instance) -> dict[str, Any]:
    """The JSON document of ``instance`` (optional request fields left out when unset)."""
    reqs = []
    for r in instance.requests:
        d: dict[str, Any] = {"id": r.id, "arrival": r.arrival, "prompt": r.prompt, "output": r.output}
        for key in ("predicted_output", "cls", "ttft_slo", "tbt_slo"):
            value = getattr(r, key)
            if value is not None:
                d[key] = value
        if r.priority:
            d["priority"] = r.priority
        reqs.append(d)
    lim = instance.limits
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": INSTANCE_KIND,
        "name": instance.name,
        "limits": {
            "kv_capacity": lim.kv_capacity,
            "block_size": lim.block_size,
            "max_batch_tokens": lim.max_batch_tokens,
            "max_prefill_tokens": lim.max_prefill_tokens,
            "max_running": lim.max_running,
        },
        "time_model": {"name": instance.time_model.name, "params": dict(instance.time_model.params)},
        "requests": reqs,
        "meta": instance.meta,
    }


def _not_an_example(path: object, what: str) -> Path:
    """``path`` as a :class:`Path` unless it lies in the bundled examples (inputs every user shares); else
    one :class:`InputError`, also for a ``path`` that names no file at all (``None``, a number)."""
    p = Path(expect_path(path))
    if p.resolve().parent == EXAMPLES_DIR:
        raise InputError(f"{what}: {p} is in kvsched's bundled examples; write elsewhere")
    return p


#: The first bytes of every SQLite database file (a results database: ``kvsched sweep --db``).
SQLITE_HEADER = b"SQLite format 3\x00"
#: How many bytes :func:`check_not_input` reads to find a CSV trace's header line (a wide Vidur trace's
#: header is a few hundred bytes; the file itself may be gigabytes).
_SNIFF_BYTES = 4096
#: What an output is, for :func:`check_not_input`: an output of a kind may replace a file of that kind (the
#: command that writes it rewrites it: ``generate --out`` an instance, ``sweep --db`` resumes its database),
#: never an input of another kind.
OutputKind = Literal["output", "instance", "database"]


def _is_csv_trace(head: bytes) -> bool:
    """Whether ``head``, a file's first :data:`_SNIFF_BYTES` bytes (fewer: all of it), gzip-compressed or
    not, starts with a CSV trace's header.

    A trace is what :func:`load_csv_trace` reads: a header line naming at least the columns it requires
    (``arrived_at`` is optional there, so it is here). A header cut by the read drops its last, partial
    name, so that only names read whole count.
    """
    from kvsched.instances.csvtrace import GZIP_MAGIC, gunzip_head

    if head.startswith(GZIP_MAGIC):  # a compressed trace (.csv.gz): its header is in the stream
        head = gunzip_head(head, _SNIFF_BYTES)
    line, newline, _ = head.partition(b"\n")
    names = line.decode("utf-8-sig", errors="replace").rstrip("\r").split(",")
    if not newline and len(head) >= _SNIFF_BYTES:
        names = names[:-1]
    # Names as load_csv_trace's csv reader sees them: a quoted name loses its quotes, and each name its
    # surrounding spaces (csv_header strips them).
    return set(CSV_COLUMNS[1:]) <= {name.strip().strip('"') for name in names}


def check_not_input(path: str | Path, what: str, *, kind: OutputKind = "output") -> Path:
    """``path`` as a :class:`Path` unless writing an output there would destroy an input; else one
    :class:`InputError`.

    The commands refuse their own inputs by name (``commands.common.check_outputs``); the API's writers
    do not know what was read, so they refuse what is certainly an input, by the file's first bytes: a
    bundled example, a kvsched instance file, a results database (SQLite) and a CSV trace (its header
    names the trace columns). An output of ``kind`` ``"instance"`` may replace an instance file and one
    of ``kind`` ``"database"`` a database: their command rewrites or resumes a file of its own kind.
    """
    p = _not_an_example(path, what)
    try:
        if not stat.S_ISREG(p.stat().st_mode):
            return p  # a pipe or a device (-o /dev/stdout): reading it would block, and it holds no file
        with p.open("rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except OSError:
        return p  # absent or unreadable: the write itself will say
    start = head[:256]  # an instance file names its kind at the top; a deeper match is some other text
    if kind != "instance" and (
        f'"kind": "{INSTANCE_KIND}"'.encode() in start or f'"kind":"{INSTANCE_KIND}"'.encode() in start
    ):
        raise InputError(f"{what}: {p} is a kvsched instance file; refusing to overwrite it")
    if kind != "database" and head.startswith(SQLITE_HEADER):
        raise InputError(f"{what}: {p} is an SQLite database (a results database?); refusing to overwrite it")
    if _is_csv_trace(head):
        raise InputError(
            f"{what}: {p} is a CSV trace (its header names {', '.join(CSV_COLUMNS[1:])}); "
            "refusing to overwrite it"
        )
    return p


def check_instance_path(path: str | Path, what: str = "--out") -> Path:
    """``path`` as a :class:`Path` if an instance file may be written there; else the one :class:`InputError`.

    A ``.csv`` (or ``.csv.gz``) name is refused: :func:`load_instance` reads such a file as a CSV trace,
    so the JSON written there could not be read back.
    """
    p = Path(expect_path(path))
    if is_csv_name(p):
        raise InputError(
            f"{what}: {p.name}: an instance is written as JSON, and a {csv_suffix(p)} file is read as a trace; "
            "use .json"
        )
    return p


def make_folder(folder: Path, what: str) -> Path:
    """``folder`` created with its parents where missing; a refusal is one :class:`InputError` naming ``what``."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{what}: cannot create the folder {folder} ({exc.strerror or exc})") from None
    return folder


def write_output(path: Path, what: str, write: Callable[[Path], object]) -> Path:
    """Run ``write(path)`` with ``path``'s folder created first; returns ``path``.

    The one rule of the API's writers (:func:`save_instance`, ``save_schedule``, ``save_figure``,
    ``write_chrome_trace``): a missing folder is created, as the commands create theirs, and a path
    that cannot be written is one :class:`InputError` naming the writer ``what`` and the path. Only an
    :class:`OSError` is turned into one: from creating the folder, or from ``write``, which should do
    nothing but the write (its document built before, so that no fault of the caller's reads as one
    of the file system's).
    """
    make_folder(path.parent, what)
    try:
        write(path)
    except OSError as exc:
        why = "is a folder, not a file" if path.is_dir() else f"cannot be written ({exc.strerror or exc})"
        raise InputError(f"{what}: {path} {why}") from None
    return path


def save_instance(instance: Instance, path: str | Path) -> None:
    """Write ``instance`` as a JSON instance file (a path that cannot be written is an :class:`InputError`;
    a missing folder is created)."""
    import json

    expect_instance(instance)  # what loading it back checks: a file that loads
    # An instance may replace an instance file (a rerun), never a results database or a CSV trace.
    p = check_not_input(check_instance_path(path, "save_instance"), "save_instance", kind="instance")
    try:
        text = json.dumps(instance_to_dict(instance), indent=1, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:  # meta (or a time model's parameter) that JSON cannot hold
        raise InputError(f"save_instance: the instance cannot be written as JSON ({exc})") from None
    write_output(p, "save_instance", lambda q: q.write_text(text, encoding="utf-8"))


#: The names :func:`load_instance` reads as a CSV trace (gzip-compressed or not).
CSV_SUFFIXES = (".csv", ".csv.gz")


def is_csv_name(path: str | Path) -> bool:
    """Whether :func:`load_instance` reads ``path`` as a CSV trace: a name ending in ``.csv`` or ``.csv.gz``."""
    return Path(path).name.lower().endswith(CSV_SUFFIXES)


def csv_suffix(path: Path) -> str:
    """The CSV suffix ``path`` ends in (``.csv`` or ``.csv.gz``), for messages."""
    return ".csv.gz" if path.name.lower().endswith(".csv.gz") else ".csv"


def _not_json(path: Path, exc: InputError) -> InputError:
    """The error of a file that did not read as JSON: ``exc``, unless its first line is a CSV trace's
    header (a trace named ``.txt``, or a compressed one named ``.gz``), which is named as such.

    By the name alone a CSV trace is told from an instance; the sniff here is only ever an error's words.
    """
    from kvsched.instances.csvtrace import GZIP_MAGIC

    try:
        with path.open("rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except OSError:
        return exc
    if not _is_csv_trace(head):
        return exc
    want = ".csv.gz" if head.startswith(GZIP_MAGIC) else ".csv"
    return InputError(
        f"{path}: read as a JSON instance (by its name), but it is a CSV trace (its header names "
        f"{', '.join(CSV_COLUMNS[1:])}); a CSV trace's name must end in .csv or .csv.gz "
        f"(e.g. {path.with_suffix(want).name if path.suffix else path.name + want})"
    )


def load_instance(
    path: str | Path,
    *,
    limits: Limits | None = None,
    time_model: TimeModel | None = None,
    check_feasible: bool = True,
    limit_overrides: Mapping[str, int | None] | None = None,
) -> Instance:
    """Load a JSON instance file or a CSV trace.

    Parameters
    ----------
    path
        ``.json`` instance file, or ``.csv`` trace with Vidur/Splitwise columns (by the name: a name
        ending in ``.csv`` or ``.csv.gz`` is a trace). Either may be gzip-compressed (read by its
        first bytes, whatever the name: ``trace.csv.gz``, ``inst.json.gz``).
    limits, time_model
        Required for a CSV trace (which carries no limits); for a JSON file,
        they replace the file's own when given. ``time_model`` may name a
        shipped coefficient set (``TimeModel("llama-2-7b_a100-80gb_tp1")``):
        the instance then carries that set's model and coefficients.
    check_feasible
        Reject instances with a request that can never complete (I + O - 1 > M).
    limit_overrides
        Single limits to replace (e.g. ``{"kv_capacity": 64}``), keeping every
        other limit of the file (or of ``limits``); for a CSV trace without
        ``limits`` they must include ``kv_capacity``.
    """
    p = Path(expect_path(path))
    if limits is not None:
        expect_limits(limits)
    if limit_overrides is not None and not isinstance(limit_overrides, Mapping):
        raise InputError(
            f"limit_overrides: expected a mapping such as {{'kv_capacity': 64}}, got {type(limit_overrides).__name__}"
        )
    overrides = dict(limit_overrides or {})
    if time_model is not None:
        check_time_model(time_model, "time_model")
        time_model = own_coefficients(time_model)
    if is_csv_name(p):
        if limits is None and "kv_capacity" not in overrides:
            # Worded for both callers: the command line's flag and the Python argument.
            raise InputError(
                f"{p}: a CSV trace carries no engine limits; give the KV capacity "
                "(--kv-capacity on the command line; limits= or limit_overrides= in Python)"
            )
        if overrides:
            limits = limits_with(limits, overrides, "engine limits")
        assert limits is not None
        instance = load_csv_trace(p, limits, time_model or TimeModel())
        if check_feasible:
            check_trace_feasible(instance, p)
        return instance
    try:
        doc = read_json(p)
    except InputError as exc:
        raise _not_json(p, exc) from None
    instance = instance_from_dict(doc, str(p))
    if limits is not None or time_model is not None or overrides:
        new_limits = limits or instance.limits
        if overrides:
            new_limits = limits_with(new_limits, overrides, "engine limits")
        instance = replace(instance, limits=new_limits, time_model=time_model or instance.time_model)
    if check_feasible:
        instance.check_feasible(requests=False)  # its requests were checked as they were read
    return instance


def check_trace_feasible(instance: Instance, path: str | Path) -> None:
    """``instance.check_feasible(requests=False)`` for an instance just read from the CSV trace ``path``:
    a request that can never complete is named by its line in the file (its id, ``r13``, is the loader's
    own, not the file's), with how many cannot in all."""
    from kvsched.instances.csvtrace import read_csv_text, row_lines

    p = Path(path)

    def line_of(k: int) -> str:
        # Read again only here, on the error path: the loader keeps no line numbers (blank lines and
        # quoted fields over several lines shift them).
        lines = row_lines(p, read_csv_text(p), k + 1)
        return f"{p}: line {lines[k]}" if len(lines) > k else f"{p}: request {instance.requests[k].id!r}"

    instance.check_feasible(requests=False, name=line_of)


def load_csv_trace(path: str | Path, limits: Limits, time_model: TimeModel, *, name: str = "") -> Instance:
    """Read a Vidur/Splitwise-style CSV trace (``arrived_at`` in ``time_model``'s unit: the traces' seconds
    under a calibrated model, taken as slots one for one under ``unit``; nothing converts them).

    A trace without ``arrived_at`` (a lengths-only file) gets every arrival at 0.
    Read without pandas (:mod:`kvsched.instances.csvtrace`); every fault is one
    :class:`InputError` line naming the file, and for a bad value its line.
    """
    import numpy as np

    from kvsched.instances.csvtrace import csv_columns, csv_header, first_bad_row, read_csv_text

    expect_limits(limits)  # before reading: a trace carries no limits, so these are the instance's
    expect_time_model(time_model)
    p = Path(path)
    text = read_csv_text(p)
    header = csv_header(p, text)
    missing = [c for c in CSV_COLUMNS[1:] if c not in header]
    if missing:
        raise InputError(f"{p}: missing column {missing[0]!r} (expected {', '.join(CSV_COLUMNS)})")
    names = CSV_COLUMNS if CSV_COLUMNS[0] in header else CSV_COLUMNS[1:]
    cols = csv_columns(p, text, header, [header.index(c) for c in names])
    requests = None
    if cols is not None:
        if len(names) < len(CSV_COLUMNS):
            cols = [np.zeros(cols[0].size), *cols]
        requests = _numeric_requests(*cols)
    if requests is None:  # some value is not valid: the row by row check names the first one
        # The rules in words, as a JSON instance's errors give them (a CSV cell may spell a whole
        # number as 374.0); a time names its unit, the usual fault of an out-of-range arrival.
        tokens = (_positive_int, f"a whole number from 1 to {MAX_TOKENS}")
        checks = {
            "arrived_at": (
                lambda a: _finite(value=a) and 0 <= float(a) <= MAX_TIME,
                f"a number from 0 to {MAX_TIME:g}, in the time model's unit: seconds, or slots under unit",
            ),
            "num_prefill_tokens": tokens,
            "num_decode_tokens": tokens,
        }
        raise first_bad_row(p, text, header, checks)
    if not requests:
        raise InputError(f"{p}: the trace has no requests")
    # A shipped set named as the model becomes its coefficients, as in load_instance (and --cost-model).
    return Instance(tuple(requests), limits, own_coefficients(time_model), name or p.stem, {"source": str(p)})


def _numeric_requests(arrivals: Any, prompts: Any, outputs: Any) -> list[Request] | None:
    """The requests of numeric, valid CSV columns, checked with numpy; ``None`` if any value is not valid.

    The same rules as :func:`_checked_requests` (finite arrivals in [0, MAX_TIME],
    integral token counts in [1, MAX_TOKENS]), a column at a time: a 100,000-row
    trace in a fraction of the row-by-row time.
    """
    import numpy as np

    cols = (arrivals, prompts, outputs)
    if any(c.dtype.kind not in "iuf" for c in cols):  # text or booleans: checked row by row
        return None
    with np.errstate(invalid="ignore"):
        a, i, o = (c.astype(np.float64) for c in cols)
        ok = np.isfinite(a).all() and ((a >= 0) & (a <= MAX_TIME)).all()
        for t in (i, o):
            ok = ok and np.isfinite(t).all() and ((t >= 1) & (t <= MAX_TOKENS) & (t == np.floor(t))).all()
    if not ok:
        return None
    ids = [f"r{k}" for k in range(a.size)]
    return new_requests(ids, a.tolist(), i.astype(np.int64).tolist(), o.astype(np.int64).tolist())


def _finite(value: Any) -> bool:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return False
    return f == f and f not in (float("inf"), float("-inf"))


def _positive_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return _finite(value) and 1 <= float(value) <= MAX_TOKENS and float(value) == int(float(value))


def requests_table(requests: Iterable[Request]) -> pd.DataFrame:
    """Requests as a DataFrame (one row per request)."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "id": r.id,
                "arrival": r.arrival,
                "prompt": r.prompt,
                "output": r.output,
                "predicted_output": r.predicted_output,
                "cls": r.cls,
                "priority": r.priority,
            }
            for r in requests
        ]
    )


def check_output_folder(value: str | Path, flag: str, inputs: Iterable[str | Path] = ()) -> Path:
    """An output folder checked before the work: not an input, not a file, creatable."""
    path = Path(value)
    if any(same_file_key(Path(p)) == same_file_key(path) for p in inputs if p):
        raise InputError(f"{flag}: {path} is also an input of this command")
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag}: {path} is a file, not a folder")
    return make_folder(path, flag)


def same_file_key(path: Path) -> tuple[object, ...]:
    """Identifies a file through links and spellings (device and inode when it exists)."""
    try:
        st = path.stat()
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", str(path.resolve()))
