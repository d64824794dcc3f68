"""Sweep specifications: a YAML grid of instances x policies (x an exact solver), expanded into cells.

A spec (see ``docs/analysis.md`` and ``kvsched/analysis/examples/``) names
instance blocks, each a generator (or instance files) with axes (``n``,
``seeds``, ``kv_capacity`` and any generator parameter given as a list), the
policies to run on every instance and, optionally, an exact solver with a time
limit. :func:`load_spec` validates it with pydantic (one error line naming the
field) and :meth:`SweepSpec.cells` expands the grid.

A :class:`Cell` is one instance and one runner (a policy, or the solver). Its
key is a hash of what it computes (:func:`cell_identity`): the canonical
configuration, with an instance file or a ``FILE.py:CLASS`` policy named by a
hash of its content rather than by its path. So a rerun of the same spec (or of
an overlapping one), from any folder and with any spelling of its paths, finds
the cells it has already finished, and an edited file makes new cells.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvsched.errors import InputError
from kvsched.instances.io import read_text
from kvsched.threads import MAX_THREADS

OBJECTIVES = ("total-latency", "makespan", "sum-ttft")
SOLVERS = ("highs", "cbc", "cpsat")
#: Length of the hexadecimal cell and instance keys.
KEY_LENGTH = 20
#: The most cells one spec may expand to: a million cells of a millisecond each already run for a quarter
#: of an hour, and an axis of 1e8 seeds expanded as a list took gigabytes before anything ran.
MAX_CELLS = 1_000_000


def _as_list(value: Any) -> Any:
    """A scalar axis value becomes a one-value axis."""
    return value if isinstance(value, list) else [value]


def _no_bools(values: Any) -> Any:
    """``values`` unless it holds a YAML true/false, which pydantic would read as the int 1 or 0."""
    if isinstance(values, list) and any(isinstance(v, bool) for v in values):
        raise ValueError("must be integers, not true or false")
    return values


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitsSpec(_Model):
    """Engine limits other than M (which is an axis)."""

    block_size: int = Field(1, gt=0)
    max_batch_tokens: int | None = Field(None, gt=0)
    max_prefill_tokens: int | None = Field(None, gt=0)
    max_running: int | None = Field(None, gt=0)


class TimeModelSpec(_Model):
    """A cost model by name, with parameters (``unit`` by default)."""

    name: str = "unit"
    params: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value


class InstanceBlock(_Model):
    """A family of instances: a generator with axes, or instance files.

    Every list-valued field (and every list-valued generator parameter) is an
    axis; the block is their cartesian product. ``seeds: 3`` means seeds 0, 1, 2.
    """

    generator: str | None = None
    file: list[str] | None = None
    n: list[int] | None = None
    seeds: list[int] = Field(default_factory=lambda: [0])
    kv_capacity: list[int] | None = None
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    time_model: TimeModelSpec = Field(default_factory=TimeModelSpec)
    params: dict[str, list[Any]] = Field(default_factory=dict)

    @field_validator("file", "n", "kv_capacity", mode="before")
    @classmethod
    def _axis(cls, value: Any) -> Any:
        return None if value is None else _no_bools(_as_list(value))

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            if not 1 <= value <= MAX_CELLS:
                raise ValueError(
                    f"a number of seeds must be from 1 to {MAX_CELLS:,} (or give a list of seeds)"
                )
            return list(range(value))
        return _no_bools(value)

    @field_validator("params", mode="before")
    @classmethod
    def _params(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        axes = {k: _as_list(v) for k, v in value.items()}
        # An empty axis makes the product empty: a sweep of 0 cells that "succeeds", as n: [] would.
        empty = [str(k) for k, v in axes.items() if isinstance(v, list) and not v]
        if empty:
            raise ValueError(f"{empty[0]}: an axis needs at least one value")
        return axes

    @field_validator("n", "kv_capacity")
    @classmethod
    def _positive(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(v < 1 for v in value)):
            raise ValueError("must be one or more integers >= 1")
        return value

    @field_validator("seeds")
    @classmethod
    def _non_negative(cls, value: list[int]) -> list[int]:
        if not value or any(v < 0 for v in value):
            raise ValueError("must be one or more integers >= 0")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> InstanceBlock:
        if (self.generator is None) == (self.file is None):
            raise ValueError("give either generator or file")
        if self.generator is not None:
            if self.n is None:
                raise ValueError("a generator block needs n (requests per instance)")
            if self.kv_capacity is None:
                raise ValueError("a generator block needs kv_capacity (M, tokens)")
        elif self.n is not None or self.params or {"limits", "time_model", "seeds"} & self.model_fields_set:
            # (seeds were taken and ignored: a file is one instance, whatever the seed)
            raise ValueError(
                "a file block takes no n, params, seeds, limits or time_model (the files fix them; "
                "kv_capacity may override M)"
            )
        return self


class PolicyEntry(_Model):
    """A registered policy, or one of your own as ``FILE.py:CLASS`` (a relative FILE read from the spec's
    folder; ``params`` go to its constructor), optionally with parameters and its own label."""

    name: str
    label: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @property
    def display(self) -> str:
        return self.label or self.name


class SolverSpec(_Model):
    """The exact solver run on every instance (optional)."""

    name: Literal["highs", "cbc", "cpsat"] = "highs"
    formulation: Literal["auto", "time", "batch"] = "auto"
    time_limit: float = Field(10.0, gt=0, allow_inf_nan=False)
    threads: int = Field(1, gt=0, le=MAX_THREADS)
    gap: float = Field(0.0, ge=0, lt=1)
    seed: int = 0
    warm_start: list[str] = Field(default_factory=list)


class SweepSpec(_Model):
    """A whole sweep (the YAML file's top level)."""

    # Names the sweep in its progress line and report: an empty or blank one names nothing.
    name: str = Field("sweep", min_length=1, pattern=r"\S")
    objective: Literal["total-latency", "makespan", "sum-ttft"] = "total-latency"
    instances: list[InstanceBlock] = Field(min_length=1)
    policies: list[PolicyEntry] = Field(min_length=1)
    solver: SolverSpec | None = None

    @model_validator(mode="after")
    def _not_too_many_cells(self) -> SweepSpec:
        count = (len(self.policies) + (self.solver is not None)) * sum(map(_block_size, self.instances))
        if count > MAX_CELLS:
            raise ValueError(
                f"the grid has {count:,} cells (policies x instances); at most {MAX_CELLS:,} in one spec"
            )
        return self

    @field_validator("policies", mode="before")
    @classmethod
    def _all(cls, value: Any) -> Any:
        if value == "all":
            from kvsched.heuristics import POLICIES

            return list(POLICIES)
        return value

    @field_validator("policies")
    @classmethod
    def _unique_labels(cls, value: list[PolicyEntry]) -> list[PolicyEntry]:
        seen: set[str] = set()
        for entry in value:
            if entry.display in seen:
                raise ValueError(
                    f"policy {entry.display!r} is listed twice (give a label to tell them apart)"
                )
            seen.add(entry.display)
        return value

    def cells(self, base: Path | None = None) -> list[Cell]:
        """Every cell of the grid, solver cells first (they take longest).

        ``base`` resolves relative instance-file and ``FILE.py:CLASS`` paths (the spec's folder; None: the
        working directory). Each is stored as an absolute path, for provenance and for the workers, and
        keyed by its content (see :func:`cell_identity`).
        """
        runners: list[dict[str, Any]] = []
        for p in self.policies:
            policy = _resolved(p.name, base)
            runner = {"kind": "policy", "name": p.display, "policy": policy, "params": dict(p.params)}
            runners.append(_with_files(runner, [policy]))
        if self.solver is not None:
            s = self.solver
            settings = s.model_dump()
            settings["solver"] = settings.pop("name")
            # A FILE.py:CLASS warm start is read from the spec's folder, as a policy is.
            settings["warm_start"] = [_resolved(name, base) for name in s.warm_start]
            solver = {"kind": "solver", "name": f"optimum ({s.formulation}/{s.name})", **settings}
            runners.insert(0, _with_files(solver, settings["warm_start"]))
        out: list[Cell] = []
        for runner in runners:
            for block in self.instances:
                for inst in _instance_configs(block, base):
                    out.append(Cell.make(self.name, inst, self.objective, runner))
        return out


def _resolved(policy: str, base: Path | None) -> str:
    """A policy's name as a cell runs it: a ``FILE.py:CLASS`` as an absolute path (a relative one read from
    the spec's folder), so that the workers and a later reader find the same file from any folder."""
    from kvsched.heuristics.own import is_file_ref

    if not is_file_ref(policy):
        return policy
    path, _, name = policy.rpartition(":")
    file = Path(path) if base is None else base / path  # (an absolute path stays itself under base /)
    return f"{file.resolve()}:{name}"


def file_digest(path: str | Path) -> str:
    """A short hash of a file's bytes: what keys an instance file or a policy file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:KEY_LENGTH]


def _with_files(runner: dict[str, Any], refs: list[str]) -> dict[str, Any]:
    """``runner`` with ``files`` (path -> content hash) for the ``FILE.py:CLASS`` among ``refs``.

    Only a runner that reads policy files gets the field: the key of every other cell stays what it was,
    so a database written before policy files were hashed keeps those cells.
    """
    from kvsched.heuristics.own import is_file_ref

    files = {ref.rpartition(":")[0]: "" for ref in refs if is_file_ref(ref)}
    if not files:
        return runner
    return {**runner, "files": {path: file_digest(path) for path in files}}


def _ref_identity(ref: Any, files: dict[str, Any]) -> Any:
    """A ``FILE.py:CLASS`` whose file is hashed in ``files``, as its content and class (no path)."""
    if not isinstance(ref, str):
        return ref
    path, _, name = ref.rpartition(":")
    return f"sha256:{files[path]}:{name}" if path in files else ref


def instance_identity(instance: dict[str, Any]) -> dict[str, Any]:
    """What an instance configuration computes on: a file instance is its content's hash, not its path."""
    # The path depends on the working directory and on how it was spelt: it stays in the row, not the key.
    if "file" in instance and "sha" in instance:
        return {k: v for k, v in instance.items() if k != "file"}
    return instance


def runner_identity(runner: dict[str, Any]) -> dict[str, Any]:
    """What a runner computes with: its policy files named by content, without the run-only settings."""
    files = runner.get("files")
    files = files if isinstance(files, dict) else {}
    # slo is added by run_sweep after keying (--slo is not part of the key); files is folded in below.
    out = {k: v for k, v in runner.items() if k not in ("files", "slo")}
    if "policy" in out:
        out["policy"] = _ref_identity(out["policy"], files)
    if isinstance(out.get("warm_start"), list):
        out["warm_start"] = [_ref_identity(ref, files) for ref in out["warm_start"]]
    return out


def cell_identity(instance: dict[str, Any], objective: str, runner: dict[str, Any]) -> dict[str, Any]:
    """What a cell's key hashes: the instance, the objective and the runner, each by what it computes.

    A generator instance and a registered policy are their configuration as before; an instance file and a
    ``FILE.py:CLASS`` policy (or warm start) are the hash of their content (with the class name). Two
    spellings of one path (relative to two folders, absolute) are one cell, and an edited file a new one.
    """
    return {
        "instance": instance_identity(instance),
        "objective": objective,
        "runner": runner_identity(runner),
    }


def cell_keys(config: Any) -> tuple[str, str] | None:
    """``(key, instance_key)`` of a stored ``{instance, objective, runner}`` configuration (None: not one)."""
    if not isinstance(config, dict):
        return None
    instance, objective, runner = config.get("instance"), config.get("objective"), config.get("runner")
    if not (isinstance(instance, dict) and isinstance(objective, str) and isinstance(runner, dict)):
        return None
    return config_hash(cell_identity(instance, objective, runner)), config_hash(instance_identity(instance))


def _block_size(block: InstanceBlock) -> int:
    """How many instances ``block`` expands to (its axes' product), counted without expanding it."""
    if block.file is not None:  # (a file block has no generator axes: its seeds are unused)
        axes = [block.file, block.kv_capacity]
    else:
        axes = [block.n, block.kv_capacity, block.seeds, *block.params.values()]
    return math.prod(len(axis or [None]) for axis in axes)


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(data: Any) -> str:
    """A short, stable hash of JSON-able ``data``."""
    return hashlib.sha256(_canonical(data).encode()).hexdigest()[:KEY_LENGTH]


@dataclass(frozen=True, slots=True)
class Cell:
    """One instance and one runner: the unit of work and the unit of storage.

    Attributes
    ----------
    key
        Hash of :func:`cell_identity`: the same work has the same key, wherever it was run from.
    instance_key
        Hash of the instance's identity (rows of one instance share it).
    sweep
        Name of the spec that produced the cell (not part of the key).
    instance, objective, runner
        The configuration: how to build the instance, what to measure, and
        ``{"kind": "policy", "name", "policy", "params"}`` or ``{"kind": "solver", ...}``.
    """

    key: str
    instance_key: str
    sweep: str
    instance: dict[str, Any]
    objective: str
    runner: dict[str, Any]

    @classmethod
    def make(cls, sweep: str, instance: dict[str, Any], objective: str, runner: dict[str, Any]) -> Cell:
        key = config_hash(cell_identity(instance, objective, runner))
        return cls(key, config_hash(instance_identity(instance)), sweep, instance, objective, runner)

    @property
    def config(self) -> dict[str, Any]:
        """What the database stores as the cell's configuration."""
        return {"instance": self.instance, "objective": self.objective, "runner": self.runner}


def _instance_configs(block: InstanceBlock, base: Path | None) -> Iterator[dict[str, Any]]:
    from kvsched.instances.generators import parse_params

    limits = block.limits.model_dump()
    time_model = block.time_model.model_dump()
    if block.file is not None:
        for name in block.file:
            path = (Path(name) if base is None else base / name).resolve()
            digest = file_digest(path)
            for m in block.kv_capacity or [None]:
                # The absolute path is provenance (and where a worker reads it); the key hashes the content.
                yield {"file": str(path), "sha": digest, "kv_capacity": m}
        return
    assert block.generator is not None and block.n is not None and block.kv_capacity is not None
    keys = list(block.params)
    for n, m, *values in itertools.product(block.n, block.kv_capacity, *block.params.values()):
        # Typed by the generator's own parser, so rate: 1 and rate: 1.0 are the same cell.
        params = parse_params(block.generator, [f"{k}={v}" for k, v in zip(keys, values, strict=True)])
        # A length mean is now that of the lengths drawn (rounded and clipped: LogNormal.fit_mean), where it
        # was the unclipped law's: the same parameters make another instance, so the cell gets another key.
        fitted = {"means": "of the lengths drawn"} if {"prompt_mean", "output_mean"} & params.keys() else {}
        for seed in block.seeds:
            yield {
                "generator": block.generator,
                "n": n,
                "seed": seed,
                "kv_capacity": m,
                "limits": limits,
                "time_model": time_model,
                "params": params,
                **fitted,
            }


def _check_semantics(spec: SweepSpec, base: Path | None) -> None:
    """What pydantic cannot see: generator names and parameters, policy names and parameters."""
    from kvsched.heuristics.own import build_policy
    from kvsched.instances.generators import GENERATORS, parse_params
    from kvsched.instances.io import check_time_model
    from kvsched.instances.model import TimeModel

    for k, block in enumerate(spec.instances):
        where = f"instances.{k}"
        if block.generator is not None:
            if block.generator not in GENERATORS:
                raise InputError(
                    f"{where}.generator: unknown generator {block.generator!r} (known: {', '.join(GENERATORS)})"
                )
            try:  # an unknown cost model or parameter is the spec's mistake, not 1 error row per cell
                check_time_model(TimeModel(block.time_model.name, dict(block.time_model.params)), where)
            except InputError as exc:
                raise InputError(
                    str(exc).replace(f"{where}: time_model.", f"{where}.time_model.", 1)
                ) from None
            keys = list(block.params)
            for values in itertools.product(*block.params.values()):
                pairs = [f"{key}={value}" for key, value in zip(keys, values, strict=True)]
                try:
                    parse_params(block.generator, pairs)
                except InputError as exc:
                    raise InputError(f"{where}.params: {exc}") from None
        for j, name in enumerate(block.file or []):
            path = Path(name) if base is None or Path(name).is_absolute() else base / name
            if not path.is_file():
                raise InputError(f"{where}.file.{j}: {path}: no such file")
    for k, entry in enumerate(spec.policies):
        try:
            # One's own scheduler is built once here, so that a bad one stops the spec.
            build_policy(_resolved(entry.name, base), entry.params)
        except InputError as exc:
            raise InputError(f"policies.{k}: {exc}") from None
    if spec.solver is not None:
        for j, name in enumerate(spec.solver.warm_start):
            try:
                build_policy(_resolved(name, base))
            except InputError as exc:
                raise InputError(f"solver.warm_start.{j}: {exc}") from None


def parse_spec(data: Any, source: str = "spec", base: Path | None = None) -> SweepSpec:
    """Validate spec data (already parsed from YAML); one :class:`InputError` line on any problem."""
    from kvsched.instances.io import format_validation_error

    if not isinstance(data, dict):
        raise InputError(f"{source}: the top level must be a mapping (name, instances, policies, solver)")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(source, exc)) from None
    try:
        _check_semantics(spec, base)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    return spec


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently, so a
    spec with two ``policies:`` ran only the second list)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                mark = key_node.start_mark
                raise InputError(
                    f"{key}: given twice in one mapping (line {mark.line + 1}, column {mark.column + 1})"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a YAML sweep spec."""
    path = Path(path)
    text = read_text(path)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise InputError(f"{path}: not valid YAML{where}") from None
    return parse_spec(data, str(path), path.parent)
