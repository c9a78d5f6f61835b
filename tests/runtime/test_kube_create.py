"""`ClusterClient.create_job`: the dispatcher's create, the official client's request path
without a model of the body or the response, against a local cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import ApiException

from gpuorch.kube import ClusterClient, make_client
from gpuorch_localkube import LocalClusters
from tests.localkube.helpers import job_body, node_group

NS = "default"
TIMEOUT = (2, 10)


@pytest.fixture
def cc(tmp_path: Path) -> Iterator[ClusterClient]:
    lcs = LocalClusters(
        {"time_scale": 100, "clusters": [{"name": "c1", "nodes": [node_group()]}]}, tmp_path / "state"
    )
    lcs.start()
    try:
        yield make_client(lcs.write_kubeconfig(tmp_path / "kubeconfig"), "c1")
    finally:
        lcs.stop(grace=1.0)


def test_create_job_returns_the_servers_object_and_refusals_raise_as_the_client_does(
    cc: ClusterClient,
) -> None:
    raw = cc.create_job(NS, job_body("one", ["true"], suspend=True), TIMEOUT)
    created = json.loads(raw)
    stored = cc.batch.read_namespaced_job("one", NS, _request_timeout=TIMEOUT)
    assert created["metadata"]["uid"] == stored.metadata.uid
    assert (
        0 < int(created["metadata"]["resourceVersion"]) <= int(stored.metadata.resource_version)
    )  # its controllers may write after
    assert cc.calls_now()[("create", "jobs")] == 1, "counted like any call of the client"
    with pytest.raises(ApiException) as again:
        cc.create_job(NS, job_body("one", ["true"], suspend=True), TIMEOUT)
    assert again.value.status == 409 and "already exists" in (again.value.body or "")
    bad = job_body("two", ["true"], suspend=True)
    del bad["spec"]["template"]["spec"]["containers"]
    with pytest.raises(ApiException) as refused:
        cc.create_job(NS, bad, TIMEOUT)
    assert refused.value.status == 422 and "containers" in (refused.value.body or ""), refused.value.body
