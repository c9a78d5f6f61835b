"""The scheduler of a local cluster: binds pending pods to nodes.

Filters, in kube-scheduler's order: NodeUnschedulable, TaintToleration (NoSchedule/NoExecute),
NodeAffinity (nodeSelector and required node affinity), NodeResourcesFit (cpu, memory, pods,
nvidia.com/gpu and any other extended resource). Pending work is considered by (priority desc,
creation asc) without head-of-line blocking, as kube-scheduler does. Gangs (pods of a Job annotated
`gpuorch.io/gang: "true"`) are bound all together in one step or not at all. Scoring bin-packs GPU
pods (fewest free GPUs left) and keeps CPU-only pods off GPU nodes when it can.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from gpuorch_proto.kubesem import (
    TERMINAL_POD_PHASES,
    UNSCHEDULABLE_TAINT,
    affinity_terms,
    blocking_taints,
    node_affinity_matches,
    node_selector_matches,
    tolerates,
)

from .objects import GANG_ANNOTATION, GPU, desired_active, pod_requests
from .quantity import parse_quantity
from .util import rfc3339

if TYPE_CHECKING:
    from .api import ClusterAPI

__all__ = ["GANG_ANNOTATION", "TERMINAL", "Scheduler"]

TERMINAL = TERMINAL_POD_PHASES


@dataclass
class NodeInfo:
    name: str
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    unschedulable: bool
    allocatable: dict[str, Fraction]
    used: dict[str, Fraction] = field(default_factory=dict)
    pods: int = 0

    def free(self, res: str) -> Fraction:
        return self.allocatable.get(res, Fraction(0)) - self.used.get(res, Fraction(0))

    def copy(self) -> NodeInfo:
        return NodeInfo(self.name, self.labels, self.taints, self.unschedulable, self.allocatable, dict(self.used), self.pods)

    def add(self, req: Mapping[str, Fraction]) -> None:
        for k, v in req.items():
            self.used[k] = self.used.get(k, Fraction(0)) + v
        self.pods += 1


def pod_priority(pod: Mapping[str, Any]) -> int:
    p = (pod.get("spec") or {}).get("priority")
    return int(p) if isinstance(p, int) else 0


def _filter(pod: Mapping[str, Any], req: Mapping[str, Fraction], node: NodeInfo) -> list[str]:
    spec = pod.get("spec") or {}
    tols = spec.get("tolerations") or []
    if node.unschedulable and not tolerates(tols, UNSCHEDULABLE_TAINT):
        return ["node(s) were unschedulable"]
    blocking = blocking_taints(tols, node.taints)
    if blocking:
        taint = blocking[0]
        return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"]
    if not node_selector_matches(spec.get("nodeSelector"), node.labels):
        return ["node(s) didn't match Pod's node affinity/selector"]
    if not node_affinity_matches(affinity_terms(spec.get("affinity")), node.labels, node.name):
        return ["node(s) didn't match Pod's node affinity/selector"]
    reasons = []
    if node.pods + 1 > node.allocatable.get("pods", Fraction(110)):
        reasons.append("Too many pods")
    for res, amount in sorted(req.items()):
        if amount > 0 and amount > node.free(res):
            reasons.append(f"Insufficient {res}")
    return reasons


def _score(req: Mapping[str, Fraction], node: NodeInfo) -> tuple[Any, ...]:
    if req.get(GPU, 0) > 0:
        return (0, node.free(GPU) - req[GPU], node.name)
    has_gpu = 1 if node.allocatable.get(GPU, 0) > 0 else 0
    cpu = node.allocatable.get("cpu", Fraction(1)) or Fraction(1)
    return (has_gpu, node.used.get("cpu", Fraction(0)) / cpu, node.name)


def unschedulable_message(num_nodes: int, reasons: Counter[str]) -> str:
    if num_nodes == 0:
        return "no nodes available to schedule pods"
    parts = sorted(f"{n} {r}" for r, n in reasons.items())
    return f"0/{num_nodes} nodes are available: " + ", ".join(parts) + "."


def _shape(pod: Mapping[str, Any], req: Mapping[str, Fraction]) -> str:
    """What decides where a pod fits: its requests and every placement constraint.

    Two pods of one shape fit the same nodes; once one finds no node in a pass (nodes only fill
    up during a pass), the others of its shape cannot either, so a burst of identical pods costs
    one placement attempt per shape per pass, not one per pod (kube-scheduler's queueing hints).
    """
    spec = pod.get("spec") or {}
    return json.dumps(
        [sorted((k, str(v)) for k, v in req.items()), spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations")],
        sort_keys=True, default=str,
    )


class Scheduler:
    def __init__(self, core: ClusterAPI):
        self.core = core
        self._requests: dict[str, tuple[str, dict[str, Fraction]]] = {}  # pod uid -> (resourceVersion, requests)

    def requests(self, pod: Mapping[str, Any]) -> dict[str, Fraction]:
        """`pod_requests`, parsed once per pod version (a pod's resources do not change)."""
        meta = pod.get("metadata") or {}
        uid, rv = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
        hit = self._requests.get(uid)
        if hit is not None and hit[0] == rv:
            return hit[1]
        req = pod_requests(pod)
        if uid:
            if len(self._requests) > 200_000:
                self._requests.clear()
            self._requests[uid] = (rv, req)
        return req

    def _nodes(self) -> dict[str, NodeInfo]:
        out = {}
        for n in self.core.store.values("nodes"):
            st = n.get("status") or {}
            alloc = {k: parse_quantity(v) for k, v in (st.get("allocatable") or {}).items()}
            out[n["metadata"]["name"]] = NodeInfo(
                name=n["metadata"]["name"],
                labels=dict(n["metadata"].get("labels") or {}),
                taints=list((n.get("spec") or {}).get("taints") or []),
                unschedulable=bool((n.get("spec") or {}).get("unschedulable")),
                allocatable=alloc,
            )
        return out

    def sync(self) -> None:
        store = self.core.store
        nodes = self._nodes()
        pods = store.values("pods")
        pending: list[dict[str, Any]] = []
        bound_active: Counter[str] = Counter()
        names = self.core.config.scheduler_names
        for p in pods:
            phase = (p.get("status") or {}).get("phase", "Pending")
            node = p["spec"].get("nodeName")
            if node:
                if phase not in TERMINAL and node in nodes:
                    nodes[node].add(self.requests(p))
                    owner = _owner_uid(p)
                    if owner and not p["metadata"].get("deletionTimestamp"):
                        bound_active[owner] += 1
            elif (
                phase == "Pending"
                and not p["metadata"].get("deletionTimestamp")
                and (p["spec"].get("schedulerName") or "default-scheduler") in names
            ):
                pending.append(p)
        if not pending:
            return
        units: dict[str, list[dict[str, Any]]] = {}
        for p in pending:
            owner = _owner_uid(p)
            gang = (p["metadata"].get("annotations") or {}).get(GANG_ANNOTATION) == "true" and owner
            key = f"gang:{owner}" if gang else f"pod:{p['metadata']['uid']}"
            units.setdefault(key, []).append(p)

        def order(item: tuple[str, list[dict[str, Any]]]) -> tuple[int, int]:
            members = item[1]
            return (-max(pod_priority(p) for p in members), min(store.creation_seq(p) for p in members))

        refused: dict[str, str] = {}  # shape -> the message its first pod got in this pass
        for key, members in sorted(units.items(), key=order):
            members.sort(key=_index_key)
            if key.startswith("gang:"):
                self._place_gang(key[5:], members, nodes, bound_active[key[5:]])
            else:
                pod = members[0]
                shape = _shape(pod, self.requests(pod))
                if shape in refused:
                    self._unschedulable(pod, refused[shape])
                    continue
                why = self._place_one(pod, nodes)
                if why is not None:
                    refused[shape] = why

    def _place(self, pod: dict[str, Any], nodes: Mapping[str, NodeInfo]) -> tuple[NodeInfo | None, Counter[str]]:
        req = self.requests(pod)
        reasons: Counter[str] = Counter()
        best: NodeInfo | None = None
        best_score: tuple[Any, ...] | None = None
        for n in nodes.values():
            why = _filter(pod, req, n)
            if why:
                reasons.update(why)
                continue
            s = _score(req, n)
            if best_score is None or s < best_score:
                best, best_score = n, s
        return best, reasons

    def _place_one(self, pod: dict[str, Any], nodes: dict[str, NodeInfo]) -> str | None:
        """Bind the pod to the best node; None, or the message saying why no node takes it."""
        node, reasons = self._place(pod, nodes)
        if node is None:
            message = unschedulable_message(len(nodes), reasons)
            self._unschedulable(pod, message)
            return message
        node.add(self.requests(pod))
        self._bind(pod, node.name)
        self._scheduled(pod, node.name)
        return None

    def _place_gang(self, owner: str, members: list[dict[str, Any]], nodes: dict[str, NodeInfo], bound: int) -> None:
        job = self.core.job_by_uid(owner)
        size = len(members) + bound
        if job is not None:
            size = desired_active(job)
            if len(members) + bound < size:
                return  # the Job controller has not created every member yet
        trial = {k: v.copy() for k, v in nodes.items()}
        placement: list[tuple[dict[str, Any], str]] = []
        for p in members:
            node, reasons = self._place(p, trial)
            if node is None:
                jname = (job or {}).get("metadata", {}).get("name") or p["metadata"].get("generateName", "")
                msg = (
                    f"{unschedulable_message(len(nodes), reasons)} gang {p['metadata']['namespace']}/{jname}: "
                    f"{len(placement) + bound}/{len(members) + bound} pods fit, the gang is bound all together or not at all."
                )
                for m in members:
                    self._unschedulable(m, msg)
                return
            node.add(pod_requests(p))
            placement.append((p, node.name))
        for p, node_name in placement:
            nodes[node_name].add(pod_requests(p))
            self._bind(p, node_name)
        for p, node_name in placement:  # after the binds: the gang is bound in consecutive versions
            self._scheduled(p, node_name)

    def _bind(self, pod: dict[str, Any], node: str) -> None:
        def mutate(p: dict[str, Any]) -> None:
            p["spec"]["nodeName"] = node
            st = p.setdefault("status", {})
            conds = [c for c in st.get("conditions") or [] if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": rfc3339()})
            st["conditions"] = conds
            st.pop("nominatedNodeName", None)

        self.core.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], mutate)

    def _scheduled(self, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]
        self.core.events.record(pod, "Normal", "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
                                "default-scheduler")

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        self.core.events.record(pod, "Warning", "FailedScheduling", message, "default-scheduler")
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message") == message:
                return  # already says so

        def mutate(p: dict[str, Any]) -> None:
            st = p.setdefault("status", {})
            conds = st.setdefault("conditions", [])
            for c in conds:
                if c.get("type") == "PodScheduled":
                    if c.get("status") != "False":
                        c["lastTransitionTime"] = rfc3339()
                    c.update(status="False", reason="Unschedulable", message=message)
                    return
            conds.append({
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": rfc3339(),
                "reason": "Unschedulable",
                "message": message,
            })

        self.core.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], mutate)


def _owner_uid(pod: Mapping[str, Any]) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _index_key(pod: Mapping[str, Any]) -> tuple[int, str]:
    idx = (pod["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
    return (int(idx) if idx and idx.isdigit() else 0, pod["metadata"]["name"])
