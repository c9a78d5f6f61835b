"""API-server semantics seen through the official client: versions, errors, selectors, watches."""

from __future__ import annotations

import functools
import json
from typing import Any

import kubernetes_validate
import pytest
from kubernetes.client.exceptions import ApiException

from .helpers import (
    GPU,
    LK,
    TIMEOUT,
    job_body,
    job_finished,
    job_pods,
    new_watch,
    node_group,
    raw_call,
    reason_of,
    wait_for,
)


def test_version_nodes_and_gfd_labels(lk: LK) -> None:
    h = lk({
        "name": "c1",
        "nodes": [
            node_group("big", count=2, gpus=8, pool="train", labels={"zone": "a"}),
            {"name": "cpu", "count": 1, "cpu": "8", "memory": "32Gi",
             "taints": [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]},
        ],
    })
    c = h.client("c1")
    import kubernetes

    v = kubernetes.client.VersionApi(c.api).get_code(_request_timeout=TIMEOUT)
    assert (v.major, v.minor) == ("1", "37") and v.git_version.startswith("v1.37")
    assert all(isinstance(getattr(v, f), str) and getattr(v, f) for f in
               ("git_commit", "git_tree_state", "build_date", "go_version", "compiler", "platform"))
    nodes = c.core.list_node(_request_timeout=TIMEOUT)
    assert isinstance(nodes.metadata.resource_version, str)
    assert [n.metadata.name for n in nodes.items] == ["big-0", "big-1", "cpu-0"]
    big = nodes.items[0]
    assert big.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert big.metadata.labels["nvidia.com/gpu.memory"] == "81920"
    assert big.metadata.labels["nvidia.com/gpu.count"] == "8"
    assert big.metadata.labels["gpuorch.io/pool"] == "train" and big.metadata.labels["zone"] == "a"
    assert big.status.allocatable == {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "8"}
    assert big.status.capacity[GPU] == "8"
    assert any(cond.type == "Ready" and cond.status == "True" for cond in big.status.conditions)
    cpu = c.core.read_node("cpu-0", _request_timeout=TIMEOUT)
    assert GPU not in cpu.status.allocatable
    assert [(t.key, t.value, t.effect) for t in cpu.spec.taints] == [("dedicated", "infer", "NoSchedule")]
    one = c.core.list_node(label_selector="gpuorch.io/pool=train,zone in (a, b),!nope", _request_timeout=TIMEOUT)
    assert len(one.items) == 2
    with pytest.raises(ApiException) as e:
        c.core.read_node("nope", _request_timeout=TIMEOUT)
    assert e.value.status == 404 and reason_of(e.value) == "NotFound"


def test_errors_are_status_objects(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    body = job_body("dup", ["sleep", "30"], suspend=True)
    c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    with pytest.raises(ApiException) as e:
        c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    assert e.value.status == 409 and reason_of(e.value) == "AlreadyExists"
    status = json.loads(str(e.value.body))
    assert status["kind"] == "Status" and status["code"] == 409 and 'jobs.batch "dup" already exists' in status["message"]
    # the same name in another (implicit) namespace is fine
    c.batch.create_namespaced_job("team-a", body, _request_timeout=TIMEOUT)

    with pytest.raises(ApiException) as e:
        c.batch.read_namespaced_job("missing", "default", _request_timeout=TIMEOUT)
    assert e.value.status == 404 and reason_of(e.value) == "NotFound"
    with pytest.raises(ApiException) as e:
        c.core.read_namespaced_pod("missing", "default", _request_timeout=TIMEOUT)
    assert e.value.status == 404

    invalid = {
        "no containers": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "bad"},
                          "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": []}}}},
        "no name": job_body("", ["true"]),
        "container without name": job_body("bad", ["true"], container={"name": ""}),
        "bad container name": job_body("bad", ["true"], container={"name": "Not_A_DNS_Label"}),
        "restartPolicy Always": job_body("bad", ["true"], restart="Always"),
        "fractional gpu": job_body("bad", ["true"], container={"resources": {"limits": {GPU: "0.5"}}}),
        "fractional gpu (milli)": job_body("bad", ["true"], container={"resources": {"limits": {GPU: "500m"}}}),
        "gpu requests != limits": job_body("bad", ["true"], container={"resources": {"limits": {GPU: "2"}, "requests": {GPU: "1"}}}),
        "gpu requests without limits": job_body("bad", ["true"], container={"resources": {"requests": {GPU: "1"}}}),
        "indexed without completions": job_body("bad", ["true"], indexed=True),
    }
    for what, bad in invalid.items():
        with pytest.raises(ApiException) as e:
            c.batch.create_namespaced_job("default", bad, _request_timeout=TIMEOUT)
        assert e.value.status == 422, what
        st = json.loads(str(e.value.body))
        assert st["reason"] == "Invalid" and st["details"]["causes"], what
    # what the typed client refuses to send, the server refuses too
    for what, bad in {
        "no template": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "bad"}, "spec": {}},
        "container without a name": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "bad"}, "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"image": "x", "command": ["true"]}]}}}},
    }.items():
        with pytest.raises(ApiException) as e:
            raw_call(c, "POST", "/apis/batch/v1/namespaces/default/jobs", bad)
        assert e.value.status == 422 and reason_of(e.value) == "Invalid", what
    with pytest.raises(ApiException) as e:
        c.batch.create_namespaced_job("default", job_body("bad", ["true"], gpus=0, container={"resources": {"limits": {GPU: "0.5"}}}),
                                      _request_timeout=TIMEOUT)
    assert "must be an integer" in json.loads(str(e.value.body))["message"]
    assert not [j for j in c.batch.list_namespaced_job("default", _request_timeout=TIMEOUT).items if j.metadata.name == "bad"]


