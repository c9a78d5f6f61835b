"""Job traces and node lists, read by their mapping (`mapping.py`, docs/simulation.md).

A trace gives, per job, what it recorded: always an id, a submission time, a run time and a GPU
count; some traces more (a share of a GPU, the GPU models a job may run on, CPU and memory). The
mapping file says which columns hold which field; the built-in formats (`formats/*.yaml`: `itp`,
`helios`, `philly`, `pai`, `openb`) are mapping files too, read by this one reader. What a trace
does not record comes from the seeded generator (`generator.py`), and the report says which fields
were real and which generated.

Rows without a positive run time, with no GPU or with a value that does not parse (an empty
`scheduled_time` of a pod never scheduled) are skipped and counted (`TraceStats.skipped`).

A node list (`read_nodes`) is read by the mapping's `nodes:` section: one row a node, grouped into
clusters by a column or by rules (`world.world_from_nodes` builds the world from it).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .mapping import Column, MappingError, NodesFormat, TraceFormat, load_mapping


@dataclass(frozen=True)
class TraceJob:
    """One job as the trace recorded it. Fields the trace does not record are None."""

    job_id: str
    submit: float  # seconds since the trace's start
    duration: float  # run time in seconds, as recorded
    gpus: int  # GPUs requested (a fractional job: 1)
    origin: str = ""  # file (or cluster) the job came from
    share: float | None = None  # share of each GPU, < 1 for a fractional job (None: not recorded)
    accelerators: tuple[str, ...] | None = None  # GPU products it may run on (() : any; None: not recorded)
    cpu: float | None = None  # cores
    memory: float | None = None  # bytes

    @property
    def fractional(self) -> bool:
        return self.share is not None and self.share < 1.0 and self.gpus == 1


@dataclass
class TraceStats:
    rows: int = 0
    skipped: int = 0
    files: list[str] = field(default_factory=list)


def _seconds(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return datetime.fromisoformat(value.strip()).timestamp()


def _number(row: dict[str, str], c: Column) -> float:
    return float(row[c.column]) / c.scale * c.factor


def _time(row: dict[str, str], c: Column) -> float:
    return _seconds(row[c.column]) / c.scale * c.factor


def trace_files(path: Path, pattern: str = "*.csv") -> list[Path]:
    """A CSV file, or every file of a folder matching the mapping's `files` (sorted: ITP's cluster01..cluster10)."""
    if path.is_dir():
        files = sorted(path.glob(pattern))
        if not files:
            raise ValueError(f"{path}: no {pattern} files")
        return files
    if not path.exists():
        raise ValueError(f"{path}: no such trace file or folder")
    return [path]


def columns(fmt: TraceFormat) -> list[str]:
    """Every column the mapping reads from a job row."""
    out: list[str] = []
    for c in fmt.fields.values():
        out += [c.column] + ([c.start] if c.start else [])
    return list(dict.fromkeys(out))


def parse_rows(rows: Iterable[dict[str, str]], fmt: TraceFormat, origin: str, stats: TraceStats) -> Iterator[TraceJob]:
    f = fmt.fields
    sub, dur, gp = f["submit"], f["duration"], f["gpus"]
    share_c, acc_c, cpu_c, mem_c = f.get("gpu_share"), f.get("accelerators"), f.get("cpu"), f.get("memory")
    for row in rows:
        stats.rows += 1
        try:
            submit = _time(row, sub)
            if dur.start is not None:
                duration = _time(row, dur) - _time(row, Column(dur.start, dur.scale, dur.factor))
            elif dur.end_minus_submit:
                duration = _time(row, dur) - submit
            else:
                duration = _number(row, dur)
            gpus = math.ceil(_number(row, gp) - 1e-9)
            job_id = row[f["id"].column]
            share = min(1.0, _number(row, share_c)) if share_c is not None else None
            accels: tuple[str, ...] | None = None
            if acc_c is not None:
                accels = tuple(dict.fromkeys(fmt.product(a.strip()) for a in row[acc_c.column].split(acc_c.separator) if a.strip()))
            cpu = _number(row, cpu_c) if cpu_c is not None else None
            memory = _number(row, mem_c) if mem_c is not None else None
        except (KeyError, ValueError, TypeError):
            stats.skipped += 1
            continue
        if not (duration > 0 and gpus >= 1 and math.isfinite(submit)) or (share is not None and not share > 0):
            stats.skipped += 1
            continue
        yield TraceJob(job_id=job_id, submit=submit, duration=duration, gpus=gpus, origin=origin, share=share,
                       accelerators=accels, cpu=cpu, memory=memory)


def resolve(fmt: TraceFormat | str | Path) -> TraceFormat:
    return fmt if isinstance(fmt, TraceFormat) else load_mapping(fmt)


def read_trace(path: Path, fmt: TraceFormat | str | Path = "itp", *, limit: int | None = None) -> tuple[list[TraceJob], TraceStats]:
    """Read a trace (a file or a folder of files on one clock), merged into one arrival stream.

    Sorted by submission time, then origin and id, and shifted so the first job arrives at 0.
    `limit` keeps the first `limit` rows of *each file* (tests read a slice of the real files).
    """
    f = resolve(fmt)
    stats = TraceStats()
    jobs: list[TraceJob] = []
    for file in trace_files(path, f.files):
        stats.files.append(str(file))
        with file.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in columns(f) if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"{file}: not a {f.name} trace: missing column(s) {', '.join(missing)}")
            for i, job in enumerate(parse_rows(reader, f, file.stem, stats)):
                if limit is not None and i >= limit:
                    break
                jobs.append(job)
    jobs.sort(key=lambda j: (j.submit, j.origin, j.job_id))
    if jobs:
        t0 = jobs[0].submit
        if t0 != 0:
            jobs = [TraceJob(j.job_id, j.submit - t0, j.duration, j.gpus, j.origin, j.share, j.accelerators, j.cpu, j.memory)
                    for j in jobs]
    return jobs, stats


@dataclass(frozen=True)
class NodeRow:
    """One node of a node list, with the cluster its rule put it in."""

    cluster: str
    name: str
    gpus: int  # devices it offers (GPUs x replicas where shared)
    product: str
    memory_mib: int  # GPU memory per GPU (the mapping's `models`; 0: unknown)
    cpu: float | None  # cores
    memory: float | None  # bytes
    pool: str | None
    sharing: tuple[str, ...]


def _cluster_of(row: dict[str, str], nf: NodesFormat, where: str) -> tuple[str | None, tuple[str, ...], int]:
    if nf.by_column is not None:
        return (nf.prefix + row[nf.by_column]).lower(), (), 1
    for k, rule in enumerate(nf.rules):
        if all(p.fullmatch(row.get(col, "")) for col, p in rule.where):
            if rule.cluster is None:
                return None, (), 1
            try:
                name = rule.cluster.format_map(row)
            except (KeyError, ValueError, IndexError) as exc:
                raise MappingError(f"{where}: nodes.cluster.rules[{k}].cluster: {rule.cluster!r}: "
                                   f"names a column the node list does not have ({exc})") from exc
            return name.lower(), rule.sharing, rule.replicas
    raise MappingError(f"{where}: node {row.get(nf.name)!r} matches no rule of nodes.cluster.rules "
                       "(end the rules with one without `where`, or cluster: null to leave nodes out)")


def read_nodes(path: Path, fmt: TraceFormat | str | Path) -> list[NodeRow]:
    """A node list by the mapping's `nodes:` section, each node in its cluster (in file order)."""
    f = resolve(fmt)
    nf = f.nodes
    if nf is None:
        raise MappingError(f"{f.source or f.name}: nodes: missing: this mapping does not describe a node list")
    out: list[NodeRow] = []
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        need = [nf.name, nf.gpus.column, nf.model, *(c.column for c in (nf.cpu, nf.memory) if c), *([nf.pool] if nf.pool else []),
                *([nf.by_column] if nf.by_column else []), *(col for r in nf.rules for col, _ in r.where)]
        missing = [c for c in dict.fromkeys(need) if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a {f.name} node list: missing column(s) {', '.join(missing)}")
        for line, row in enumerate(reader, 2):
            cluster, sharing, replicas = _cluster_of(row, nf, f.source or f.name)
            if cluster is None:
                continue
            try:
                gpus = int(_number(row, nf.gpus))
                cpu = _number(row, nf.cpu) if nf.cpu else None
                memory = _number(row, nf.memory) if nf.memory else None
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: {exc}") from exc
            model = row[nf.model].strip()
            m = f.models.get(model)
            out.append(NodeRow(cluster=cluster, name=row[nf.name], gpus=gpus * replicas if sharing else gpus,
                               product=m.product if m else ("" if model in ("", "nan") else model),
                               memory_mib=m.memory_mib if m else 0, cpu=cpu, memory=memory,
                               pool=row[nf.pool] if nf.pool else None, sharing=sharing))
    if not out:
        raise ValueError(f"{path}: no nodes (every row left out by the rules?)")
    return out
