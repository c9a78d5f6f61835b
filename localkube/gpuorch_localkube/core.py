"""The API semantics of one local cluster, shared by the HTTP server and the controllers."""

from __future__ import annotations

import base64
import builtins
import copy
import json
import platform
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuorch_proto.kubesem import TERMINAL_POD_PHASES

from .api import ProcessTable
from .config import ClusterConfig, NodeGroup
from .errors import JOBS, NODES, PODS, SECRETS, ApiError, Resource
from .events import EventRecorder
from .objects import (
    GPU,
    _validate_annotations,
    _validate_labels,
    check_type_meta,
    normalise_spec_quantities,
    prepare_job,
    prepare_owned_pod,
    prepare_pod,
)
from .patch import apply_patch
from .secrets import prepare_secret
from .selectors import parse_field_selector, parse_label_selector
from .store import Store
from .util import new_uid, rfc3339
from .version import KUBE_VERSION, version_info

__all__ = ["KUBE_VERSION", "ClusterCore", "version_info"]

ORPHAN_WARNING = (
    '299 - "child pods are preserved by default when jobs are deleted; set propagationPolicy=Background to '
    'remove them or set propagationPolicy=Orphan to suppress this warning"'
)


def node_object(cluster: str, group: NodeGroup, name: str) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": version_info()["platform"].split("/")[1],
        "node.kubernetes.io/instance-type": f"localkube.{group.name}",
        "gpuorch.io/node-group": group.name,
    }
    capacity = {"cpu": group.cpu, "memory": group.memory, "pods": str(group.pods)}
    if group.pool:
        labels["gpuorch.io/pool"] = group.pool
    if group.gpu is not None:
        labels.update({
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": group.gpu.model,
            "nvidia.com/gpu.memory": str(group.gpu.memory_mib),
            "nvidia.com/gpu.count": str(group.gpu.count),
        })
        capacity[GPU] = str(group.gpu.count)
    labels.update(group.labels)
    now = rfc3339()
    node_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"localkube://{cluster}/{name}"))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": new_uid(),
            "creationTimestamp": now,
            "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"providerID": f"localkube://{cluster}/{name}", **({"taints": copy.deepcopy(group.taints)} if group.taints else {})},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": now, "lastTransitionTime": now}
                for t, r, m in (
                    ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                    ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                )
            ]
            + [{
                "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "architecture": labels["kubernetes.io/arch"],
                "bootID": new_uid(),
                "containerRuntimeVersion": "localkube://0.1.0",
                "kernelVersion": platform.release(),
                "kubeProxyVersion": "",
                "kubeletVersion": KUBE_VERSION[2],
                "machineID": node_uid.replace("-", ""),
                "operatingSystem": "linux",
                "osImage": "localkube (local processes)",
                "systemUUID": node_uid,
            },
        },
    }


def _check_preconditions(res: Resource, obj: dict[str, Any], pre: dict[str, Any] | None) -> None:
    if not pre:
        return
    meta = obj["metadata"]
    if pre.get("uid") and pre["uid"] != meta.get("uid"):
        raise ApiError.conflict(res, meta["name"], f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta.get('uid')}")
    if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
        raise ApiError.conflict(
            res, meta["name"],
            f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
            f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
        )


