"""The Job controller, the garbage collector and the pod GC of a local cluster."""

from __future__ import annotations

import functools
import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuorch_proto.kubesem import TERMINAL_POD_PHASES, job_finished

from .errors import ApiError
from .objects import GANG_ANNOTATION, get_condition, set_condition
from .util import json_copy, random_suffix, rfc3339

if TYPE_CHECKING:
    from .api import ClusterAPI
    from .store import Event

__all__ = ["JobController", "PodGC", "mark_node_lost"]

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
#: Names tried for a pod (`<job>-<5 random characters>`, as the API server's generateName) before
#: the create's conflict is let through: 1,000 pods of one Job collide about once in 30 Jobs.
NAME_ATTEMPTS = 5


def _status_only(prev: dict[str, Any], new: dict[str, Any]) -> bool:
    """Only `status` (and the resourceVersion) differ between two versions of an object."""
    if prev.keys() != new.keys() or any(prev[k] != new[k] for k in prev if k not in ("status", "metadata")):
        return False
    pm, nm = prev["metadata"], new["metadata"]
    return pm.keys() == nm.keys() and all(pm[k] == nm[k] for k in pm if k != "resourceVersion")


def _matters_to_job(prev: dict[str, Any], new: dict[str, Any]) -> bool:
    """Did a pod change in a way its Job's status or decisions depend on?"""
    ps, ns = prev.get("status") or {}, new.get("status") or {}
    return (
        ps.get("phase") != ns.get("phase")
        or prev["metadata"].get("deletionTimestamp") != new["metadata"].get("deletionTimestamp")
        or prev["metadata"].get("ownerReferences") != new["metadata"].get("ownerReferences")
        or ps.get("containerStatuses") != ns.get("containerStatuses")
        or ps.get("initContainerStatuses") != ns.get("initContainerStatuses")
        or _ready(ps) != _ready(ns)
    )


