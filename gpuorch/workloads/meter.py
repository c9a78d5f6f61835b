"""What a training loop reports about its own work (docs/activity.md): per step, the time it
waited for input and the time it computed, and the steps and samples it did.

Two reports, written atomically (rename):

- **Progress** (useful work), through gpuorch's progress channel: ``/gpuorch/.out.work.json``
  (`write_work`) at most every `WORK_EVERY` seconds and at the end;
  gpuorch's agent uploads it to the attempt's prefix. Written on every cluster.
- **Device use**, only where the cluster asks for it: a local cluster has no GPU to measure, so
  its kubelet names a file (`$GPUORCH_GPU_REPORT`) in which a program that computes on its GPUs
  says so (``busy_seconds``, ``busy_since``, ``fb_used_mib``: `gpuorch_localkube.dcgm`). On a real
  cluster the variable is absent and DCGM measures the device. A program on the CPU (`device`
  ``cpu``) writes none: its GPUs stay idle, as real ones would.

The clock is the wall clock (`time.time`): the cluster compares `busy_since` with its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpuorch.observe.progress import WORK_EVERY, WORK_FIELDS, work_path

GPU_REPORT_ENV = "GPUORCH_GPU_REPORT"


def write_work(output_dir: str | os.PathLike[str], doc: dict[str, Any]) -> Path:
    """Replace the progress file atomically (rename): the agent uploads whole documents only."""
    path = work_path(output_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({k: doc.get(k) for k in WORK_FIELDS}))
    tmp.replace(path)
    return path


class Meter:
    def __init__(
        self, output: Path, env: Mapping[str, str], *, device: str = "gpu", batch: int = 1, fb_used_mib: int = 0,
        step: int = 0, clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.output = output
        self.clock = clock
        self.device = device
        self.batch = batch
        report = env.get(GPU_REPORT_ENV) if device == "gpu" else None
        self.gpu_report = Path(report) if report else None
        self.fb_used_mib = fb_used_mib
        self.doc: dict[str, Any] = {
            "attempt_id": env.get("GPUORCH_ATTEMPT_ID"), "step": step, "steps": 0, "samples": 0,
            "compute_seconds": 0.0, "input_wait_seconds": 0.0, "first_step_at": None, "last_step_at": None,
            "updated_at": None, "device": device, "done": False,
        }  # fmt: skip
        self.busy_since: float | None = None
        self.written_at = -1e18
        self._device(fb=fb_used_mib)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """The program waits for its input (a slow reader): the device idles until it has data."""
        t0 = self.clock()
        self._begin(t0)
        self._close(t0)
        try:
            yield
        finally:
            t1 = self.clock()
            self.doc["input_wait_seconds"] += t1 - t0
            self._open(t1)

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """The program computes (on its GPUs, for device ``gpu``). From here to its next wait for
        input (or its end) its devices have work: everything in the loop that is not waiting for
        input counts as compute, so compute + input wait is the stepping time."""
        t0 = self.clock()
        self._begin(t0)
        self._open(t0)
        yield

    def step_done(self, step: int) -> None:
        now = self.clock()
        self.doc["step"] = step
        self.doc["steps"] += 1
        self.doc["samples"] += self.batch
        self.doc["last_step_at"] = now
        if now - self.written_at >= WORK_EVERY:
            self._progress(now)

    def finish(self) -> None:
        """The loop is over: the last progress, and the device released."""
        now = self.clock()
        self._close(now)
        self.doc["done"] = True
        self._progress(now)
        self._device(fb=0)

    def summary(self) -> dict[str, Any]:
        """The program's own account (its metrics.json): what the progress says, with the share of
        compute and the rate over its stepping time."""
        d = self.doc
        spent = d["compute_seconds"] + d["input_wait_seconds"]
        span = (d["last_step_at"] - d["first_step_at"]) if d["first_step_at"] is not None and d["last_step_at"] is not None else 0.0
        return {
            **{k: d[k] for k in ("steps", "samples", "compute_seconds", "input_wait_seconds", "device")},
            "activity": d["compute_seconds"] / spent if spent > 0 else None,
            "steps_per_second": d["steps"] / span if span > 0 else None,
        }

    def _begin(self, now: float) -> None:
        if self.doc["first_step_at"] is None:
            self.doc["first_step_at"] = now

    def _open(self, now: float) -> None:
        if self.busy_since is None:
            self.busy_since = now
            self._device(fb=self.fb_used_mib)

    def _close(self, now: float) -> None:
        if self.busy_since is not None:
            self.doc["compute_seconds"] += max(0.0, now - self.busy_since)
            self.busy_since = None
            self._device(fb=self.fb_used_mib)

    def _progress(self, now: float) -> None:
        self.doc["updated_at"] = now
        self.written_at = now
        doc = dict(self.doc)
        if self.busy_since is not None:  # the compute phase it is in, so far
            doc["compute_seconds"] += max(0.0, now - self.busy_since)
        write_work(self.output, doc)

    def _device(self, *, fb: int) -> None:
        if self.gpu_report is None:
            return
        busy = self.doc["compute_seconds"]
        doc = {"busy_seconds": busy, "busy_since": self.busy_since, "fb_used_mib": fb, "at": self.clock()}
        tmp = self.gpu_report.with_name(f"{self.gpu_report.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(doc))
            tmp.replace(self.gpu_report)
        except OSError:
            pass  # the device report is the local cluster's stand-in for DCGM: never fail the run over it
