"""Secrets in the local clusters: made through the official client, read by the kubelet into the
pod process's environment (``valueFrom.secretKeyRef``), never into the pod object (issue 11)."""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from .helpers import LK, node_group, wait_for

NS = "default"


def core(lk: LK) -> Any:
    return lk({"name": "c1", "nodes": [node_group("cpu", count=1, gpus=0)]}).client("c1").core


def _pod(name: str, key: str = "token", optional: bool | None = None) -> k8s.V1Pod:
    ref = k8s.V1SecretKeySelector(name="wandb-key", key=key, optional=optional)
    script = "import os, sys; print('SEEN=' + os.environ.get('WANDB_API_KEY', '<unset>')); sys.stdout.flush()"
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(restart_policy="Never", containers=[k8s.V1Container(
            name="main", image="python", command=[sys.executable, "-c", script],
            env=[k8s.V1EnvVar(name="WANDB_API_KEY", value_from=k8s.V1EnvVarSource(secret_key_ref=ref))],
        )]),
    )  # fmt: skip


def test_a_pod_process_sees_the_secret_value_the_pod_object_only_the_reference(lk: LK) -> None:
    kube_core = core(lk)
    value = "s3cr3t-" + "9f" * 8
    made = kube_core.create_namespaced_secret(NS, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="wandb-key"), string_data={"token": value}))
    assert made.data == {"token": base64.b64encode(value.encode()).decode()} and made.type == "Opaque"
    assert kube_core.read_namespaced_secret("wandb-key", NS).data["token"] == made.data["token"]
    assert [s.metadata.name for s in kube_core.list_namespaced_secret(NS).items] == ["wandb-key"]
    kube_core.create_namespaced_pod(NS, _pod("reader"))
    wait_for(lambda: kube_core.read_namespaced_pod("reader", NS).status.phase == "Succeeded", timeout=30)
    assert f"SEEN={value}" in kube_core.read_namespaced_pod_log("reader", NS)
    raw = kube_core.read_namespaced_pod("reader", NS, _preload_content=False).data.decode()
    assert value not in raw and "secretKeyRef" in raw  # the object holds the reference, never the value
    # a key the Secret does not have: the container cannot start, with the kubelet's reason
    kube_core.create_namespaced_pod(NS, _pod("missing-key", key="nope"))

    def config_error() -> str:
        st = kube_core.read_namespaced_pod("missing-key", NS).status.container_statuses or []
        w = st[0].state.waiting if st and st[0].state else None
        return f"{w.reason}: {w.message}" if w else ""

    wait_for(lambda: config_error().startswith("CreateContainerConfigError"), timeout=30)
    assert "couldn't find key nope in Secret default/wandb-key" in config_error()
    kube_core.delete_namespaced_secret("wandb-key", NS)
    with pytest.raises(ApiException) as err:
        kube_core.read_namespaced_secret("wandb-key", NS)
    assert err.value.status == 404


def test_a_secret_with_bad_data_is_refused_with_the_field(lk: LK) -> None:
    kube_core = core(lk)
    with pytest.raises(ApiException) as err:
        kube_core.create_namespaced_secret(NS, {"metadata": {"name": "bad"}, "data": {"token": "not base64!"}})
    assert err.value.status == 422
    causes = json.loads(err.value.body)["details"]["causes"]
    assert causes[0]["field"] == "data[token]" and "base64" in causes[0]["message"]