def _ready(status: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def _controller_uid(pod: dict[str, Any]) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "Job":
            return str(ref.get("uid"))
    return None


def _index(pod: dict[str, Any]) -> int | None:
    v = (pod["metadata"].get("annotations") or {}).get(INDEX_KEY)
    return int(v) if v is not None and v.isdigit() else None


def _compress(indexes: set[int]) -> str:
    """`0-2,5`: the completedIndexes format."""
    spans: list[list[int]] = []
    for i in sorted(indexes):
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


@dataclass
class JobTrack:
    counted: set[str] = field(default_factory=set)
    expected_deletions: set[str] = field(default_factory=set)
    known: set[str] = field(default_factory=set)
    succeeded_indexes: set[int] = field(default_factory=set)
    start_mono: float | None = None
    finish_mono: float | None = None


class JobController:
    """Reconciles the Jobs that store events marked dirty (a Job or one of its pods changed), and
    those whose deadline (activeDeadlineSeconds, ttlSecondsAfterFinished) is due: a work queue,
    as kube-controller-manager's Job controller keeps, so a pass costs what changed."""

    BATCH = 32  # Jobs per pass: the store lock is released between passes, so requests get in

    def __init__(self, core: ClusterAPI):
        self.core = core
        self.track: dict[str, JobTrack] = {}
        self.dirty: dict[str, None] = {}  # ordered set of Job uids
        self._timers: list[tuple[float, str]] = []  # (monotonic due time, Job uid)
        self._due: dict[str, float] = {}
        self._creating = False

    def observe(self, event: Event) -> None:
        if event.resource == "jobs":
            prev = event.prev
            if prev is not None and event.type == "MODIFIED" and _status_only(prev, event.obj):
                return  # this controller's own status write (users cannot write a Job's status)
            self.dirty[event.obj["metadata"]["uid"]] = None
        elif event.resource == "pods":
            if event.type == "ADDED" and self._creating:
                return
            if event.type == "MODIFIED" and event.prev is not None and not _matters_to_job(event.prev, event.obj):
                return  # e.g. the scheduler's PodScheduled condition: nothing a Job counts
            for o in (event.obj, event.prev):
                owner = _controller_uid(o) if o is not None else None
                if owner:
                    self.dirty[owner] = None

    def resync(self) -> None:
        for j in self.core.store.values("jobs"):
            self.dirty[j["metadata"]["uid"]] = None

    def _after(self, uid: str, seconds: float) -> None:
        """Look at the Job again in `seconds` (its deadline or TTL)."""
        due = time.monotonic() + max(0.0, seconds)
        known = self._due.get(uid)
        if known is not None and known <= due + 0.01:
            return
        self._due[uid] = due
        heapq.heappush(self._timers, (due, uid))

    def sync(self) -> bool:
        """One batch; True when more work is queued."""
        store = self.core.store
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, due_uid = heapq.heappop(self._timers)
            if self._due.get(due_uid, now + 1) <= now:
                del self._due[due_uid]
            self.dirty[due_uid] = None
        batch = list(itertools.islice(self.dirty, self.BATCH))
        for uid in batch:
            del self.dirty[uid]
        for uid in batch:
            job = store.by_uid("jobs", uid)
            if job is None:
                self.track.pop(uid, None)
                continue
            self._sync_job(job, store.pods_of_owner(uid))
        return bool(self.dirty)

    def _delete_pod(self, tr: JobTrack, pod: dict[str, Any]) -> None:
        tr.expected_deletions.add(pod["metadata"]["uid"])
        if not pod["metadata"].get("deletionTimestamp"):
            self.core.delete_pod_internal(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _sync_job(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        core = self.core
        meta, spec = job["metadata"], job["spec"]
        uid, ns, name = meta["uid"], meta["namespace"], meta["name"]
        tr = self.track.setdefault(uid, JobTrack())
        now = time.monotonic()
        if meta.get("deletionTimestamp"):  # foreground deletion: dependents first
            for p in pods:
                self._delete_pod(tr, p)
            if not pods:
                core.store.delete("jobs", ns, name)
            return
        st = job.get("status") or {}
        indexed = spec.get("completionMode") == "Indexed"
        new_succ = new_fail = 0
        current = {p["metadata"]["uid"] for p in pods}
        for p in pods:
            puid = p["metadata"]["uid"]
            phase = (p.get("status") or {}).get("phase", "Pending")
            if phase in TERMINAL_POD_PHASES:
                if puid in tr.counted:
                    continue
                tr.counted.add(puid)
                if phase == "Succeeded":
                    idx = _index(p)
                    if indexed and idx is not None:
                        tr.succeeded_indexes.add(idx)
                    new_succ += 1
                elif puid not in tr.expected_deletions:
                    new_fail += 1
            else:
                tr.known.add(puid)
        for puid in tr.known - current - tr.counted:  # vanished before it was seen terminal
            tr.counted.add(puid)
            if puid not in tr.expected_deletions:
                new_fail += 1
        tr.known &= current
        succeeded = len(tr.succeeded_indexes) if indexed else int(st.get("succeeded") or 0) + new_succ
        failed = int(st.get("failed") or 0) + new_fail
        active = [p for p in pods if (p.get("status") or {}).get("phase", "Pending") not in TERMINAL_POD_PHASES and not p["metadata"].get("deletionTimestamp")]
        finished = job_finished(job)
        conds: list[tuple[str, str, str, str]] = []
        start_time: str | bool | None = False  # False: leave as is
        completion_time: str | None = None
        created = deleted = 0
        if finished:
            if finished == "Failed":
                for p in active:
                    self._delete_pod(tr, p)
                    deleted += 1
            if tr.finish_mono is None:
                tr.finish_mono = now
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None:
                left = tr.finish_mono + core.config.job_clock_seconds(int(ttl)) - now
                if left <= 0:
                    core.delete_job_internal(ns, name, "Background")
                    return
                self._after(uid, left)
        elif spec.get("suspend"):
            for p in active:
                self._delete_pod(tr, p)
                deleted += 1
            conds.append(("Suspended", "True", "JobSuspended", "Job suspended"))
            start_time = None
            tr.start_mono = None
        else:
            susp = get_condition(job, "Suspended")
            if susp and susp.get("status") == "True":
                conds.append(("Suspended", "False", "JobResumed", "Job resumed"))
                start_time = rfc3339()
                tr.start_mono = now
            elif not st.get("startTime"):
                start_time = rfc3339()
                tr.start_mono = now
            elif tr.start_mono is None:
                tr.start_mono = now
            fail: tuple[str, str] | None = None
            ads = spec.get("activeDeadlineSeconds")
            backoff = int(spec.get("backoffLimit", 6))
            restarts = 0
            if (spec["template"].get("spec") or {}).get("restartPolicy") == "OnFailure":
                for p in active:
                    pst = p.get("status") or {}
                    for cs in (pst.get("containerStatuses") or []) + (pst.get("initContainerStatuses") or []):
                        restarts += int(cs.get("restartCount") or 0)
            if ads is not None and tr.start_mono is not None and now - tr.start_mono >= core.config.job_clock_seconds(int(ads)):
                fail = ("DeadlineExceeded", "Job was active longer than specified deadline")
            elif ads is not None and tr.start_mono is not None:
                self._after(uid, tr.start_mono + core.config.job_clock_seconds(int(ads)) - now)
            elif failed > backoff or (restarts > 0 and restarts >= max(backoff, 1)):
                fail = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
            if fail:
                conds.append(("Failed", "True", fail[0], fail[1]))
                core.events.record(job, "Warning", fail[0], fail[1], "job-controller")
                tr.finish_mono = now
                for p in active:
                    self._delete_pod(tr, p)
                    deleted += 1
            else:
                comp = spec.get("completions")
                par = int(spec.get("parallelism", 1) or 0)
                if indexed:
                    done = len(tr.succeeded_indexes) >= int(comp or 0)
                elif comp is None:
                    done = succeeded >= 1 and not active
                else:
                    done = succeeded >= int(comp)
                if done:
                    for p in active:
                        self._delete_pod(tr, p)
                        deleted += 1
                    if not active:
                        conds.append(("Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods"))
                        core.events.record(job, "Normal", "Completed", "Job completed", "job-controller")
                        completion_time = rfc3339()
                        tr.finish_mono = now
                elif indexed:
                    have = {_index(p) for p in active}
                    missing = [i for i in range(int(comp or 0)) if i not in tr.succeeded_indexes and i not in have]
                    slots = par - len(active)
                    for i in missing[: max(0, slots)]:
                        self._create_pod(job, i)
                        created += 1
                    if slots < 0:
                        deleted += self._scale_down(tr, active, -slots)
                else:
                    want = par if comp is None else min(par, int(comp) - succeeded)
                    if comp is None and succeeded > 0:
                        want = len(active)
                    diff = want - len(active)
                    for _ in range(max(0, diff)):
                        self._create_pod(job, None)
                        created += 1
                    if diff < 0:
                        deleted += self._scale_down(tr, active, -diff)
        n_active = len(active) + created - deleted
        ready = sum(
            1
            for p in active
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or [])
        )
        terminating = sum(
            1 for p in pods if p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") not in TERMINAL_POD_PHASES
        ) + deleted

        def mutate(j: dict[str, Any]) -> None:
            s = j.setdefault("status", {})
            for key, value in (("active", n_active), ("succeeded", succeeded), ("failed", failed)):
                if value:
                    s[key] = value
                else:
                    s.pop(key, None)
            s["ready"] = min(ready, n_active)
            s["terminating"] = terminating
            s["uncountedTerminatedPods"] = {}
            if indexed:
                if tr.succeeded_indexes:
                    s["completedIndexes"] = _compress(tr.succeeded_indexes)
                else:
                    s.pop("completedIndexes", None)
            if start_time is None:
                s.pop("startTime", None)
            elif start_time:
                s["startTime"] = start_time
            if completion_time:
                s["completionTime"] = completion_time
            for ctype, cstatus, reason, message in conds:
                set_condition(s, ctype, cstatus, reason, message)

        probe = {"status": json_copy(job.get("status") or {})}
        mutate(probe)
        if probe["status"] != (job.get("status") or {}):
            new_status = probe["status"]  # a copy of its own: it becomes the stored status as it is

            def put(j: dict[str, Any]) -> None:
                j["status"] = new_status

            core.store.update("jobs", ns, name, put, fields=())
        ttl = spec.get("ttlSecondsAfterFinished")
        if tr.finish_mono is not None and ttl is not None:  # its own status write wakes nobody: time the TTL here
            self._after(uid, tr.finish_mono + core.config.job_clock_seconds(int(ttl)) - now)


    def _scale_down(self, tr: JobTrack, active: list[dict[str, Any]], n: int) -> int:
        victims = sorted(active, key=lambda p: (bool(p["spec"].get("nodeName")), -self.core.store.creation_seq(p)))[:n]
        for p in victims:
            self._delete_pod(tr, p)
        return len(victims)

    def _create_pod(self, job: dict[str, Any], index: int | None) -> None:
        jmeta, spec = job["metadata"], job["spec"]
        tmpl = json_copy(spec["template"])
        tmeta = tmpl.get("metadata") or {}
        labels = dict(tmeta.get("labels") or {})
        ann = dict(tmeta.get("annotations") or {})
        for k, v in (jmeta.get("annotations") or {}).items():
            if k.startswith(GANG_ANNOTATION):
                ann[k] = v
        pspec = tmpl.get("spec") or {}
        base = jmeta["name"][:57]
        if index is not None:
            ann[INDEX_KEY] = str(index)
            labels[INDEX_KEY] = str(index)
            pspec.setdefault("hostname", f"{base}-{index}")
            for c in (pspec.get("containers") or []) + (pspec.get("initContainers") or []):
                env = c.setdefault("env", [])
                if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                    env.insert(0, {
                        "name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}},
                    })
            base = f"{base}-{index}"
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{base}-{random_suffix()}",
                "generateName": f"{base}-",
                "namespace": jmeta["namespace"],
                "labels": labels,
                "annotations": ann,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": jmeta["name"],
                        "uid": jmeta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": pspec,
        }
        if not ann:
            del body["metadata"]["annotations"]
        self._creating = True  # its ADDED event needs no second look at the Job: this sync counts it
        try:
            for attempt in range(NAME_ATTEMPTS):
                try:
                    pod = self.core.create_pod_internal(jmeta["namespace"], body)
                    break
                except ApiError as e:  # the generated name is taken (1,000 pods of one Job collide now and then)
                    if e.code != 409 or attempt == NAME_ATTEMPTS - 1:
                        raise
                    body["metadata"]["name"] = f"{base}-{random_suffix()}"
        finally:
            self._creating = False
        self.core.events.record(job, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}", "job-controller")


class PodGC:
    """Garbage collector for pods: owner Job gone (Background deletion) or node gone (NodeLost).

    Looks at the pods that store events point at: a pod that changed, the pods of a deleted Job,
    the pods of a deleted node."""

    def __init__(self, core: ClusterAPI):
        self.core = core
        self.dirty: set[tuple[str, str]] = set()

    def observe(self, event: Event) -> None:
        meta = event.obj["metadata"]
        if event.resource == "pods" and event.type != "DELETED":
            if _controller_uid(event.obj) or event.obj["spec"].get("nodeName"):
                self.dirty.add((meta["namespace"], meta["name"]))
        elif event.type == "DELETED" and event.resource == "jobs":
            self.dirty.update((p["metadata"]["namespace"], p["metadata"]["name"]) for p in self.core.store.pods_of_owner(meta["uid"]))
        elif event.type == "DELETED" and event.resource == "nodes":
            self.dirty.update((p["metadata"]["namespace"], p["metadata"]["name"]) for p in self.core.store.pods_on_node(meta["name"]))

    def resync(self) -> None:
        self.dirty.update((p["metadata"]["namespace"], p["metadata"]["name"]) for p in self.core.store.values("pods"))

    def sync(self) -> None:
        store = self.core.store
        todo, self.dirty = self.dirty, set()
        for ns, name in sorted(todo):
            p = store.get("pods", ns, name)
            if p is None:
                continue
            meta = p["metadata"]
            owner = _controller_uid(p)
            node = p["spec"].get("nodeName")
            if node and store.get("nodes", "", node) is None:
                if (p.get("status") or {}).get("phase") in TERMINAL_POD_PHASES:
                    store.delete("pods", ns, name)
                else:
                    self.core.kubelet.kill_node(node)
                    store.update("pods", ns, name, functools.partial(mark_node_lost, node=node))
                continue
            if owner and store.by_uid("jobs", owner) is None and not meta.get("deletionTimestamp"):
                self.core.delete_pod_internal(ns, name)


def mark_node_lost(pod: dict[str, Any], node: str) -> None:
    st = pod.setdefault("status", {})
    now = rfc3339()
    st["phase"] = "Failed"
    st["reason"] = "NodeLost"
    st["message"] = f"Node {node} which was running pod {pod['metadata']['name']} is unresponsive"
    set_condition(st, "DisruptionTarget", "True", "DeletionByPodGC", "PodGC: node no longer exists", probe=False)
    for ctype in ("Ready", "ContainersReady"):
        set_condition(st, ctype, "False", "PodFailed", None, probe=False)
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in st.get(key) or []:
            state = cs.get("state") or {}
            if "running" in state or "waiting" in state:
                started = (state.get("running") or {}).get("startedAt") or now
                cs["state"] = {"terminated": {"exitCode": 137, "reason": "NodeLost", "startedAt": started, "finishedAt": now}}
                cs["ready"] = False
                cs["started"] = False
    ann = pod["metadata"].get("annotations") or {}
    ann.pop("gpuorch.io/pid", None)
