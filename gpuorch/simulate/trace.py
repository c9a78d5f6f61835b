"""Job traces: the ITP CSV schema, and a documented column mapping for other public GPU traces.

A trace gives, per job, only what it recorded: an id, a submission time, a run time and a GPU count
(the ITP trace: `job_id,submission_time,duration,num_gpu`, seconds on one clock for all ten files).
Everything else a workload needs comes from the seeded generator (`generator.py`), and the report
says which fields were real and which generated.

Other traces map onto the same four fields with a `TraceFormat` (see docs/simulation.md):

| preset | file | id | submitted | run time | GPUs |
|---|---|---|---|---|---|
| `itp` | ElasticFlow ITP `clusterNN.csv` | `job_id` | `submission_time` (s) | `duration` (s) | `num_gpu` |
| `helios` | Helios (SenseTime) `cluster_log.csv` | `job_id` | `submit_time` (ISO date or s) | `duration` (s) | `gpu_num` |
| `philly` | Philly, flattened to CSV (`jobid,submitted_time,run_time,num_gpus`) | `jobid` | `submitted_time` (ISO date or s) | `run_time` (s) | `num_gpus` |
| `pai` | Alibaba PAI 2020 `pai_task_table.csv` (with header) | `job_name` | `start_time` (s) | `end_time - start_time` | `plan_gpu / 100`, rounded up |

Rows without a positive run time or with no GPU are skipped and counted (`TraceStats.skipped`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class TraceJob:
    """One job as the trace recorded it: the only real fields."""

    job_id: str
    submit: float  # seconds since the trace's start
    duration: float  # run time in seconds, as recorded
    gpus: int  # GPUs requested
    origin: str = ""  # file (or cluster) the job came from


@dataclass(frozen=True)
class TraceFormat:
    """Which columns hold the four real fields. `end` set: run time = end - submit column."""

    name: str
    job_id: str
    submit: str
    duration: str | None
    gpus: str
    end: str | None = None
    gpu_scale: float = 1.0  # divide the GPU column by this (PAI: percent of a GPU)


PRESETS: dict[str, TraceFormat] = {
    "itp": TraceFormat("itp", "job_id", "submission_time", "duration", "num_gpu"),
    "helios": TraceFormat("helios", "job_id", "submit_time", "duration", "gpu_num"),
    "philly": TraceFormat("philly", "jobid", "submitted_time", "run_time", "num_gpus"),
    "pai": TraceFormat("pai", "job_name", "start_time", None, "plan_gpu", end="end_time", gpu_scale=100.0),
}

#: The ITP fields, as the report lists them.
REAL_FIELDS = ("job_id", "submission_time", "duration", "num_gpu")


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


def trace_files(path: Path) -> list[Path]:
    """A CSV file, or every `*.csv` in a folder (sorted: ITP's cluster01..cluster10)."""
    if path.is_dir():
        files = sorted(path.glob("*.csv"))
        if not files:
            raise ValueError(f"{path}: no *.csv files")
        return files
    return [path]


def parse_rows(rows: Iterable[dict[str, str]], fmt: TraceFormat, origin: str, stats: TraceStats) -> Iterator[TraceJob]:
    for row in rows:
        stats.rows += 1
        try:
            submit = _seconds(row[fmt.submit])
            if fmt.end is not None:
                duration = _seconds(row[fmt.end]) - submit
            else:
                assert fmt.duration is not None
                duration = float(row[fmt.duration])
            gpus = math.ceil(float(row[fmt.gpus]) / fmt.gpu_scale - 1e-9)
            job_id = row[fmt.job_id]
        except (KeyError, ValueError, TypeError):
            stats.skipped += 1
            continue
        if not (duration > 0 and gpus >= 1 and math.isfinite(submit)):
            stats.skipped += 1
            continue
        yield TraceJob(job_id=job_id, submit=submit, duration=duration, gpus=gpus, origin=origin)


def read_trace(path: Path, fmt: TraceFormat | str = "itp", *, limit: int | None = None) -> tuple[list[TraceJob], TraceStats]:
    """Read a trace (a file or a folder of files on one clock), merged into one arrival stream.

    Sorted by submission time, then origin and id, and shifted so the first job arrives at 0.
    `limit` keeps the first `limit` rows of *each file* (tests read a slice of the real files).
    """
    f = PRESETS[fmt] if isinstance(fmt, str) else fmt
    stats = TraceStats()
    jobs: list[TraceJob] = []
    for file in trace_files(path):
        stats.files.append(str(file))
        with file.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in (f.job_id, f.submit, f.duration or f.end, f.gpus) if c and c not in (reader.fieldnames or [])]
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
            jobs = [TraceJob(j.job_id, j.submit - t0, j.duration, j.gpus, j.origin) for j in jobs]
    return jobs, stats
