"""Other tenants' load: real batch/v1 Jobs the cluster keeps submitting so a queue builds up."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuorch_proto.kubesem import job_finished

from .config import BackgroundLoad
from .errors import ApiError
from .objects import GPU

if TYPE_CHECKING:
    from .api import ClusterAPI
    from .store import Event

__all__ = ["BACKGROUND_LABEL", "EXPECTED_DURATION_ANNOTATION", "BackgroundLoadManager"]

log = logging.getLogger("gpuorch_localkube.background")
BACKGROUND_LABEL = "gpuorch.io/background"
EXPECTED_DURATION_ANNOTATION = "gpuorch.io/expected-duration-seconds"


class BackgroundLoadManager:
    def __init__(self, core: ClusterAPI):
        self.core = core
        self.loads: list[BackgroundLoad] = list(core.config.background)
        self.dirty = True

    def observe(self, event: Event) -> None:
        """Only background Jobs and their pods change what this controller does."""
        if event.resource in ("jobs", "pods") and any(
            BACKGROUND_LABEL in (o["metadata"].get("labels") or {}) for o in (event.obj, event.prev) if o is not None
        ):
            self.dirty = True

    def resync(self) -> None:
        self.dirty = True

    def set_loads(self, loads: Sequence[BackgroundLoad]) -> None:
        with self.core.store.lock:
            self.loads = list(loads)
            self.dirty = True
        self.core.wake()

    def job_body(self, load: BackgroundLoad) -> dict[str, Any]:
        real = max(0.001, self.core.config.to_seconds(load.duration))
        ann = {EXPECTED_DURATION_ANNOTATION: f"{load.duration:g}"}
        labels = {BACKGROUND_LABEL: load.name, "app.kubernetes.io/managed-by": "localkube"}
        resources: dict[str, Any] = {"limits": {GPU: str(load.gpus_per_job)}} if load.gpus_per_job else {}
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"generateName": f"bg-{load.name}-", "namespace": load.namespace, "labels": labels, "annotations": ann},
            "spec": {
                "parallelism": 1,
                "completions": 1,
                "backoffLimit": 0,
                "ttlSecondsAfterFinished": 0,
                "template": {
                    "metadata": {"labels": dict(labels), "annotations": dict(ann)},
                    "spec": {
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 1,
                        "priority": load.priority,
                        "nodeSelector": dict(load.node_selector),
                        "tolerations": [dict(t) for t in load.tolerations],
                        "containers": [{
                            "name": "load",
                            "image": "localkube/sleep",
                            "command": ["sleep", f"{real:.3f}"],
                            "resources": resources,
                        }],
                    },
                },
            },
        }

    def sync(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        store = self.core.store
        jobs = [j for j in store.values("jobs") if BACKGROUND_LABEL in (j["metadata"].get("labels") or {})]
        running_owners = {
            j["metadata"]["uid"] for j in jobs if any(p["spec"].get("nodeName") for p in store.pods_of_owner(j["metadata"]["uid"]))
        }
        wanted = {(b.namespace, b.name): b for b in self.loads}
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for j in jobs:
            if j["metadata"].get("deletionTimestamp") or job_finished(j):
                continue
            key = (j["metadata"]["namespace"], j["metadata"]["labels"][BACKGROUND_LABEL])
            groups.setdefault(key, []).append(j)
        for key, load in wanted.items():
            have = groups.get(key, [])
            for _ in range(load.jobs - len(have)):
                try:
                    self.core.create_job(load.namespace, self.job_body(load))
                except ApiError as e:  # pragma: no cover - a configuration problem
                    log.error("background load %s: %s", load.name, e.message)
                    break
        for key, have in groups.items():
            keep = wanted[key].jobs if key in wanted else 0
            excess = len(have) - keep
            if excess <= 0:
                continue
            waiting = [j for j in have if j["metadata"]["uid"] not in running_owners]
            waiting.sort(key=store.creation_seq, reverse=True)
            for j in waiting[:excess]:
                self.core.delete_job_internal(j["metadata"]["namespace"], j["metadata"]["name"], "Background")