def test_update_conflicts_and_immutable_fields(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    job = c.batch.create_namespaced_job("default", job_body("upd", ["sleep", "30"], suspend=True), _request_timeout=TIMEOUT)
    stale = job.metadata.resource_version
    c.batch.patch_namespaced_job("upd", "default", {"metadata": {"labels": {"team": "a"}}}, _request_timeout=TIMEOUT)
    job.metadata.resource_version = stale
    with pytest.raises(ApiException) as e:
        c.batch.replace_namespaced_job("upd", "default", job, _request_timeout=TIMEOUT)
    assert e.value.status == 409 and reason_of(e.value) == "Conflict"
    with pytest.raises(ApiException) as e:
        c.batch.patch_namespaced_job("upd", "default", {"spec": {"completionMode": "Indexed"}}, _request_timeout=TIMEOUT)
    assert e.value.status == 422
    got = c.batch.read_namespaced_job("upd", "default", _request_timeout=TIMEOUT)
    assert got.metadata.labels["team"] == "a" and int(got.metadata.resource_version) > int(stale)


def test_pod_lists_cluster_wide_selectors_and_field_selectors(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    for ns, name, team in (("ns-a", "a1", "x"), ("ns-b", "b1", "y"), ("ns-b", "b2", "x")):
        body = job_body(name, ["true"])
        body["spec"]["template"]["metadata"] = {"labels": {"team": team}}
        c.batch.create_namespaced_job(ns, body, _request_timeout=TIMEOUT)
    for ns, name in (("ns-a", "a1"), ("ns-b", "b1"), ("ns-b", "b2")):
        wait_for(functools.partial(job_finished, c, name, namespace=ns), timeout=15)
    every = c.core.list_pod_for_all_namespaces(_request_timeout=TIMEOUT).items
    assert sorted(p.metadata.namespace for p in every) == ["ns-a", "ns-b", "ns-b"]
    assert len(c.batch.list_job_for_all_namespaces(_request_timeout=TIMEOUT).items) == 3
    sel = c.core.list_pod_for_all_namespaces(label_selector="team=x", _request_timeout=TIMEOUT).items
    assert sorted(p.metadata.labels["job-name"] for p in sel) == ["a1", "b2"]
    assert len(c.core.list_pod_for_all_namespaces(label_selector="team!=x", _request_timeout=TIMEOUT).items) == 1
    assert len(c.core.list_pod_for_all_namespaces(label_selector="team notin (x),team", _request_timeout=TIMEOUT).items) == 1
    assert len(c.core.list_pod_for_all_namespaces(label_selector="!team", _request_timeout=TIMEOUT).items) == 0
    assert len(c.core.list_namespaced_pod("ns-b", label_selector="team==x", _request_timeout=TIMEOUT).items) == 1
    assert len(c.core.list_pod_for_all_namespaces(field_selector="status.phase=Succeeded", _request_timeout=TIMEOUT).items) == 3
    node = every[0].spec.node_name
    on_node = c.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", _request_timeout=TIMEOUT).items
    assert on_node and all(p.spec.node_name == node for p in on_node)
    page = c.core.list_pod_for_all_namespaces(limit=2, _request_timeout=TIMEOUT)
    rest = c.core.list_pod_for_all_namespaces(limit=2, _continue=page.metadata._continue, _request_timeout=TIMEOUT)
    assert len(page.items) == 2 and len(rest.items) == 1 and rest.metadata._continue is None
    with pytest.raises(ApiException) as e:
        c.core.list_pod_for_all_namespaces(label_selector="a in (b", _request_timeout=TIMEOUT)
    assert e.value.status == 400
    names = [n.metadata.name for n in c.core.list_namespace(_request_timeout=TIMEOUT).items]
    assert {"default", "ns-a", "ns-b"} <= set(names)


def test_watch_resumes_from_a_resource_version_and_too_old_is_410(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()], "watch_history": 40})
    c = h.client("c1")
    rv0 = c.batch.list_namespaced_job("default", _request_timeout=TIMEOUT).metadata.resource_version
    for i in range(2):
        c.batch.create_namespaced_job("default", job_body(f"w{i}", ["true"], suspend=True), _request_timeout=TIMEOUT)
    seen = []
    for ev in new_watch().stream(c.batch.list_namespaced_job, "default", resource_version=rv0, timeout_seconds=1,
                                   _request_timeout=(2, 10)):
        seen.append((ev["type"], ev["object"].metadata.name))
    assert seen[0] == ("ADDED", "w0")
    assert [n for t, n in seen if t == "ADDED"] == ["w0", "w1"]
    assert {t for t, _ in seen} == {"ADDED", "MODIFIED"}  # and status updates (Suspended)
    assert seen.index(("ADDED", "w1")) < seen.index(("MODIFIED", "w1"))

    # resourceVersion unset: ADDED for everything that exists, then only new events
    events = []
    w = new_watch()
    for ev in w.stream(c.batch.list_namespaced_job, "default", timeout_seconds=5, _request_timeout=(2, 10)):
        events.append((ev["type"], ev["object"].metadata.name))
        if len(events) == 2:
            c.batch.delete_namespaced_job("w0", "default", propagation_policy="Background", _request_timeout=TIMEOUT)
        if ev["type"] == "DELETED":
            w.stop()
    assert events == [("ADDED", "w0"), ("ADDED", "w1"), ("DELETED", "w0")]

    # push the history window past rv0 (each suspended job is ~2 events)
    for i in range(30):
        c.batch.create_namespaced_job("default", job_body(f"fill{i}", ["true"], suspend=True), _request_timeout=TIMEOUT)
    wait_for(lambda: int(c.batch.list_namespaced_job("default", _request_timeout=TIMEOUT).metadata.resource_version) > int(rv0) + 45)
    with pytest.raises(ApiException) as e:
        for _ in new_watch().stream(c.batch.list_namespaced_job, "default", resource_version=rv0, timeout_seconds=2,
                                      _request_timeout=(2, 10)):
            pass
    assert e.value.status == 410


