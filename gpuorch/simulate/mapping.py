"""Trace mapping files: a trace's columns described in YAML, without code (docs/simulation.md,
"Replaying your own trace").

A mapping says which column holds each field a job (and, optionally, a node of the node list)
has, in which unit, and how nodes group into clusters. The built-in formats are such files
(`formats/*.yaml`: `itp`, `helios`, `philly`, `pai`, `openb`), read by the same code. A field
the mapping names is *real* for every job of the trace; a field it leaves out is generated
(`generator.py`). A bad file is refused with its path and the key at fault.

A field is a column name, or a mapping with the column and how to read it:

    jobs:
      id: name                                        # required
      submit: {column: creation_time, unit: s}        # required; s, ms, us, min, h; ISO dates read as they are
      duration: {end: deletion_time, start: scheduled_time}   # required: a column, or end - start (start: submit's)
      gpus: num_gpu                                    # required; whole GPUs per job, rounded up after `scale`
      gpu_share: {column: gpu_milli, scale: 1000}      # share of each GPU (< 1 with one GPU: a fractional job)
      accelerators: {column: gpu_spec, separator: "|"} # the GPU models the job may run on ("" = any)
      cpu: {column: cpu_milli, scale: 1000}            # cores per job
      memory: {column: memory_mib, unit: MiB}          # host memory per job
    sharing: time-slicing     # the mechanism a fractional job names (`Resources.sharing`)
    models: {V100M16: {product: Tesla-V100-SXM2-16GB, memory_mib: 16384}}   # trace model names
    generator: {...}          # overrides of generator.GeneratorConfig for this trace
    nodes: {...}              # the node list's columns and grouping (`NodesFormat`)

Pure: parses documents; `load_mapping` is the one reader of a file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import msgspec
import yaml

from gpuorch_proto import ClusterRegistryEntry
from gpuorch_proto.workload import Sharing, SharingMechanism

FORMATS_DIR = Path(__file__).resolve().parent / "formats"

#: seconds per unit of a time column
TIME_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "min": 60.0, "h": 3600.0}
#: bytes per unit of a memory column
MEMORY_UNITS: dict[str, float] = {"B": 1.0, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "KB": 1e3, "MB": 1e6, "GB": 1e9}

#: the job fields a mapping may name, as the report lists them when real
JOB_FIELDS = ("id", "submit", "duration", "gpus", "gpu_share", "accelerators", "cpu", "memory")
REQUIRED_JOB_FIELDS = ("id", "submit", "duration", "gpus")


class MappingError(ValueError):
    """A mapping file that cannot be used: the message names the file and the key."""


@dataclass(frozen=True)
class Column:
    """How to read one field: `column` scaled to the field's unit (value / scale x unit factor).
    A run time may instead be `end - start` (`start` None: the submit column)."""

    column: str
    scale: float = 1.0  # divide by this (PAI's `plan_gpu` is percent of a GPU: 100)
    factor: float = 1.0  # the unit's factor to seconds or bytes
    separator: str = "|"  # lists (accelerators)
    start: str | None = None  # duration as `column` (the end) - `start`
    end_minus_submit: bool = False  # duration as `column` - the submit column


@dataclass(frozen=True)
class Model:
    product: str  # the GPU product name (nvidia.com/gpu.product) jobs and nodes use
    memory_mib: int = 0


@dataclass(frozen=True)
class ClusterRule:
    """Nodes whose columns match `where` (full-match regular expressions) form `cluster`
    (None: left out of the world), their GPUs shared by `sharing`, `replicas` devices per GPU."""

    cluster: str | None
    where: tuple[tuple[str, re.Pattern[str]], ...] = ()
    sharing: tuple[str, ...] = ()
    replicas: int = 1


@dataclass(frozen=True)
class NodesFormat:
    name: str
    gpus: Column
    model: str
    cpu: Column | None = None
    memory: Column | None = None
    pool: str | None = None
    by_column: str | None = None  # cluster = prefix + this column's value
    prefix: str = ""
    rules: tuple[ClusterRule, ...] = ()
    registry: Mapping[str, Any] = field(default_factory=dict)  # every built cluster's registry entry


@dataclass(frozen=True)
class TraceFormat:
    """A parsed mapping file: the one description every trace is read by."""

    name: str
    fields: Mapping[str, Column]  # job field -> how to read it (JOB_FIELDS)
    source: str = ""  # the file it came from
    files: str = "*.csv"  # which files of a folder are the trace
    sharing: Sharing | None = None
    models: Mapping[str, Model] = field(default_factory=dict)
    generator: Mapping[str, Any] = field(default_factory=dict)
    nodes: NodesFormat | None = None

    @property
    def real(self) -> tuple[str, ...]:
        """The job fields this trace records (what the report lists as real)."""
        return tuple(f for f in JOB_FIELDS if f in self.fields)

    def product(self, model: str) -> str:
        m = self.models.get(model)
        return m.product if m is not None else model


def _at(where: str, key: str) -> str:
    """The path of `key` under `where` ("file.yaml: " at the top: "file.yaml: jobs")."""
    return f"{where}{key}" if where.endswith(": ") else f"{where}.{key}"


def _keys(doc: Any, where: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise MappingError(f"{where.rstrip(': ')}: expected a mapping, got {doc!r}")
    bad = sorted(str(k) for k in doc if k not in allowed)
    if bad:
        raise MappingError(f"{_at(where, bad[0])}: unknown key (one of {', '.join(allowed)})")
    missing = [k for k in required if k not in doc]
    if missing:
        raise MappingError(f"{_at(where, missing[0])}: missing (required: {', '.join(required)})")
    return doc


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise MappingError(f"{where}: expected a column name (a non-empty string), got {value!r}")
    return value


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise MappingError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def _unit(value: Any, where: str, units: Mapping[str, float]) -> float:
    if value not in units:
        raise MappingError(f"{where}: unknown unit {value!r} (one of {', '.join(units)})")
    return units[value]


def parse_column(doc: Any, where: str, kind: str = "") -> Column:
    """One field: a column name, or {column, scale, unit, separator} (a run time: {end, start})."""
    if isinstance(doc, str):
        return Column(_str(doc, where), factor=1.0)
    units = TIME_UNITS if kind == "time" else MEMORY_UNITS if kind == "memory" else {}
    allowed = ["column", "scale"]
    if units:
        allowed.append("unit")
    if kind == "list":
        allowed.append("separator")
    if kind == "time" and where.endswith("duration"):
        allowed += ["end", "start"]
    d = _keys(doc, where, tuple(allowed))
    scale = _positive(d["scale"], f"{where}.scale") if "scale" in d else 1.0
    factor = _unit(d["unit"], f"{where}.unit", units) if "unit" in d else 1.0
    if "end" in d:
        if "column" in d:
            raise MappingError(f"{where}.end: give either column (the run time) or end (and start), not both")
        start = _str(d["start"], f"{where}.start") if "start" in d else None
        return Column(_str(d["end"], f"{where}.end"), scale, factor, start=start, end_minus_submit=start is None)
    if "column" not in d:
        raise MappingError(f"{where}.column: missing (the column this field is read from)")
    sep = d.get("separator", "|")
    if kind == "list" and (not isinstance(sep, str) or not sep):
        raise MappingError(f"{where}.separator: expected a non-empty string, got {sep!r}")
    return Column(_str(d["column"], f"{where}.column"), scale, factor, separator=sep)


_KINDS = {"submit": "time", "duration": "time", "memory": "memory", "accelerators": "list"}


def _rule(doc: Any, where: str) -> ClusterRule:
    d = _keys(doc, where, ("cluster", "where", "sharing", "replicas"), ("cluster",))
    cluster = d["cluster"]
    if cluster is not None and (not isinstance(cluster, str) or not cluster):
        raise MappingError(f"{where}.cluster: expected a cluster name, or null to leave the nodes out; got {cluster!r}")
    match: list[tuple[str, re.Pattern[str]]] = []
    for col, pattern in _keys(d.get("where") or {}, f"{where}.where", tuple(str(k) for k in (d.get("where") or {}))).items():
        try:
            match.append((str(col), re.compile(str(pattern))))
        except re.error as exc:
            raise MappingError(f"{where}.where.{col}: not a regular expression: {exc}") from exc
    sharing = d.get("sharing") or []
    sharing = [sharing] if isinstance(sharing, str) else sharing
    if not isinstance(sharing, list) or not all(isinstance(s, str) for s in sharing):
        raise MappingError(f"{where}.sharing: expected a mechanism or a list of them, got {d.get('sharing')!r}")
    mechanisms = get_args(SharingMechanism)
    for s in sharing:
        if s.split(":", 1)[0] not in mechanisms:
            raise MappingError(f"{where}.sharing: unknown mechanism {s!r} (one of {', '.join(mechanisms)})")
    replicas = d.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise MappingError(f"{where}.replicas: expected a whole number >= 1 (devices per shared GPU), got {replicas!r}")
    if replicas > 1 and not sharing:
        raise MappingError(f"{where}.replicas: replicas need a sharing mechanism (sharing:)")
    return ClusterRule(cluster, tuple(match), tuple(sharing), replicas)


def parse_nodes(doc: Any, where: str) -> NodesFormat:
    d = _keys(doc, where, ("name", "gpus", "model", "cpu", "memory", "pool", "cluster", "registry"),
              ("name", "gpus", "model", "cluster"))
    group = _keys(d["cluster"], f"{where}.cluster", ("column", "prefix", "rules"))
    if ("column" in group) == ("rules" in group):
        raise MappingError(f"{where}.cluster: give either column (one cluster per value) or rules, not {'both' if group else 'neither'}")
    rules: tuple[ClusterRule, ...] = ()
    if "rules" in group:
        if not isinstance(group["rules"], list) or not group["rules"]:
            raise MappingError(f"{where}.cluster.rules: expected a list of rules")
        rules = tuple(_rule(r, f"{where}.cluster.rules[{i}]") for i, r in enumerate(group["rules"]))
    registry = d.get("registry") or {}
    try:
        msgspec.convert(registry, ClusterRegistryEntry)
    except msgspec.ValidationError as exc:
        raise MappingError(f"{where}.registry: {exc}") from exc
    return NodesFormat(
        name=_str(d["name"], f"{where}.name"), gpus=parse_column(d["gpus"], f"{where}.gpus"),
        model=_str(d["model"], f"{where}.model"),
        cpu=parse_column(d["cpu"], f"{where}.cpu") if "cpu" in d else None,
        memory=parse_column(d["memory"], f"{where}.memory", "memory") if "memory" in d else None,
        pool=_str(d["pool"], f"{where}.pool") if "pool" in d else None,
        by_column=_str(group["column"], f"{where}.cluster.column") if "column" in group else None,
        prefix=str(group.get("prefix", "")), rules=rules, registry=registry,
    )


def parse_mapping(doc: Any, where: str) -> TraceFormat:
    """A mapping document (the YAML's content) as a `TraceFormat`; `where` names it in errors."""
    d = _keys(doc, f"{where}: ", ("name", "description", "files", "jobs", "sharing", "models", "generator", "nodes"), ("jobs",))
    jobs = _keys(d["jobs"], f"{where}: jobs", JOB_FIELDS, REQUIRED_JOB_FIELDS)
    cols = {k: parse_column(v, f"{where}: jobs.{k}", _KINDS.get(k, "")) for k, v in jobs.items()}
    for k in ("id", "submit", "gpus", "gpu_share", "accelerators", "cpu", "memory"):
        if k in cols and (cols[k].start is not None or cols[k].end_minus_submit):
            raise MappingError(f"{where}: jobs.{k}: only duration may be end - start")
    sharing: Sharing | None = None
    if "sharing" in d:
        try:
            sharing = msgspec.convert({"mechanism": d["sharing"]} if isinstance(d["sharing"], str) else d["sharing"], Sharing)
        except msgspec.ValidationError as exc:
            raise MappingError(f"{where}: sharing: {exc} (time-slicing, mps or mig)") from exc
    elif "gpu_share" in cols:
        raise MappingError(f"{where}: sharing: missing: a trace with gpu_share names the mechanism fractional jobs ask for")
    models: dict[str, Model] = {}
    for name, m in _keys(d.get("models") or {}, f"{where}: models", tuple(str(k) for k in (d.get("models") or {}))).items():
        mm = _keys(m, f"{where}: models.{name}", ("product", "memory_mib"), ("product",))
        mem = mm.get("memory_mib", 0)
        if isinstance(mem, bool) or not isinstance(mem, int) or mem < 0:
            raise MappingError(f"{where}: models.{name}.memory_mib: expected a whole number of MiB, got {mem!r}")
        models[str(name)] = Model(_str(mm["product"], f"{where}: models.{name}.product"), mem)
    generator = d.get("generator") or {}
    if not isinstance(generator, dict):
        raise MappingError(f"{where}: generator: expected a mapping of GeneratorConfig fields")
    files = d.get("files", "*.csv")
    return TraceFormat(
        name=str(d.get("name") or Path(where).stem), fields=cols, source=where, files=_str(files, f"{where}: files"),
        sharing=sharing, models=models, generator=generator,
        nodes=parse_nodes(d["nodes"], f"{where}: nodes") if "nodes" in d else None,
    )


def builtin_formats() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in FORMATS_DIR.glob("*.yaml")))


def load_mapping(name_or_path: str | Path) -> TraceFormat:
    """A built-in format by name (`itp`, `openb`, ...) or a mapping file by path."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = FORMATS_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise MappingError(f"unknown trace format {name_or_path!r}: one of {', '.join(builtin_formats())}, "
                               "or a mapping file (docs/simulation.md, Replaying your own trace)")
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise MappingError(f"{path}: cannot read the mapping file: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise MappingError(f"{path}: not YAML: {exc}") from exc
    return parse_mapping(doc, str(path))
