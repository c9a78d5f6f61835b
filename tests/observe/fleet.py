"""A synthetic fleet for the web view: thousands of workloads' events, with what each should show.

`fleet(n)` writes the events a running system would have written for `n` workloads (singles in
every state, and pipelines of five stages: prep -> train -> eval, export -> publish), seeded so it
is the same every run, and records beside them what the generator intended for each workload
(`Fleet.truth`: status, owner, queue, cluster, pipeline). Tests compare what the list shows with
that record, which the web view never reads. `snapshots(...)` makes capacity snapshots of a
cluster over time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from gpuorch_proto import Event, RoutingDecision
from gpuorch_proto import events as ev
from gpuorch_proto.inventory import ClusterSnapshot
from tests.support.builders import NOW, make_node, make_queue, make_snapshot, make_workload

OWNERS = ("alice", "bob", "carol", "dave", "erin")
QUEUES = (None, "research", "prod")
CLUSTERS = ("alpha", "beta", "gamma")
STAGES = (("prep", ()), ("train", ("prep",)), ("eval", ("train",)), ("export", ("train",)), ("publish", ("eval", "export")))
# the singles' states and how often each is drawn
PLAN = {"completed": 50, "running": 20, "failed": 10, "waiting": 10, "dispatched": 5, "cancelled": 5}


@dataclass(frozen=True)
class Truth:
    status: str
    owner: str
    queue: str | None
    cluster: str | None
    pipeline: str | None = None
    stage: str | None = None
    submitted: float = 0.0


@dataclass
class Fleet:
    events: list[tuple[int, Event]] = field(default_factory=list)
    truth: dict[str, Truth] = field(default_factory=dict)
    pipelines: dict[str, list[str]] = field(default_factory=dict)  # pipeline -> its stages' workload ids

    def add(self, e: Event) -> None:
        self.events.append((len(self.events) + 1, e))

    def run(self, wid: str, at: float, status: str, cluster: str | None) -> None:
        """The events that take a submitted workload to `status` (on `cluster`)."""
        if status == "waiting":
            d = RoutingDecision(workload_id=wid, decided_at=at, outcome="waiting", summary="no cluster has 8 GPUs free")
            self.add(ev.Unroutable(workload_id=wid, at=at + 1, decision=d))
            return
        if status == "cancelled":
            self.add(ev.CancelRequested(workload_id=wid, at=at + 1, reason="by its owner"))
            self.add(ev.Cancelled(workload_id=wid, at=at + 2, reason="by its owner"))
            return
        if status == "submitted":
            return
        assert cluster is not None
        d = RoutingDecision(workload_id=wid, decided_at=at, outcome="routed", cluster=cluster, summary=f"to {cluster}: fastest")
        self.add(ev.Routed(workload_id=wid, at=at + 1, decision=d))
        aid = f"{wid}-a1"
        a = {"workload_id": wid, "attempt_id": aid, "epoch": 1, "cluster": cluster}
        self.add(ev.AttemptCreated(**a, at=at + 2, attempt_number=1, job_name=aid, output_path=f"/o/{aid}", checkpoint_path="/c"))
        if status == "dispatched":
            return
        self.add(ev.Admitted(**a, at=at + 3))
        self.add(ev.Running(**a, at=at + 4))
        if status == "running":
            return
        if status == "failed":
            self.add(ev.Failed(**a, at=at + 9, exit_code=2, reason="exit code 2 (permanent)"))
            self.add(ev.WorkloadFailed(workload_id=wid, at=at + 10, reason="permanent exit code 2", attempts=1))
            return
        assert status == "completed", status
        self.add(ev.Succeeded(**a, at=at + 9, output_path=f"/o/{aid}"))
        self.add(ev.Promoted(**a, at=at + 10, output_path=f"/o/{aid}", result_path=f"/r/{wid}"))
        self.add(ev.Completed(workload_id=wid, at=at + 11, attempt_id=aid, result_path=f"/r/{wid}"))


def fleet(n: int = 10_000, pipelines: int = 100, seed: int = 7) -> Fleet:
    """`n` workloads in all: `pipelines` pipelines of five stages (each pipeline and each stage a
    workload), the rest single workloads; the i-th submitted at NOW + i."""
    rng = random.Random(seed)
    f = Fleet()
    singles = n - pipelines * (1 + len(STAGES))
    assert singles >= 0
    at = NOW
    kinds = ["single"] * singles + ["pipeline"] * pipelines
    rng.shuffle(kinds)
    s = p = 0
    for kind in kinds:
        at += 1.0
        owner, queue = rng.choice(OWNERS), rng.choice(QUEUES)
        if kind == "single":
            wid = f"w-{s:05d}"
            s += 1
            status = rng.choices(list(PLAN), weights=list(PLAN.values()))[0]
            cluster = None if status in ("waiting", "cancelled") else rng.choice(CLUSTERS)
            f.add(ev.Submitted(workload_id=wid, at=at, workload=make_workload(name=f"train-{s % 97}", owner=owner, policy_queue=queue)))
            f.run(wid, at, status, cluster)
            f.truth[wid] = Truth(status, owner, queue, cluster, submitted=at)
            continue
        pid = f"p-{p:03d}"
        p += 1
        f.add(ev.Submitted(workload_id=pid, at=at, workload=make_workload(name=f"pipe-{p}", owner=owner, policy_queue=queue)))
        children = [ev.PipelineChild(workload_id=f"{pid}-{name}", stage=name, depends_on=list(deps)) for name, deps in STAGES]
        f.add(ev.PipelineExpanded(workload_id=pid, at=at + 0.1, children=children))
        f.pipelines[pid] = [c.workload_id for c in children]
        done = rng.randint(0, len(STAGES))  # stages finished, in declared (topological) order
        for i, c in enumerate(children):
            cat = at + 0.2 + i * 0.01
            f.add(ev.Submitted(workload_id=c.workload_id, at=cat, workload=make_workload(name=f"{pid}-{c.stage}", owner=owner, policy_queue=queue)))
            status = "completed" if i < done else "running" if i == done else "submitted"
            cluster = rng.choice(CLUSTERS) if status != "submitted" else None
            f.run(c.workload_id, cat, status, cluster)
            f.truth[c.workload_id] = Truth(status, owner, queue, cluster, pid, c.stage, submitted=cat)
        finished = done == len(STAGES)
        if finished:
            f.add(ev.PipelineFinished(workload_id=pid, at=at + 0.9, outcome="completed", reason="every stage completed",
                                      stages={name: "completed" for name, _ in STAGES}))  # fmt: skip
        f.truth[pid] = Truth("completed" if finished else "running", owner, queue, None, submitted=at)
    assert len(f.truth) == n
    return f


def snapshots(cluster: str, count: int, *, gpus: int = 64, start: float = NOW, every: float = 2.0) -> list[ClusterSnapshot]:
    """`count` snapshots of `cluster`, `every` seconds apart: free GPUs falling then rising, a
    queue filling and draining, so the charts have a shape (the i-th: `free(i)`, `pending(i)`)."""
    out = []
    for i in range(count):
        nodes = [make_node(f"{cluster}-{k}", gpus=8, free=min(8, max(0, free(i, gpus) - 8 * k))) for k in range(gpus // 8)]
        out.append(make_snapshot(cluster, nodes=nodes, queues=[make_queue("training", pending_jobs=pending(i), pending_gpus=2 * pending(i)),
                                                              make_queue("batch", pending_jobs=pending(i) // 3)],
                                 published_at=start + i * every, observed_at=start + i * every, pending_gpus=2 * pending(i)))  # fmt: skip
    return out


def free(i: int, gpus: int = 64) -> int:
    """Free GPUs at the i-th snapshot: work arriving and finishing in waves."""
    return min(gpus, max(0, round(gpus * (0.45 + 0.4 * math.sin(i / 14) + 0.1 * math.sin(i / 3.1)))))


def pending(i: int) -> int:
    """Pending jobs of the training queue at the i-th snapshot: high while few GPUs are free."""
    return max(0, round(22 - 18 * math.sin(i / 14 - 0.4) + 3 * math.cos(i / 2.3)))