def test_watch_with_label_selector_sees_objects_enter_and_leave(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    rv = c.batch.list_namespaced_job("default", _request_timeout=TIMEOUT).metadata.resource_version
    c.batch.create_namespaced_job("default", job_body("sel", ["true"], suspend=True), _request_timeout=TIMEOUT)
    c.batch.patch_namespaced_job("sel", "default", {"metadata": {"labels": {"watched": "yes"}}}, _request_timeout=TIMEOUT)
    c.batch.patch_namespaced_job("sel", "default", {"metadata": {"labels": {"watched": None}}}, _request_timeout=TIMEOUT)
    seen = [ev["type"] for ev in new_watch().stream(
        c.batch.list_namespaced_job, "default", label_selector="watched=yes", resource_version=rv, timeout_seconds=1,
        _request_timeout=(2, 10))]
    assert seen == ["ADDED", "DELETED"]


def test_watch_ends_at_timeout_seconds(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    import time

    t0 = time.monotonic()
    events = list(new_watch().stream(c.core.list_node, timeout_seconds=1, _request_timeout=(2, 10)))
    elapsed = time.monotonic() - t0
    assert [e["type"] for e in events] == ["ADDED", "ADDED"]
    assert 0.9 <= elapsed < 3


def test_a_watch_that_asks_for_bookmarks_ends_with_one_at_how_far_it_has_seen(lk: LK) -> None:
    """A quiet selector's next watch resumes from the bookmark, not from its last matching object."""
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    rv = c.batch.list_namespaced_job("default", label_selector="watched=yes", _request_timeout=TIMEOUT).metadata.resource_version
    c.batch.create_namespaced_job("default", job_body("other", ["true"], suspend=True), _request_timeout=TIMEOUT)
    wait_for(lambda: int(c.batch.list_namespaced_job("default", _request_timeout=TIMEOUT).metadata.resource_version) > int(rv) + 1)
    after = int(c.batch.list_namespaced_job("default", _request_timeout=TIMEOUT).metadata.resource_version)
    events = list(new_watch().stream(
        c.batch.list_namespaced_job, "default", label_selector="watched=yes", resource_version=rv, timeout_seconds=1,
        allow_watch_bookmarks=True, _request_timeout=(2, 10)))
    assert [e["type"] for e in events] == ["BOOKMARK"]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) >= after  # the client keeps a bookmark raw
    plain = list(new_watch().stream(
        c.batch.list_namespaced_job, "default", label_selector="watched=yes", resource_version=rv, timeout_seconds=1,
        _request_timeout=(2, 10)))
    assert plain == []  # none unless asked for


def test_served_objects_validate_against_the_kubernetes_schema(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group(pool="train", taints=[{"key": "a", "value": "b", "effect": "NoSchedule"}])]})
    c = h.client("c1")
    body = job_body("valid", ["sh", "-c", "echo ok"], gpus=1, indexed=True, completions=1,
                    pod_spec={"tolerations": [{"key": "a", "operator": "Exists"}]})
    c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    wait_for(lambda: job_finished(c, "valid"), timeout=15)
    pod = job_pods(c, "valid")[0]

    def raw(resp: Any) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(resp.data)
        return out

    objs = [
        raw(c.batch.read_namespaced_job("valid", "default", _preload_content=False, _request_timeout=TIMEOUT)),
        raw(c.core.read_namespaced_pod(pod.metadata.name, "default", _preload_content=False, _request_timeout=TIMEOUT)),
        raw(c.core.read_node(pod.spec.node_name, _preload_content=False, _request_timeout=TIMEOUT)),
    ]
    for obj in objs:
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
