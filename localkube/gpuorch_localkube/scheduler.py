"""The scheduler of a local cluster: binds pending pods to nodes.

Filters, in kube-scheduler's order: NodeUnschedulable, TaintToleration (NoSchedule/NoExecute),
NodeAffinity (nodeSelector and required node affinity), NodeResourcesFit (cpu, memory, pods,
nvidia.com/gpu and any other extended resource). Pending work is considered by (priority desc,
creation asc) without head-of-line blocking, as kube-scheduler does. Gangs (pods of a Job annotated
`gpuorch.io/gang: "true"`) are bound all together in one step or not at all. Scoring bin-packs GPU
pods (fewest free GPUs left) and keeps CPU-only pods off GPU nodes when it can.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import msgspec

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
    from .store import Event

__all__ = ["GANG_ANNOTATION", "TERMINAL", "Scheduler"]

TERMINAL = TERMINAL_POD_PHASES
_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_ZERO, _ONE, _DEFAULT_PODS = Fraction(0), Fraction(1), Fraction(110)  # built once: a Fraction costs microseconds


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
        return self.allocatable.get(res, _ZERO) - self.used.get(res, _ZERO)

    def copy(self) -> NodeInfo:
        return NodeInfo(self.name, self.labels, self.taints, self.unschedulable, self.allocatable, dict(self.used), self.pods)

    def add(self, req: Mapping[str, Fraction]) -> None:
        for k, v in req.items():
            self.used[k] = self.used.get(k, _ZERO) + v
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
    if node.pods + 1 > node.allocatable.get("pods", _DEFAULT_PODS):
        reasons.append("Too many pods")
    for res, amount in sorted(req.items()):
        if amount > 0 and amount > node.free(res):
            reasons.append(f"Insufficient {res}")
    return reasons


def _score(req: Mapping[str, Fraction], node: NodeInfo) -> tuple[Any, ...]:
    if req.get(GPU, 0) > 0:
        return (0, node.free(GPU) - req[GPU], node.name)
    has_gpu = 1 if node.allocatable.get(GPU, 0) > 0 else 0
    cpu = node.allocatable.get("cpu", _ONE) or _ONE
    return (has_gpu, node.used.get("cpu", _ZERO) / cpu, node.name)


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
    return _encode_sorted(
        [sorted((k, str(v)) for k, v in req.items()), spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations")],
    ).decode()


@dataclass
class _Pending:
    """A pod waiting for a node, as the scheduling queue holds it."""

    uid: str
    namespace: str
    name: str
    order: tuple[int, int]  # (-priority, creation sequence): the queue's order
    unit: str  # "pod:<uid>" or "gang:<owner uid>"
    shape: str


class Scheduler:
    """Binds pending pods; fed by store events, so the cost of a pass does not grow with the backlog.

    State kept from the events (like kube-scheduler's cache and scheduling queue):

    * per node, the requests of the pods bound to it (`NodeInfo.used`), updated when a pod is
      bound, finishes, or goes;
    * the pending pods, by shape (a sorted list per shape) and by gang;
    * which units are new since the last pass, and whether capacity grew (a pod finished or left
      a node, a node was added or changed).

    A pass tries the new units; only when capacity grew does it try every shape again, and then
    only each shape's head until one is refused: the rest of that shape cannot fit either
    (kube-scheduler's queueing hints). A pod is marked unschedulable (condition and one
    FailedScheduling event) when its message changes, not again on every pass.
    """

    def __init__(self, core: ClusterAPI):
        self.core = core
        self._requests: dict[str, dict[str, Fraction]] = {}  # pod uid -> requests
        self.nodes: dict[str, NodeInfo] = {}
        self._bound: dict[str, tuple[str, dict[str, Fraction], str | None]] = {}  # uid -> (node, requests, owner counted)
        self._on_node: dict[str, set[str]] = {}
        self._bound_active: Counter[str] = Counter()
        self._pending: dict[str, _Pending] = {}
        self._shapes: dict[str, list[tuple[tuple[int, int], str]]] = {}
        self._gangs: dict[str, set[str]] = {}
        self._new: set[str] = set()  # units
        self._refused: dict[str, str] = {}  # shape -> message its members carry (since the last capacity change)
        self._marked: dict[str, str] = {}  # pod uid -> unschedulable message it carries
        self._grew = True

    # -- the cache, from store events -----------------------------------------------------------

    def requests(self, pod: Mapping[str, Any]) -> dict[str, Fraction]:
        """`pod_requests`, parsed once per pod (a pod's resources cannot be updated)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        hit = self._requests.get(uid)
        if hit is not None:
            return hit
        req = pod_requests(pod)
        if uid:
            self._requests[uid] = req
        return req

    def resync(self) -> None:
        """Rebuild the cache and queue from the store (at start, and as a periodic safety net)."""
        self.nodes, self._bound, self._on_node, self._bound_active = {}, {}, {}, Counter()
        self._pending, self._shapes, self._gangs, self._new, self._refused = {}, {}, {}, set(), {}
        for n in self.core.store.values("nodes"):
            self._set_node(n)
        for p in self.core.store.values("pods"):
            self._pod_changed(p["metadata"]["uid"], p)
        self._grew = True

    def observe(self, event: Event) -> None:
        if event.resource == "nodes":
            name = event.obj["metadata"]["name"]
            if event.type == "DELETED":
                self.nodes.pop(name, None)
            else:
                self._set_node(event.obj)
            self._grew = True
        elif event.resource == "pods":
            uid = event.obj["metadata"]["uid"]
            if event.type == "DELETED":
                self._pod_changed(uid, None)
                self._requests.pop(uid, None)
                self._marked.pop(uid, None)
            else:
                self._pod_changed(uid, event.obj, event.prev)
        elif event.resource == "jobs" and event.type != "DELETED":
            uid = event.obj["metadata"]["uid"]
            if uid in self._gangs:  # a gang's size follows its Job's parallelism
                self._new.add(f"gang:{uid}")

    def _set_node(self, n: dict[str, Any]) -> None:
        st = n.get("status") or {}
        name = n["metadata"]["name"]
        info = NodeInfo(
            name=name,
            labels=dict(n["metadata"].get("labels") or {}),
            taints=list((n.get("spec") or {}).get("taints") or []),
            unschedulable=bool((n.get("spec") or {}).get("unschedulable")),
            allocatable={k: parse_quantity(v) for k, v in (st.get("allocatable") or {}).items()},
        )
        for uid in self._on_node.get(name, ()):
            info.add(self._bound[uid][1])
        self.nodes[name] = info

    def _pod_changed(self, uid: str, pod: dict[str, Any] | None, prev: dict[str, Any] | None = None) -> None:
        # capacity: what the pod holds on its node
        holds = None
        if pod is not None:
            node = pod["spec"].get("nodeName")
            if node and (pod.get("status") or {}).get("phase", "Pending") not in TERMINAL:
                owner = _owner_uid(pod)
                holds = (node, self.requests(pod), owner if owner and not pod["metadata"].get("deletionTimestamp") else None)
        old = self._bound.get(uid)
        if old != holds:
            if old is not None:
                self._release(uid, old)
            if holds is not None:
                self._bound[uid] = holds
                self._on_node.setdefault(holds[0], set()).add(uid)
                if holds[0] in self.nodes:
                    self.nodes[holds[0]].add(holds[1])
                if holds[2]:
                    self._bound_active[holds[2]] += 1
        # the queue
        waiting = pod is not None and self._waiting(pod)
        queued = self._pending.get(uid)
        if queued is not None and (not waiting or (prev is not None and pod is not None and pod["spec"] != prev["spec"])):
            self._dequeue(queued)
            queued = None
        if waiting and queued is None and pod is not None:
            self._enqueue(uid, pod)

    def _release(self, uid: str, held: tuple[str, dict[str, Fraction], str | None]) -> None:
        node, req, owner = held
        del self._bound[uid]
        self._on_node.get(node, set()).discard(uid)
        info = self.nodes.get(node)
        if info is not None:
            for k, v in req.items():
                info.used[k] = info.used.get(k, _ZERO) - v
            info.pods -= 1
        if owner:
            self._bound_active[owner] -= 1
            if self._bound_active[owner] <= 0:
                del self._bound_active[owner]
        self._grew = True

    def _waiting(self, pod: dict[str, Any]) -> bool:
        return (
            not pod["spec"].get("nodeName")
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
            and not pod["metadata"].get("deletionTimestamp")
            and (pod["spec"].get("schedulerName") or "default-scheduler") in self.core.config.scheduler_names
        )

    def _enqueue(self, uid: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        owner = _owner_uid(pod)
        gang = owner if owner and (meta.get("annotations") or {}).get(GANG_ANNOTATION) == "true" else None
        unit = f"gang:{gang}" if gang else f"pod:{uid}"
        shape = unit if gang else _shape(pod, self.requests(pod))
        entry = _Pending(uid, meta["namespace"], meta["name"], (-pod_priority(pod), self.core.store.creation_seq(pod)), unit, shape)
        self._pending[uid] = entry
        if gang:
            self._gangs.setdefault(gang, set()).add(uid)
        else:
            bisect.insort(self._shapes.setdefault(shape, []), (entry.order, uid))
        self._new.add(unit)

    def _dequeue(self, entry: _Pending) -> None:
        del self._pending[entry.uid]
        self._marked.pop(entry.uid, None)
        if entry.unit.startswith("gang:"):
            members = self._gangs.get(entry.unit[5:])
            if members is not None:
                members.discard(entry.uid)
                if not members:
                    del self._gangs[entry.unit[5:]]
            return
        members_list = self._shapes.get(entry.shape)
        if members_list is not None:
            i = bisect.bisect_left(members_list, (entry.order, entry.uid))
            if i < len(members_list) and members_list[i][1] == entry.uid:
                del members_list[i]
            if not members_list:
                del self._shapes[entry.shape]
                self._refused.pop(entry.shape, None)

    # -- a pass ------------------------------------------------------------------------------------

    def sync(self) -> None:
        if not self._pending:
            self._new.clear()
            self._grew = False
            return
        grew, new = self._grew, self._new
        self._grew, self._new = False, set()
        if grew:
            self._refused.clear()
        heap: list[tuple[tuple[int, int], str, int]] = []  # (order, shape or gang unit, index in the shape)
        new_by_shape: dict[str, list[str]] = {}
        for u in new:
            entry = self._pending.get(u[4:]) if u.startswith("pod:") else None
            if entry is not None:
                new_by_shape.setdefault(entry.shape, []).append(entry.uid)
        for shape in list(self._shapes) if grew else list(new_by_shape):
            members = self._shapes.get(shape)
            if not members:
                continue
            known = self._refused.get(shape)
            if known is not None:  # refused since the last capacity change: so are its new members
                for uid in new_by_shape.get(shape, ()):
                    self._mark(uid, known)
                continue
            heapq.heappush(heap, (members[0][0], shape, 0))
        for owner, uids in self._gangs.items():
            if grew or f"gang:{owner}" in new:
                orders = [self._pending[u].order for u in uids]
                order = (min(o[0] for o in orders), min(o[1] for o in orders))
                heapq.heappush(heap, (order, f"gang:{owner}", 0))
        while heap:
            _, key, i = heapq.heappop(heap)
            if key.startswith("gang:"):
                if key[5:] in self._gangs:
                    self._place_gang(key[5:])
                continue
            queue = self._shapes.get(key)
            if not queue or i >= len(queue):
                continue
            uid = queue[i][1]
            pod = self._pod(uid)
            if pod is None:
                continue
            why = self._place_one(pod, self.nodes)
            if why is None:  # bound: it left the shape's list (the bind's event dequeued it)
                if queue and i < len(queue):
                    heapq.heappush(heap, (queue[i][0], key, i))
                continue
            self._refused[key] = why
            for _, other in queue[i + 1:]:
                self._mark(other, why)

    def _pod(self, uid: str) -> dict[str, Any] | None:
        entry = self._pending.get(uid)
        return None if entry is None else self.core.store.get("pods", entry.namespace, entry.name)

    def _mark(self, uid: str, message: str) -> None:
        if self._marked.get(uid) == message:
            return
        pod = self._pod(uid)
        if pod is not None:
            self._unschedulable(pod, message)

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
        self._bind(pod, node.name)
        self._scheduled(pod, node.name)
        return None

    def _place_gang(self, owner: str) -> None:
        members = [p for p in (self._pod(u) for u in self._gangs.get(owner, ())) if p is not None]
        if not members:
            return
        members.sort(key=_index_key)
        bound = self._bound_active.get(owner, 0)
        job = self.core.job_by_uid(owner)
        size = len(members) + bound
        if job is not None:
            size = desired_active(job)
            if len(members) + bound < size:
                return  # the Job controller has not created every member yet
        trial = {k: v.copy() for k, v in self.nodes.items()}
        placement: list[tuple[dict[str, Any], str]] = []
        for p in members:
            node, reasons = self._place(p, trial)
            if node is None:
                jname = (job or {}).get("metadata", {}).get("name") or p["metadata"].get("generateName", "")
                msg = (
                    f"{unschedulable_message(len(self.nodes), reasons)} gang {p['metadata']['namespace']}/{jname}: "
                    f"{len(placement) + bound}/{len(members) + bound} pods fit, the gang is bound all together or not at all."
                )
                for m in members:
                    self._mark(m["metadata"]["uid"], msg)
                return
            node.add(self.requests(p))
            placement.append((p, node.name))
        for p, node_name in placement:
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

        self.core.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], mutate, fields=("spec", "status"))

    def _scheduled(self, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]
        self.core.events.record(pod, "Normal", "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
                                "default-scheduler")

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        uid = pod["metadata"]["uid"]
        if self._marked.get(uid) == message:
            return
        self._marked[uid] = message
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

        self.core.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], mutate, fields=("status",))


def _owner_uid(pod: Mapping[str, Any]) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _index_key(pod: Mapping[str, Any]) -> tuple[int, str]:
    idx = (pod["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
    return (int(idx) if idx and idx.isdigit() else 0, pod["metadata"]["name"])
