"""Server-side printing: `meta.k8s.io/v1` Table responses with the API server's columns.

kubectl asks for `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` on `get`; the columns and
cells follow the API server's printers (`pkg/printers/internalversion`): nodes NAME STATUS ROLES
AGE VERSION (+ wide), pods NAME READY STATUS RESTARTS AGE (+ wide), jobs NAME STATUS COMPLETIONS
DURATION AGE (+ wide), namespaces, events.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .util import parse_rfc3339

__all__ = ["human_duration", "table", "wants_table"]


def wants_table(accept: str | None) -> bool:
    if not accept:
        return False
    for part in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip() for p in part.split(";")[1:] if "=" in p}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") in ("v1", "v1beta1"):
            return True
    return False


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration."""
    s = int(seconds)
    if s < 0:
        return "<invalid>"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        return f"{h // 24 // 365}y{(h // 24) % 365}d"
    return f"{h // 24 // 365}y"


def _age(ts: str | None, now: float) -> str:
    if not ts:
        return "<unknown>"
    return human_duration(now - parse_rfc3339(ts))


def _col(name: str, type_: str = "string", fmt: str = "", priority: int = 0, desc: str = "") -> dict[str, Any]:
    return {"name": name, "type": type_, "format": fmt, "description": desc or name, "priority": priority}


_NAME = _col("Name", fmt="name", desc="Name must be unique within a namespace.")
_AGE = _col("Age", desc="CreationTimestamp is a timestamp representing the server time when this object was created.")

