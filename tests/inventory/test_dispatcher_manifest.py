"""The names the dispatcher writes are the names inventory reads (issue 10, item 5).

The dispatcher's real Job manifest is turned into the pods a Job controller would create and fed
through inventory's parser: the queue, the expected duration and the attempt come back as written.
(The queue used to be written as an annotation and read as a label, so gpuorch's own pending work
was counted under `default`.)
"""

from __future__ import annotations

import copy
from typing import Any

from gpuorch_dispatcher import core as dispatch
from gpuorch_inventory.core import build_snapshot
from gpuorch_proto import ClusterRegistryEntry, k8s
from gpuorch_proto.inventory import QueueRegistry
from gpuorch_proto.storage import StoreConfig
from tests.inventory.builders import T0, make_node
from tests.support.builders import make_workload

REGISTRY = ClusterRegistryEntry(artifact_stores=["scratch"], queues=[QueueRegistry(name="default"), QueueRegistry(name="training")])
ENV = dispatch.Environment(registry={"c": REGISTRY}, stores={"scratch": StoreConfig(url="s3://bucket/scratch")})


def pods_of(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """What a Job controller creates from the template: pending pods with the template's metadata."""
    tmpl = manifest["spec"]["template"]
    out = []
    for i in range(manifest["spec"]["parallelism"]):
        meta = copy.deepcopy(tmpl["metadata"])
        meta.update(name=f"{manifest['metadata']['name']}-{i}", namespace=manifest["metadata"]["namespace"], uid=f"uid-{i}")
        meta["labels"]["batch.kubernetes.io/job-name"] = manifest["metadata"]["name"]
        meta["creationTimestamp"] = "2027-01-15T08:00:00+00:00"
        out.append({"metadata": meta, "spec": copy.deepcopy(tmpl["spec"]), "status": {"phase": "Pending"}})
    return out


def test_gpuorch_pending_pods_count_under_the_queue_the_dispatcher_chose() -> None:
    wl = make_workload(gpus=4, workers=2, expected_runtime="2h")
    manifest = dispatch.build_job(wl, "w-1", k8s.attempt_id("w-1", 1), 1, "c", "training", ENV, resume_from=None)
    pods = pods_of(manifest)
    assert all(p["metadata"]["labels"][k8s.LABEL_QUEUE] == "training" for p in pods)
    snap = build_snapshot("c", [make_node("n0", gpus=8)], pods, REGISTRY, now=T0, observed_at=T0, time_scale=1.0)
    queues = {q.name: q for q in snap.queues}
    assert queues["training"].pending_gpus == 8 and queues["training"].pending_jobs == 1
    assert queues["default"].pending_gpus == 0


def test_attempt_ids_round_trip() -> None:
    assert k8s.parse_attempt_id(k8s.attempt_id("train-0123-a7", 12)) == ("train-0123-a7", 12)
    assert k8s.parse_attempt_id("no-attempt") is None
    assert k8s.parse_attempt_id("w-a0") is None
