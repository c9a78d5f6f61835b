""""Useful compute started": an attempt-scoped marker the running program writes.

The program (e.g. `gpuorch.workloads.train`) calls `write_marker` once, right after its first
useful step. The marker lies next to its output directory in the pod (`$GPUORCH_OUTPUT_DIR` is
`/gpuorch/out`, the marker `/gpuorch/.out.progress.json`), so the outputs hold only outputs;
gpuorch's agent uploads it to the attempt's prefix (`.gpuorch/started.json`,
`gpuorch_proto.storage.MARKER`). The dispatcher, which watches the attempt anyway, reads that
object (one GET per look, `next_look`) and decides with `compute_started`
and publishes one `compute-started` event: the program publishes nothing itself and needs no
NATS credentials. The marker is small JSON: ``{"attempt_id", "started_at", "step"}``, where
`started_at` is the program's wall clock at that first step.

The same channel carries the program's **useful work** (docs/activity.md): the program keeps a
progress file next to the marker (`work_path`: ``/gpuorch/.out.work.json``;
`gpuorch.workloads.meter.write_work`, at
most every `WORK_EVERY` seconds and at its end) with the steps and samples this attempt did, its
compute and input-wait seconds (its own clock) and the times of its first and last step. The
agent uploads every new version to ``.gpuorch/progress.json`` (`gpuorch_proto.storage.PROGRESS`);
`gpuorch explain` and `gpuorch report` read it from there (`parse_work`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gpuorch_proto import events as ev

KIND = "compute-started"
#: the longest a program's progress file goes unwritten while it steps (real seconds)
WORK_EVERY = 0.5
#: the fields of a progress document (`write_work`), each a number but `attempt_id`, `device`, `done`
WORK_FIELDS = (
    "attempt_id", "step", "steps", "samples", "compute_seconds", "input_wait_seconds",
    "first_step_at", "last_step_at", "updated_at", "device", "done",
)  # fmt: skip

#: the longest a running attempt without its marker waits between two looks for it (seconds)
LOOK_MAX = 10.0
#: the wait between looks as a share of how long the attempt has been running
LOOK_SHARE = 0.25


def marker_path(output_dir: str | os.PathLike[str]) -> Path:
    out = Path(output_dir)
    return out.parent / f".{out.name}.progress.json"


def write_marker(output_dir: str | os.PathLike[str], *, attempt_id: str | None, step: int, at: float | None = None) -> Path:
    """Write the marker atomically (rename), once; later calls leave the first one."""
    path = marker_path(output_dir)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    doc = {"attempt_id": attempt_id, "started_at": time.time() if at is None else at, "step": int(step)}
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)
    return path


def work_path(output_dir: str | os.PathLike[str]) -> Path:
    """The program's progress (useful work) file: next to its output directory, like the marker."""
    out = Path(output_dir)
    return out.parent / f".{out.name}.work.json"


def parse_work(data: bytes | None) -> dict[str, Any] | None:
    """A progress document (steps, samples, compute and input-wait seconds, first and last step
    times), or None when there is none or it is not one."""
    if not data:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    numbers = ("steps", "samples", "compute_seconds", "input_wait_seconds")
    if not all(isinstance(doc.get(k), (int, float)) and not isinstance(doc.get(k), bool) for k in numbers):
        return None
    return doc


def parse_marker(data: bytes | None) -> dict[str, Any] | None:
    """A marker's document, or None when there is none (yet) or it is not one."""
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("started_at"), (int, float)) else None


def read_marker(output_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The marker a program wrote in its pod (gpuorch's agent uploads it), or None."""
    try:
        return parse_marker(marker_path(output_dir).read_bytes())
    except OSError:
        return None


def compute_started(workload_id: str, a: Any, marker: bytes | None, now: float) -> list[ev.Base]:
    """The `compute-started` event for attempt view `a` if its program has written the marker
    (`marker`: the object gpuorch's agent uploaded to the attempt's prefix,
    `gpuorch_proto.storage.MARKER`) and the event is not on record yet (a deterministic id: a
    repeat is dropped by JetStream)."""
    if KIND in a.times or not a.output_path:
        return []
    doc = parse_marker(marker)
    if doc is None or doc.get("attempt_id") not in (None, a.attempt_id):
        return []
    return [ev.ComputeStarted(
        event_id=f"{a.attempt_id}.{KIND}", workload_id=workload_id, at=now, attempt_id=a.attempt_id,
        epoch=a.epoch, cluster=a.cluster, started_at=float(doc["started_at"]), step=int(doc.get("step") or 0),
    )]  # fmt: skip


def next_look(running_at: float | None, now: float, tick: float) -> float:
    """When to look for a running attempt's marker again: at the next tick while it is young,
    then after a quarter of its running time so far, at most LOOK_MAX apart. The marker carries
    the program's own clock (`started_at`), so a later look publishes the same start time; an
    attempt that ends is looked at then anyway. Most programs never write one: without this, the
    watch read a file for every running attempt every tick (1,600 reads/s for 800 of them)."""
    age = max(0.0, now - running_at) if running_at is not None else 0.0
    return now + min(LOOK_MAX, max(tick, LOOK_SHARE * age))