NODE_COLUMNS = [
    _NAME,
    _col("Status", desc="The status of the node"),
    _col("Roles", desc="The roles of the node"),
    _AGE,
    _col("Version", desc="Kubelet Version reported by the node."),
    _col("Internal-IP", priority=1, desc="List of addresses reachable to the node."),
    _col("External-IP", priority=1, desc="List of addresses reachable to the node."),
    _col("OS-Image", priority=1, desc="OS Image reported by the node from /etc/os-release."),
    _col("Kernel-Version", priority=1, desc="Kernel Version reported by the node."),
    _col("Container-Runtime", priority=1, desc="Container runtime version reported by the node."),
]
POD_COLUMNS = [
    _NAME,
    _col("Ready", desc="The aggregate readiness state of this pod for accepting traffic."),
    _col("Status", desc="The aggregate status of the containers in this pod."),
    _col("Restarts", desc="The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
    _AGE,
    _col("IP", priority=1, desc="IP address allocated to the pod."),
    _col("Node", priority=1, desc="Name of the node this pod is assigned to."),
    _col("Nominated Node", priority=1, desc="Name of the node this pod is nominated to."),
    _col("Readiness Gates", priority=1, desc="The readiness gates of this pod."),
]
JOB_COLUMNS = [
    _NAME,
    _col("Status", desc="Status of the job."),
    _col("Completions", desc="The desired number of successfully finished pods the job should be run with."),
    _col("Duration", desc="Time required to complete the job."),
    _AGE,
    _col("Containers", priority=1, desc="Names of each container in the template."),
    _col("Images", priority=1, desc="Images referenced by each container in the template."),
    _col("Selector", priority=1, desc="A label query over pods that should match the pod count."),
]
NAMESPACE_COLUMNS = [_NAME, _col("Status", desc="The status of the namespace"), _AGE]
EVENT_COLUMNS = [
    _col("Last Seen", desc="The last time this event was observed."),
    _col("Type", desc="Type of this event (Normal, Warning)."),
    _col("Reason", desc="Why the action was taken."),
    _col("Object", desc="The object this Event is about."),
    _col("Subobject", priority=1, desc="The subobject this Event is about."),
    _col("Source", priority=1, desc="The component reporting this event."),
    _col("Message", desc="A human-readable description of the status of this operation."),
    _col("First Seen", priority=1, desc="The first time this event was observed."),
    _col("Count", priority=1, desc="The number of times this event has occurred."),
    _col("Name", priority=1, desc="The name of this event."),
]


def _node_row(o: dict[str, Any], now: float) -> list[Any]:
    st, spec, labels = o.get("status") or {}, o.get("spec") or {}, o["metadata"].get("labels") or {}
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    status = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    if spec.get("unschedulable"):
        status += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/") and "/" in k)
    addrs = st.get("addresses") or []
    internal = next((a["address"] for a in addrs if a.get("type") == "InternalIP"), "<none>")
    external = next((a["address"] for a in addrs if a.get("type") == "ExternalIP"), "<none>")
    info = st.get("nodeInfo") or {}
    return [o["metadata"]["name"], status, ",".join(roles) or "<none>", _age(o["metadata"].get("creationTimestamp"), now),
            info.get("kubeletVersion", ""), internal, external, info.get("osImage") or "<unknown>",
            info.get("kernelVersion") or "<unknown>", info.get("containerRuntimeVersion") or "<unknown>"]


def pod_status_reason(o: dict[str, Any]) -> str:
    """The STATUS column of `kubectl get pods` (printPod)."""
    st = o.get("status") or {}
    reason = st.get("reason") or st.get("phase") or "Pending"
    spec = o.get("spec") or {}
    inits = st.get("initContainerStatuses") or []
    initializing = False
    for i, cs in enumerate(inits):
        state = cs.get("state") or {}
        term, wait = state.get("terminated"), state.get("waiting")
        if term and term.get("exitCode") == 0:
            continue
        initializing = True
        if term:
            reason = "Init:" + (term.get("reason") or (f"Signal:{term['signal']}" if term.get("signal") else f"ExitCode:{term.get('exitCode')}"))
        elif wait and wait.get("reason") and wait["reason"] != "PodInitializing":
            reason = "Init:" + wait["reason"]
        else:
            reason = f"Init:{i}/{len(spec.get('initContainers') or [])}"
        break
    if not initializing:
        has_running = False
        for cs in reversed(st.get("containerStatuses") or []):
            state = cs.get("state") or {}
            wait, term = state.get("waiting"), state.get("terminated")
            if wait and wait.get("reason"):
                reason = wait["reason"]
            elif term and term.get("reason"):
                reason = term["reason"]
            elif term:
                reason = f"Signal:{term['signal']}" if term.get("signal") else f"ExitCode:{term.get('exitCode')}"
            elif state.get("running") and cs.get("ready"):
                has_running = True
        if reason == "Completed" and has_running:
            reason = "Running"
    if o["metadata"].get("deletionTimestamp"):
        reason = "Unknown" if st.get("reason") == "NodeLost" else "Terminating"
    return str(reason)


def _pod_row(o: dict[str, Any], now: float) -> list[Any]:
    st, spec = o.get("status") or {}, o.get("spec") or {}
    css = st.get("containerStatuses") or []
    ready = sum(1 for c in css if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in css)
    last = max(((c.get("lastState") or {}).get("terminated") or {}).get("finishedAt") or "" for c in css) if css else ""
    restarts_cell = f"{restarts} ({_age(last, now)} ago)" if restarts and last else str(restarts)
    gates = spec.get("readinessGates") or []
    return [o["metadata"]["name"], f"{ready}/{len(spec.get('containers') or [])}", pod_status_reason(o), restarts_cell,
            _age(o["metadata"].get("creationTimestamp"), now), st.get("podIP") or "<none>", spec.get("nodeName") or "<none>",
            st.get("nominatedNodeName") or "<none>", f"0/{len(gates)}" if gates else "<none>"]


def _job_row(o: dict[str, Any], now: float) -> list[Any]:
    spec, st = o.get("spec") or {}, o.get("status") or {}
    completions = spec.get("completions")
    succeeded = int(st.get("succeeded") or 0)
    comp = f"{succeeded}/{completions}" if completions is not None else (
        f"{succeeded}/1 of {spec.get('parallelism')}" if (spec.get("parallelism") or 1) > 1 else f"{succeeded}/1")
    conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    if conds.get("Complete") == "True":
        status = "Complete"
    elif conds.get("Failed") == "True":
        status = "Failed"
    elif o["metadata"].get("deletionTimestamp"):
        status = "Terminating"
    elif conds.get("Suspended") == "True":
        status = "Suspended"
    else:
        status = "Running"
    start, end = st.get("startTime"), st.get("completionTime")
    duration = "" if not start else human_duration((parse_rfc3339(end) if end else now) - parse_rfc3339(start))
    containers = (((spec.get("template") or {}).get("spec") or {}).get("containers")) or []
    sel = (spec.get("selector") or {}).get("matchLabels") or {}
    return [o["metadata"]["name"], status, comp, duration, _age(o["metadata"].get("creationTimestamp"), now),
            ",".join(c.get("name", "") for c in containers), ",".join(c.get("image", "") for c in containers),
            ",".join(f"{k}={v}" for k, v in sorted(sel.items())) or "<none>"]


def _namespace_row(o: dict[str, Any], now: float) -> list[Any]:
    return [o["metadata"]["name"], (o.get("status") or {}).get("phase", "Active"), _age(o["metadata"].get("creationTimestamp"), now)]


def _event_row(o: dict[str, Any], now: float) -> list[Any]:
    inv, src = o.get("involvedObject") or {}, o.get("source") or {}
    count = int(o.get("count") or 1)
    last = _age(o.get("lastTimestamp"), now)
    last_seen = f"{last} (x{count} over {_age(o.get('firstTimestamp'), now)})" if count > 1 else last
    return [last_seen, o.get("type", ""), o.get("reason", ""), f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}",
            inv.get("fieldPath", ""), ", ".join(v for v in (src.get("component"), src.get("host")) if v),
            str(o.get("message", "")).strip(), _age(o.get("firstTimestamp"), now), count, o["metadata"]["name"]]


_PRINTERS: dict[str, tuple[list[dict[str, Any]], Callable[[dict[str, Any], float], list[Any]]]] = {
    "nodes": (NODE_COLUMNS, _node_row),
    "pods": (POD_COLUMNS, _pod_row),
    "jobs": (JOB_COLUMNS, _job_row),
    "namespaces": (NAMESPACE_COLUMNS, _namespace_row),
    "events": (EVENT_COLUMNS, _event_row),
}


def _embedded(o: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return o
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}


def table(resource: str, objs: list[dict[str, Any]], list_meta: dict[str, Any] | None, include: str | None,
          headers: bool = True) -> dict[str, Any]:
    """A Table of objs; include: None | Object | PartialObjectMetadata (the default)."""
    include = include or "PartialObjectMetadata"
    cols, row = _PRINTERS[resource]
    now = time.time()
    rows = []
    for o in objs:
        r: dict[str, Any] = {"cells": row(o, now)}
        emb = _embedded(o, include)
        if emb is not None:
            r["object"] = emb
        rows.append(r)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": dict(list_meta or {}),
        "columnDefinitions": cols if headers else [],
        "rows": rows,
    }
