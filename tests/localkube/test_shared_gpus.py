"""A whole-GPU Job stays off time-sliced GPUs on a real local cluster (issue 27, defect 3).

All real parts: the local cluster's Node objects through the official client and inventory's
snapshot builder, the router's decision and its placement, the dispatcher's Job, and the local
cluster's scheduler, which honours node affinity. The time-sliced L4 node is free, the whole L4
node is busy: without the sharing constraints the pod would land on a quarter of a GPU at once.
"""

from __future__ import annotations

import time
from typing import Any

from gpuorch.kube import make_clients
from gpuorch_dispatcher import core as dispatch
from gpuorch_inventory.core import build_snapshot
from gpuorch_inventory.service import list_cluster
from gpuorch_proto import ClusterRegistryEntry
from gpuorch_proto.storage import StoreConfig
from gpuorch_router.policy import route
from tests.support.builders import make_workload

from .helpers import LK, TIMEOUT, condition, job_body, job_pods, running_pid, wait_for

L4 = {"model": "NVIDIA-L4", "memory_mib": 23034}
TIME_SLICED = {
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.count": "4",
}
REGISTRY = ClusterRegistryEntry(artifact_stores=["scratch"])
ENV = dispatch.Environment(registry={"c1": REGISTRY}, stores={"scratch": StoreConfig(url="s3://bucket/scratch")})


def _pod_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    return dict(manifest["spec"]["template"]["spec"])


def test_a_whole_l4_waits_for_a_whole_l4_and_never_takes_a_time_sliced_one(lk: LK) -> None:
    h = lk(
        {
            "name": "c1",
            "nodes": [
                {"name": "sliced", "count": 1, "gpu": {**L4, "count": 16}, "labels": TIME_SLICED, "cpu": "16", "memory": "64Gi"},
                {"name": "whole", "count": 1, "gpu": {**L4, "count": 1}, "cpu": "16", "memory": "64Gi"},
            ],
        }
    )
    c = h.client("c1")
    # the whole L4 is busy
    blocker = job_body("blocker", ["sleep", "60"], gpus=1, pod_spec={"nodeSelector": {"kubernetes.io/hostname": "whole-0"}})
    c.batch.create_namespaced_job("default", blocker, _request_timeout=TIMEOUT)
    held = wait_for(lambda: job_pods(c, "blocker"), what="blocker pod")[0].metadata.name
    wait_for(lambda: running_pid(c, held), what="blocker running on whole-0")

    # inventory's view of the cluster, the router's decision, the dispatcher's Job
    nodes, pods = list_cluster(make_clients(h.kubeconfig)["c1"])
    now = time.time()
    snap = build_snapshot("c1", nodes, pods, REGISTRY, now=now, observed_at=now, time_scale=1.0)
    wl = make_workload(gpus=1, accelerators=["L4"], cpu="1", memory="1Gi")
    decision = route(wl, "w-1", {"c1": snap}, now)
    assert decision.outcome == "routed" and decision.placement is not None, decision.summary
    manifest = dispatch.build_job(
        wl, "w-1", "w-1-a1", 1, "c1", decision.queue, ENV,
        resume_from=None, placement=decision.placement,
    )
    # the Job's scheduling as the dispatcher wrote it (affinity, tolerations, GPU limits); a command
    # the local cluster can run
    spec = _pod_spec(manifest)
    main = spec["containers"][0]
    job = job_body(
        "whole-l4", ["sleep", "30"],
        container={"resources": main["resources"]},
        pod_spec={k: spec[k] for k in ("affinity", "tolerations", "nodeSelector") if k in spec},
    )
    c.batch.create_namespaced_job("default", job, _request_timeout=TIMEOUT)

    def unschedulable() -> Any:
        pods = job_pods(c, "whole-l4")
        cond = condition(pods[0], "PodScheduled") if pods else None
        return pods[0] if cond is not None and cond.status == "False" else None

    pod = wait_for(unschedulable, what="the whole-L4 pod refused by every node")
    h.clusters["c1"].reconcile()  # one more scheduling pass: still not on the time-sliced node
    pod = job_pods(c, "whole-l4")[0]
    assert pod.spec.node_name is None, pod.spec.node_name
    message = condition(pod, "PodScheduled").message
    assert "node affinity" in message and "Insufficient nvidia.com/gpu" in message, message

    c.batch.delete_namespaced_job("blocker", "default", propagation_policy="Background", _request_timeout=TIMEOUT)
    bound = wait_for(lambda: job_pods(c, "whole-l4")[0].spec.node_name, what="bound once the whole L4 is free")
    assert bound == "whole-0"