def _strip(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


class ClusterCore:
    """State and API operations of one cluster. Callers hold no lock; every operation takes it."""

    def __init__(self, config: ClusterConfig, state_dir: Path, wake: Callable[[], None]):
        self.config = config
        self.state_dir = state_dir
        self.cluster_dir = state_dir / "shared"
        self.store = Store(config.watch_history)
        self.wake = wake
        self.store.add_listener(lambda _event: wake())
        self.events = EventRecorder(self.store)
        self.kubelet: ProcessTable = _NoProcesses()  # the cluster puts its kubelet here
        self.node_groups: dict[str, NodeGroup] = {}
        self.extra_namespaces: set[str] = {"default", "kube-system", "kube-public", "kube-node-lease"}
        self.started = rfc3339()

    # -- nodes -----------------------------------------------------------------------------------

    def add_configured_nodes(self) -> None:
        with self.store.lock:
            for group in self.config.nodes:
                for name in group.node_names():
                    self.node_groups[name] = group
                    self.store.create("nodes", node_object(self.config.name, group, name))

    def job_by_uid(self, uid: str) -> dict[str, Any] | None:
        return self.store.by_uid("jobs", uid)

    # -- reads -----------------------------------------------------------------------------------

    def get(self, res: Resource, namespace: str, name: str) -> dict[str, Any]:
        obj = self.store.get(res.plural, namespace if res.namespaced else "", name)
        if obj is None:
            raise ApiError.not_found(res, name)
        return obj

    def list(
        self, res: Resource, namespace: str | None, label_selector: str | None, field_selector: str | None,
        limit: int | None = None, cont: str | None = None,
    ) -> dict[str, Any]:
        lsel = parse_label_selector(label_selector)
        fsel = parse_field_selector(res.plural, field_selector)
        start: list[str] | None = None
        if cont:
            try:
                start = json.loads(base64.urlsafe_b64decode(cont.encode()).decode())["start"]
            except (ValueError, KeyError) as e:
                raise ApiError.bad_request("continue key is not valid") from e
        with self.store.lock:
            rv = self.store.rv
            keys = self.store.keys_with_labels(res.plural, lsel.equalities())
            if keys is None:
                candidates = self.store.list(res.plural, namespace)
            else:  # from the label index: only the objects with the selector's key=value labels
                candidates = [o for o in (self.store.get(res.plural, *k) for k in keys if namespace is None or k[0] == namespace) if o]
            items = [
                o for o in candidates
                if lsel.matches(o["metadata"].get("labels")) and fsel(o)
                and (start is None or [o["metadata"].get("namespace", ""), o["metadata"]["name"]] > start)
            ]
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and limit > 0 and len(items) > limit:
            last = items[limit - 1]["metadata"]
            token = json.dumps({"start": [last.get("namespace", ""), last["name"]], "rv": rv})
            meta["continue"] = base64.urlsafe_b64encode(token.encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta, "items": items}

    # -- namespaces (implicit) -------------------------------------------------------------------

    def namespace_object(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"localkube://{self.config.name}/ns/{name}")),
                "resourceVersion": str(self.store.rv),
                "creationTimestamp": self.started,
                "labels": {"kubernetes.io/metadata.name": name},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    def list_namespaces(self) -> dict[str, Any]:
        with self.store.lock:
            names = self.extra_namespaces | self.store.namespaces() | {b.namespace for b in self.config.background}
            return {
                "kind": "NamespaceList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.store.rv)},
                "items": [self.namespace_object(n) for n in sorted(names)],
            }

    def create_namespace(self, body: Any, dry_run: bool = False) -> dict[str, Any]:
        if not isinstance(body, dict) or not (body.get("metadata") or {}).get("name"):
            raise ApiError.invalid(Resource("namespaces", "Namespace", "", False), "", [("metadata.name", "FieldValueRequired", "Required value")])
        name = str(body["metadata"]["name"])
        with self.store.lock:
            if not dry_run:
                self.extra_namespaces.add(name)
            return self.namespace_object(name)

    # -- create ----------------------------------------------------------------------------------

    def _default_priority(self, pod: dict[str, Any]) -> None:
        spec = pod["spec"]
        if spec.get("priority") is None:
            cls = spec.get("priorityClassName")
            spec["priority"] = int(self.config.priority_classes.get(cls, 0)) if cls else 0

    def create_job(self, namespace: str, body: Any, dry_run: bool = False, owned: bool = False) -> dict[str, Any]:
        """`owned`: the body was just decoded for this call and may be used as the stored object."""
        job = prepare_job(body, namespace, owned)
        if dry_run:
            return job
        with self.store.lock:
            return self.store.create("jobs", job)

    def create_pod(self, namespace: str, body: Any, dry_run: bool = False) -> dict[str, Any]:
        pod = prepare_pod(body, namespace)
        self._default_priority(pod)
        if dry_run:
            return pod
        with self.store.lock:
            return self.store.create("pods", pod)

    def create_pod_internal(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """A controller's pod, from a validated template: defaulted, not validated again (body is taken)."""
        pod = prepare_owned_pod(body, namespace)
        self._default_priority(pod)
        with self.store.lock:
            return self.store.create("pods", pod)

    def create_secret(self, namespace: str, body: Any, dry_run: bool = False) -> dict[str, Any]:
        secret = prepare_secret(body, namespace)
        if dry_run:
            return secret
        with self.store.lock:
            return self.store.create("secrets", secret)

    def delete_secret(self, namespace: str, name: str, preconditions: dict[str, Any] | None = None) -> dict[str, Any]:
        with self.store.lock:
            secret = self.get(SECRETS, namespace, name)
            _check_preconditions(SECRETS, secret, preconditions)
            self.store.delete("secrets", namespace, name)
            return secret

    # -- delete ----------------------------------------------------------------------------------

    def delete_pod(
        self, namespace: str, name: str, grace: int | None = None, preconditions: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        with self.store.lock:
            pod = self.get(PODS, namespace, name)
            _check_preconditions(PODS, pod, preconditions)
            out = self.delete_pod_internal(namespace, name, grace)
            return out if out is not None else pod

    def delete_pod_internal(self, namespace: str, name: str, grace: int | None = None) -> dict[str, Any] | None:
        """Graceful deletion: the kubelet stops the processes, then the object is removed."""
        with self.store.lock:
            pod = self.store.get("pods", namespace, name)
            if pod is None:
                return None
            spec, meta = pod["spec"], pod["metadata"]
            if grace is None:
                grace = int(spec.get("terminationGracePeriodSeconds", 30))
            grace = max(0, int(grace))
            phase = (pod.get("status") or {}).get("phase", "Pending")
            node = spec.get("nodeName")
            if not self.kubelet.has_processes(meta["uid"]) and (
                not node or self.store.get("nodes", "", node) is None or phase in TERMINAL_POD_PHASES
            ):
                return self.store.delete("pods", namespace, name)
            current = meta.get("deletionGracePeriodSeconds")
            if meta.get("deletionTimestamp") and current is not None and int(current) <= grace:
                return pod

            def mark(p: dict[str, Any]) -> None:
                p["metadata"]["deletionTimestamp"] = rfc3339(time.time() + grace)
                p["metadata"]["deletionGracePeriodSeconds"] = grace

            out = self.store.update("pods", namespace, name, mark)
            self.wake()
            return out

    def delete_job(
        self,
        namespace: str,
        name: str,
        propagation: str | None = None,
        preconditions: dict[str, Any] | None = None,
        orphan_dependents: bool | None = None,
    ) -> tuple[dict[str, Any], builtins.list[str]]:
        warnings: builtins.list[str] = []
        if propagation is None:
            if orphan_dependents is not None:
                propagation = "Orphan" if orphan_dependents else "Background"
            else:
                propagation = "Orphan"  # the batch/v1 default, as on a real API server
                warnings.append(ORPHAN_WARNING)
        if propagation not in ("Orphan", "Background", "Foreground"):
            raise ApiError.invalid(JOBS, name, [("propagationPolicy", "FieldValueNotSupported",
                                    f'Unsupported value: "{propagation}": supported values: "Foreground", "Background", "Orphan"')])
        with self.store.lock:
            job = self.get(JOBS, namespace, name)
            _check_preconditions(JOBS, job, preconditions)
            return self.delete_job_internal(namespace, name, propagation), warnings

    def delete_job_internal(self, namespace: str, name: str, propagation: str) -> dict[str, Any]:
        with self.store.lock:
            job = self.store.get("jobs", namespace, name)
            if job is None:
                raise ApiError.not_found(JOBS, name)
            uid = job["metadata"]["uid"]
            owned = [
                p for p in self.store.list("pods", namespace)
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
            ]
            if propagation == "Foreground":
                def mark(j: dict[str, Any]) -> None:
                    m = j["metadata"]
                    m.setdefault("deletionTimestamp", rfc3339())
                    m.setdefault("deletionGracePeriodSeconds", 0)
                    fins = m.setdefault("finalizers", [])
                    if "foregroundDeletion" not in fins:
                        fins.append("foregroundDeletion")

                out = self.store.update("jobs", namespace, name, mark)
                self.wake()
                return out or job
            if propagation == "Orphan":
                for p in owned:
                    self.store.update("pods", namespace, p["metadata"]["name"], lambda o: _drop_owner(o, uid))
            self.store.delete("jobs", namespace, name)
            if propagation == "Background":
                for p in owned:
                    self.delete_pod_internal(namespace, p["metadata"]["name"])
            self.wake()
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "group": "batch", "kind": "jobs", "uid": uid},
            }

    # -- update ----------------------------------------------------------------------------------

    def patch(self, res: Resource, namespace: str, name: str, content_type: str, patch: Any, dry_run: bool = False) -> dict[str, Any]:
        with self.store.lock:
            cur = self.get(res, namespace, name)
            new = apply_patch(cur, content_type, patch)
            want_rv = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
            if want_rv and want_rv != cur["metadata"]["resourceVersion"]:
                raise ApiError.conflict(res, name, "the object has been modified; please apply your changes to the latest version and try again")
            return self._update(res, cur, new, dry_run)

    def replace(self, res: Resource, namespace: str, name: str, body: Any, dry_run: bool = False) -> dict[str, Any]:
        body = check_type_meta(copy.deepcopy(body), res, namespace if res.namespaced else None)
        if body["metadata"].get("name") not in (None, name):
            raise ApiError.bad_request(f"the name of the object ({body['metadata'].get('name')}) does not match the name on the URL ({name})")
        with self.store.lock:
            cur = self.get(res, namespace, name)
            want_rv = body["metadata"].get("resourceVersion")
            if want_rv and want_rv != cur["metadata"]["resourceVersion"]:
                raise ApiError.conflict(res, name, "the object has been modified; please apply your changes to the latest version and try again")
            return self._update(res, cur, body, dry_run)

    def _update(self, res: Resource, cur: dict[str, Any], new: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Validate and store the new version; with dry_run, validate and return it without storing."""
        name = cur["metadata"]["name"]
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError.bad_request("metadata must be an object")
        for k in ("name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if k in cur["metadata"]:
                meta[k] = cur["metadata"][k]
            else:
                meta.pop(k, None)
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        new["status"] = copy.deepcopy(cur.get("status") or {})
        causes: list[tuple[str, str, str]] = []
        _validate_labels(meta.get("labels"), "metadata.labels", causes)
        _validate_annotations(meta.get("annotations"), "metadata.annotations", causes)
        spec, old_spec = new.get("spec") or {}, cur.get("spec") or {}
        if res is JOBS:
            normalise_spec_quantities((spec.get("template") or {}).get("spec"))
        elif res is PODS:
            normalise_spec_quantities(spec)
        if res is JOBS:
            for k in ("template", "selector", "completionMode", "manualSelector", "completions"):
                if spec.get(k) != old_spec.get(k):
                    causes.append((f"spec.{k}", "FieldValueInvalid", "Invalid value: field is immutable"))
            for k, minimum in (("parallelism", 0), ("backoffLimit", 0), ("activeDeadlineSeconds", 1), ("ttlSecondsAfterFinished", 0)):
                v = spec.get(k)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < minimum):
                    causes.append((f"spec.{k}", "FieldValueInvalid", f"Invalid value: {v!r}: must be an integer >= {minimum}"))
            if not isinstance(spec.get("suspend", False), bool):
                causes.append(("spec.suspend", "FieldValueInvalid", "Invalid value: must be a boolean"))
            if spec != old_spec:
                meta["generation"] = int(cur["metadata"].get("generation", 1)) + 1
        elif res is PODS:
            mutable = ("activeDeadlineSeconds", "tolerations")

            def images_free(s: dict[str, Any]) -> dict[str, Any]:
                out = _strip(s, *mutable)
                for key in ("containers", "initContainers"):
                    if key in out:
                        out[key] = [_strip(c, "image") for c in out[key]]
                return out

            if images_free(spec) != images_free(old_spec):
                causes.append(("spec", "FieldValueForbidden",
                               "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                               "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                               "(only additions to existing tolerations)"))
        elif res is NODES:
            if _strip(spec, "taints", "unschedulable", "podCIDR", "podCIDRs") != _strip(old_spec, "taints", "unschedulable", "podCIDR", "podCIDRs"):
                causes.append(("spec", "FieldValueForbidden", "Forbidden: node updates may only change labels, annotations, taints and unschedulable"))
        if causes:
            raise ApiError.invalid(res, name, causes)
        if dry_run:
            new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            return new
        out = self.store.replace(res.plural, new)
        self.wake()
        return out


class _NoProcesses:
    """The process table of a cluster without a kubelet (until `LocalCluster` wires one in)."""

    def has_processes(self, uid: str) -> bool:
        return False

    def kill_node(self, node: str, timeout: float = 5.0) -> list[str]:
        return []

    def pod_pids(self, uid: str) -> dict[str, int]:
        return {}


def _drop_owner(o: dict[str, Any], uid: str) -> None:
    refs = [r for r in o["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
    if refs:
        o["metadata"]["ownerReferences"] = refs
    else:
        o["metadata"].pop("ownerReferences", None)
