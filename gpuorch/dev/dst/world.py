"""What the simulated services share: the virtual clock, the bus, the KV buckets, the clusters."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from gpuorch.invariants import Violation
from gpuorch_proto import ClusterRegistryEntry, ClusterSnapshot
from gpuorch_proto import events as ev
from gpuorch_proto.policy import AdmissionPolicy

from .bus import SimKV, SimStream
from .cluster import SimCluster

STREAM_CMD = "GPUORCH_CMD"
STREAM_EVT = "GPUORCH_EVT"
EPOCH0 = 1_750_000_000.0  # the virtual clock starts at a plausible unix time (timestamps format as usual)


@dataclass
class World:
    rng: random.Random
    clusters: dict[str, SimCluster]
    registry: dict[str, ClusterRegistryEntry]
    now: float = EPOCH0
    cmd: SimStream = field(default_factory=lambda: SimStream(STREAM_CMD, duplicate_window=3600.0))
    evt: SimStream = field(default_factory=lambda: SimStream(STREAM_EVT, duplicate_window=600.0))
    inv: SimStream = field(default_factory=lambda: SimStream("GPUORCH_INVENTORY", last_per_subject=True))
    fence: SimKV = field(default_factory=lambda: SimKV("fence"))
    owners: SimKV = field(default_factory=lambda: SimKV("owners"))
    checkpoints: dict[str, str] = field(default_factory=dict)  # attempt -> its latest checkpoint file
    #: the object store's result manifests, written create-only (manifest URL -> (attempt, epoch))
    manifests: dict[str, tuple[str, int]] = field(default_factory=dict)
    snapshots: dict[str, list[ClusterSnapshot]] = field(default_factory=dict)  # as published, per cluster
    submitted: set[str] = field(default_factory=set)  # workload ids whose `submitted` is in the log
    outcomes: dict[str, tuple[float, int]] = field(default_factory=dict)  # attempt -> (run seconds, exit code)
    trace: list[str] | None = None
    policy: AdmissionPolicy = field(default_factory=AdmissionPolicy)  # what the router admits by
    cache_lag: float = 0.0  # seconds the dispatchers' Job caches (informers) lag behind a create
    #: what the services did against the world's ground truth (judged where it happens: `absent-means-gone`)
    violations: list[Violation] = field(default_factory=list)
    loop_errors: list[str] = field(default_factory=list)  # exceptions that ended a service loop
    spawned: list[Any] = field(default_factory=list)  # tasks started since the scheduler last looked

    def log(self, who: str, what: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now - EPOCH0:9.3f} {who}: {what}")

    def publish(self, e: ev.Base, by: str) -> bool:
        """Publish one event (a command goes to the command stream); False: a duplicate id."""
        stream = self.cmd if isinstance(e, ev.Submit | ev.Cancel) else self.evt
        msg_id = e.event_id or (e.idempotency_key if isinstance(e, ev.Submit) else "") or ""
        seq, dup = stream.publish(e, self.now, msg_id)
        if not dup and isinstance(e, ev.Submitted):
            self.submitted.add(e.workload_id)
        if self.trace is not None:
            self.log(by, f"publish {ev.type_tag(e)} {msg_id or '-'}" + (" (duplicate, dropped)" if dup else f" -> {stream.name}#{seq}"))
        return not dup

    def publish_snapshot(self, snap: ClusterSnapshot, by: str) -> None:
        seq, _ = self.inv.publish(snap, self.now, subject_key=snap.cluster)
        self.snapshots.setdefault(snap.cluster, []).append(snap)
        self.log(by, f"snapshot {snap.cluster} reachable={snap.reachable} -> #{seq}")

    def outcome(self, attempt_id: str, manifest: dict[str, Any]) -> tuple[float, int]:
        """How an attempt's pods will run (seconds, exit code): drawn once, when its Job is first created."""
        got = self.outcomes.get(attempt_id)
        if got is None:
            env = {e["name"]: e["value"] for e in manifest["spec"]["template"]["spec"]["containers"][0]["env"]}
            seconds = float(env.get("SIM_SECONDS", "5"))
            fail_p = float(env.get("SIM_FAIL", "0"))
            r = self.rng.random()
            code = 0 if r >= fail_p else (2 if r < fail_p * 0.2 else 1)
            got = self.outcomes[attempt_id] = (seconds * self.rng.uniform(0.7, 1.3), code)
        return got
