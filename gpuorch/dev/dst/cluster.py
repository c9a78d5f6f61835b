"""A simulated Kubernetes cluster (pure, virtual time): nodes as GPU Feature Discovery labels them,
Jobs and their pods, the scheduler, and faults.

Pods are placed by the emitted Job's own constraints (its pod template: ``nodeSelector``, required
node affinity, tolerations, resource requests), through the local clusters' scheduler filter
(``gpuorch_localkube.scheduler._filter``), never by the router's view. A bound pod starts after a
startup delay and runs for its duration (the workload's ``SIM_SECONDS``), then succeeds or
fails with the exit code the simulation drew for that attempt.

Faults: a *partition* makes every API call fail while pods keep running; a *slow API* makes calls
take `latency` virtual seconds (more than the client timeout is a failed call); *node loss* fails
the node's pods (``NodeLost``) and removes the node; *capacity changes* add or remove nodes.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from gpuorch_dispatcher.core import JobObservation
from gpuorch_localkube.objects import pod_requests
from gpuorch_localkube.quantity import parse_quantity
from gpuorch_localkube.scheduler import NodeInfo as KNode
from gpuorch_localkube.scheduler import _filter, unschedulable_message
from gpuorch_proto import k8s

API_TIMEOUT = 5.0  # the clients' read timeout (gpuorch.kube.READ_TIMEOUT)


class Unreachable(Exception):
    """The cluster did not answer (partition, or a call slower than the timeout)."""


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class SimNode:
    name: str
    labels: dict[str, str]
    gpus: int
    cpu: str = "64"
    memory: str = "512Gi"
    taints: list[dict[str, Any]] = field(default_factory=list)
    ready: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "metadata": {"name": self.name, "labels": dict(self.labels)},
            "spec": {"taints": list(self.taints)} if self.taints else {},
            "status": {
                "allocatable": {k8s.GPU_RESOURCE: str(self.gpus), "cpu": self.cpu, "memory": self.memory, "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True" if self.ready else "False"}],
            },
        }


@dataclass
class SimPod:
    name: str
    job: str
    obj: dict[str, Any]  # the pod as the API returns it (metadata, spec, status)
    created: float
    node: str | None = None
    phase: str = "Pending"
    deleting_at: float | None = None  # gone at this time
    exit_code: int | None = None
    unschedulable: str = ""
    started: float | None = None


@dataclass
class SimJob:
    name: str
    manifest: dict[str, Any]
    created: float
    duration: float
    exit_code: int
    pods: list[SimPod] = field(default_factory=list)
    deleting: bool = False
    failed_reason: str = ""
    version: int = 0  # the cluster's version its create made (its resourceVersion)

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.manifest["metadata"].get("labels") or {})

    @property
    def complete(self) -> bool:
        return bool(self.pods) and all(p.phase == "Succeeded" for p in self.pods)

    @property
    def failed(self) -> bool:
        return any(p.phase == "Failed" for p in self.pods)


@dataclass
class SimCluster:
    name: str
    nodes: dict[str, SimNode]
    startup: float = 1.0
    jobs: dict[str, SimJob] = field(default_factory=dict)
    partitioned: bool = False
    latency: float = 0.0
    version: int = 0  # bumped on every change inventory could see
    _timers: list[tuple[float, int, str, str]] = field(default_factory=list)  # (t, n, kind, pod/job)
    _n: int = 0
    _dirty: bool = False  # pending pods to schedule
    _uid: int = 0
    checkpoints: dict[str, str] = field(default_factory=dict)  # attempt -> its latest checkpoint (shared store)

    # --- API (each call may fail) --------------------------------------------------------
    def call(self) -> None:
        if self.partitioned or self.latency > API_TIMEOUT:
            raise Unreachable(f"{self.name}: {'partitioned' if self.partitioned else 'timed out'}")

    def create_job(self, manifest: dict[str, Any], now: float, duration: float, exit_code: int) -> bool:
        """False: it already existed (409)."""
        self.call()
        name = manifest["metadata"]["name"]
        if name in self.jobs:
            return False
        job = SimJob(name, manifest, now, duration, exit_code)
        spec = manifest["spec"]
        tmpl = spec["template"]
        for i in range(int(spec.get("parallelism") or 1)):
            self._uid += 1
            labels = dict(tmpl["metadata"].get("labels") or {})
            labels["job-name"] = name
            obj = {
                "metadata": {
                    "name": f"{name}-{i}", "namespace": k8s.NAMESPACE, "uid": f"{self.name}-{self._uid}",
                    "labels": labels, "annotations": dict(tmpl["metadata"].get("annotations") or {}),
                    "creationTimestamp": rfc3339(now),
                    "ownerReferences": [{"kind": "Job", "uid": f"{self.name}-job-{name}", "controller": True}],
                },
                "spec": tmpl["spec"],
                "status": {"phase": "Pending"},
            }
            job.pods.append(SimPod(f"{name}-{i}", name, obj, now))
        self.jobs[name] = job
        self._dirty = True
        self.version += 1
        job.version = self.version
        return True

    def delete_job(self, name: str, now: float, grace: float = 1.0) -> bool:
        """Delete (foreground): pods terminate within `grace`, then the Job goes. False: 404."""
        self.call()
        job = self.jobs.get(name)
        if job is None:
            return False
        if not job.deleting:
            job.deleting = True
            for p in job.pods:
                if p.deleting_at is None:
                    p.deleting_at = now + (grace if p.node is not None and p.phase == "Running" else 0.0)
                    p.obj["metadata"]["deletionTimestamp"] = rfc3339(now)
                    self._at(p.deleting_at, "gone", p.name)
            self.version += 1
        return True

    def pods_of(self, job: str) -> list[SimPod]:
        self.call()
        j = self.jobs.get(job)
        return list(j.pods) if j else []

    def read_job(self, name: str) -> SimJob | None:
        self.call()
        return self.jobs.get(name)

    def list_jobs(self) -> dict[str, SimJob]:
        self.call()
        return dict(self.jobs)

    def cached_jobs(self, now: float, lag: float) -> tuple[dict[str, SimJob], int, float]:
        """A dispatcher's informer cache of the Jobs, whose watch delivers a create `lag` seconds
        late: (the Jobs it holds, its resourceVersion, the time it was complete up to). The Jobs
        created in the last `lag` seconds are not in it yet and its resourceVersion is older than
        theirs; everything else is as the cluster has it."""
        self.call()
        since = now - lag
        seen = {n: j for n, j in self.jobs.items() if j.created <= since}
        unseen = [j.version for j in self.jobs.values() if j.created > since]
        return seen, (min(unseen) - 1 if unseen else self.version), since

    def list_nodes_pods(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        self.call()
        nodes = [n.as_dict() for n in self.nodes.values()]
        pods = [p.obj for j in self.jobs.values() for p in j.pods]
        return nodes, pods

    def observe(self, job: SimJob) -> JobObservation:
        """What the dispatcher's shell reads from a Job and its pods (``service.observe``)."""
        workers = int(job.manifest["spec"].get("parallelism") or 1)
        scheduled = sum(1 for p in job.pods if p.node)
        running = sum(1 for p in job.pods if p.phase in ("Running", "Succeeded"))
        codes = [p.exit_code for p in job.pods if p.exit_code]
        failed = job.failed
        reason = ""
        if failed:
            reason = job.failed_reason or "BackoffLimitExceeded: Job has reached the specified backoff limit"
            if codes:
                reason += f" (exit code {codes[-1]})"
        unsched = next((p.unschedulable for p in job.pods if not p.node and p.unschedulable), "")
        return JobObservation(
            exists=True, workers=workers, scheduled=scheduled, running=running, complete=job.complete and not failed,
            failed=failed, exit_code=codes[-1] if codes else None, reason=reason, unschedulable=unsched,
        )

    # --- faults ------------------------------------------------------------------------------
    def lose_node(self, name: str, now: float) -> list[str]:
        node = self.nodes.pop(name, None)
        if node is None:
            return []
        hit = []
        for j in self.jobs.values():
            for p in j.pods:
                if p.node == name and p.phase not in ("Succeeded", "Failed"):
                    self._finish(p, j, "Failed", None, now)
                    j.failed_reason = f"NodeLost: node {name} was lost"
                    hit.append(p.name)
        self.version += 1
        self._dirty = True
        return hit

    def add_node(self, node: SimNode) -> None:
        self.nodes[node.name] = node
        self.version += 1
        self._dirty = True

    # --- time --------------------------------------------------------------------------------
    def _at(self, t: float, kind: str, ref: str) -> None:
        self._n += 1
        heapq.heappush(self._timers, (t, self._n, kind, ref))

    def next_time(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def advance(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            t, _, kind, ref = heapq.heappop(self._timers)
            self._fire(t, kind, ref)
        if self._dirty:
            self._dirty = False
            self._schedule(now)

    def _pod(self, name: str) -> tuple[SimJob, SimPod] | None:
        job = self.jobs.get(name.rsplit("-", 1)[0])
        if job is None:
            return None
        for p in job.pods:
            if p.name == name:
                return job, p
        return None

    def _fire(self, t: float, kind: str, ref: str) -> None:
        found = self._pod(ref)
        if found is None:
            return
        job, p = found
        if kind == "gone":  # the pod object is removed; the last one takes its deleted Job along
            self._checkpoint(p, t)
            job.pods.remove(p)
            if job.deleting and not job.pods:
                del self.jobs[job.name]
            self.version += 1
            self._dirty = True
        elif kind == "start" and p.phase == "Pending" and p.node is not None and p.deleting_at is None:
            p.phase = "Running"
            p.started = t
            p.obj["status"] = {"phase": "Running", "startTime": rfc3339(t)}
            self._at(t + job.duration, "end", p.name)
            self.version += 1
        elif kind == "end" and p.phase == "Running" and p.deleting_at is None:
            self._finish(p, job, "Succeeded" if job.exit_code == 0 else "Failed", job.exit_code, t)

    def _checkpoint(self, p: SimPod, t: float) -> None:
        """A pod that ran for a second or more left a checkpoint (the trainer writes one every few steps)."""
        if p.started is None or t - p.started < 1.0:
            return
        att = p.obj["metadata"]["labels"].get(k8s.LABEL_ATTEMPT)
        env = {e["name"]: e.get("value") for e in p.obj["spec"]["containers"][0].get("env") or []}
        if att and env.get("GPUORCH_CHECKPOINT_URL"):  # what the pod's agent uploaded
            self.checkpoints[att] = f"{env['GPUORCH_CHECKPOINT_URL']}/ckpt"

    def _finish(self, p: SimPod, job: SimJob, phase: str, code: int | None, t: float) -> None:
        if p.phase == "Running":
            self._checkpoint(p, t)
        p.phase = phase
        p.exit_code = code
        st: dict[str, Any] = {"phase": phase, "startTime": p.obj["status"].get("startTime")}
        if code is not None:
            st["containerStatuses"] = [{"name": "main", "state": {"terminated": {"exitCode": code}}}]
        p.obj["status"] = st
        self.version += 1
        self._dirty = True

    def _knodes(self) -> dict[str, KNode]:
        out: dict[str, KNode] = {}
        for n in self.nodes.values():
            if not n.ready:
                continue
            alloc = {k8s.GPU_RESOURCE: Fraction(n.gpus), "cpu": parse_quantity(n.cpu), "memory": parse_quantity(n.memory), "pods": Fraction(110)}
            out[n.name] = KNode(n.name, n.labels, n.taints, False, alloc)
        for j in self.jobs.values():
            for p in j.pods:
                if p.node in out and p.phase not in ("Succeeded", "Failed"):
                    out[p.node].add(pod_requests(p.obj))
        return out

    def _schedule(self, now: float) -> None:
        """Bind pending pods (gangs all together or none), in creation order."""
        pending = [j for j in self.jobs.values() if not j.deleting and any(p.node is None and p.phase == "Pending" for p in j.pods)]
        if not pending:
            return
        nodes = self._knodes()
        for job in sorted(pending, key=lambda j: (j.created, j.name)):
            todo = [p for p in job.pods if p.node is None and p.phase == "Pending"]
            gang = (job.manifest["spec"]["template"]["metadata"].get("annotations") or {}).get(k8s.ANN_GANG) == "true"
            trial = {k: v.copy() for k, v in nodes.items()} if gang else nodes
            placed: list[tuple[SimPod, str]] = []
            for p in todo:
                req = pod_requests(p.obj)
                reasons: Counter[str] = Counter()
                best: KNode | None = None
                for n in trial.values():
                    why = _filter(p.obj, req, n)
                    if why:
                        reasons.update(why)
                    elif best is None or n.free(k8s.GPU_RESOURCE) < best.free(k8s.GPU_RESOURCE):
                        best = n
                if best is None:
                    msg = unschedulable_message(len(trial), reasons)
                    if p.unschedulable != msg:
                        p.unschedulable = msg
                        self.version += 1
                    if gang:
                        placed = []
                        break
                    continue
                best.add(req)
                placed.append((p, best.name))
            if gang and len(placed) < len(todo):
                continue
            if gang:
                nodes = trial
            for p, node in placed:
                p.node = node
                p.unschedulable = ""
                p.obj["spec"] = {**p.obj["spec"], "nodeName": node}
                self._at(now + self.startup, "start", p.name)
                self.version += 1
