"""The informer (gpuorch.informer) against a real local cluster, through the official client.

List once, watch from the list's resourceVersion, re-list on 410 Gone and miss nothing; tell a
partitioned cluster (calls fail) from a quiet one (its watch is open and ends cleanly); and the
API calls it makes do not grow with the number of objects it follows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuorch.informer import ClusterInformers, Informer, RawWatch
from gpuorch.kube import ClusterClient, make_client, request_kind
from gpuorch_localkube import LocalClusters
from gpuorch_proto import k8s
from tests.localkube.helpers import job_body, node_group
from tests.support.wait import assert_eventually

NS = "default"
TIMEOUT = (2, 10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalClusters, ClusterClient]]:
    """One local cluster with a short watch history (so that compaction is easy to force)."""
    cfg = {"time_scale": 100, "clusters": [{"name": "c1", "nodes": [node_group()], "watch_history": 40}]}
    lcs = LocalClusters(cfg, tmp_path / "state")
    lcs.start()
    try:
        yield lcs, make_client(lcs.write_kubeconfig(tmp_path / "kubeconfig"), "c1")
    finally:
        lcs.stop(grace=1.0)


def managed(name: str) -> dict[str, Any]:
    body = job_body(name, ["true"], suspend=True)
    body["metadata"]["labels"] = {k8s.LABEL_MANAGED: "true"}
    return body


def names(objs: list[dict[str, Any]]) -> set[str]:
    return {o["metadata"]["name"] for o in objs}


def fresh_list(cc: ClusterClient) -> dict[str, str]:
    """name -> resourceVersion of the managed Jobs, as a new list says now."""
    items = cc.batch.list_namespaced_job(NS, label_selector=k8s.MANAGED_SELECTOR, _request_timeout=TIMEOUT).items
    return {j.metadata.name: j.metadata.resource_version for j in items}


def cached(inf: Informer) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in inf.items()}


def jobs_informer(cc: ClusterClient, group: ClusterInformers | None = None, watch_seconds: int = 2) -> Informer:
    kw: dict[str, Any] = {"namespace": NS, "label_selector": k8s.MANAGED_SELECTOR, "watch_seconds": watch_seconds}
    if group is not None:
        return group.add("jobs", cc.batch.list_namespaced_job, **kw)
    return Informer(cc.name, cc.batch.list_namespaced_job, **kw)


def test_request_kinds_of_the_calls_counted() -> None:
    assert request_kind("GET", "https://h/apis/batch/v1/namespaces/gpuorch/jobs?labelSelector=a") == ("list", "jobs")
    assert request_kind("GET", "https://h/apis/batch/v1/namespaces/gpuorch/jobs?watch=True&resourceVersion=3") == ("watch", "jobs")
    assert request_kind("GET", "https://h/api/v1/pods?watch=true") == ("watch", "pods")
    assert request_kind("GET", "https://h/api/v1/namespaces/x/pods/p1") == ("get", "pods")
    assert request_kind("POST", "https://h/apis/batch/v1/namespaces/gpuorch/jobs") == ("create", "jobs")
    assert request_kind("DELETE", "https://h/apis/batch/v1/namespaces/gpuorch/jobs/j") == ("delete", "jobs")
    assert request_kind("GET", "https://h/api/v1/nodes") == ("list", "nodes")
    assert request_kind("GET", "https://h/version/") == ("get", "version")  # the liveness probe


def test_a_watch_event_is_decoded_once_into_plain_dicts() -> None:
    w = RawWatch()
    line = '{"type":"MODIFIED","object":{"kind":"Job","metadata":{"name":"a","resourceVersion":"7","labels":{"x":"1"}}}}'
    event = w.unmarshal_event(line, None)
    assert event is not None and event["type"] == "MODIFIED"
    assert event["raw_object"] is event["object"], "no model: the object is the server's JSON"
    assert event["object"] == {"kind": "Job", "metadata": {"name": "a", "resourceVersion": "7", "labels": {"x": "1"}}}
    gone = w.unmarshal_event('{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old"}}', None)
    assert gone is not None and gone["raw_object"]["code"] == 410, "what Watch.stream reads to raise ApiException(410)"
    assert w.unmarshal_event("", None) is None and w.unmarshal_event("not json", None) is None
    assert w.get_return_type(object()) is None


async def test_the_cache_follows_creates_updates_and_deletes_with_one_list(cluster: tuple[LocalClusters, ClusterClient]) -> None:
    _, cc = cluster
    cc.batch.create_namespaced_job(NS, managed("before"), _request_timeout=TIMEOUT)
    cc.batch.create_namespaced_job(NS, job_body("unlabelled", ["true"], suspend=True), _request_timeout=TIMEOUT)
    inf = jobs_informer(cc).start()
    try:
        await assert_eventually(lambda: inf.synced.is_set(), timeout=10)
        assert names(inf.items()) == {"before"}, "the label selector keeps gpuorch's objects only"
        for i in range(5):
            cc.batch.create_namespaced_job(NS, managed(f"j{i}"), _request_timeout=TIMEOUT)
        cc.batch.patch_namespaced_job("j1", NS, {"metadata": {"annotations": {"seen": "yes"}}}, _request_timeout=TIMEOUT)
        cc.batch.delete_namespaced_job("j2", NS, propagation_policy="Background", _request_timeout=TIMEOUT)

        def same() -> bool:
            assert cached(inf) == fresh_list(cc)
            return True

        await assert_eventually(same, timeout=10)
        assert (inf.get("j1") or {}).get("metadata", {}).get("annotations", {}).get("seen") == "yes"
        assert inf.lists == 1 and inf.gone == 0, "one list, then only watches"
        # a watch that ends at timeout_seconds is opened again from where it stopped, not re-listed
        watches, complete = inf.watches, inf.complete_at
        assert complete is not None, "complete since the list"
        await assert_eventually(lambda: inf.watches >= watches + 2, timeout=15)
        assert inf.lists == 1
        assert (inf.complete_at or 0) > complete, "each clean end of a watch: complete again, later"
    finally:
        inf.stop()


async def test_a_watch_that_gets_410_gone_relists_and_misses_nothing(cluster: tuple[LocalClusters, ClusterClient]) -> None:
    _, cc = cluster
    for i in range(3):
        cc.batch.create_namespaced_job(NS, managed(f"old{i}"), _request_timeout=TIMEOUT)
    inf = jobs_informer(cc).start()
    await assert_eventually(lambda: cached(inf) == fresh_list(cc) and len(cached(inf)) == 3, timeout=10)
    inf.stop()  # a long disconnection: meanwhile the cluster moves on and compacts its history
    stale = inf.resource_version
    assert stale is not None
    cc.batch.delete_namespaced_job("old0", NS, propagation_policy="Background", _request_timeout=TIMEOUT)
    cc.batch.patch_namespaced_job("old1", NS, {"metadata": {"annotations": {"v": "2"}}}, _request_timeout=TIMEOUT)
    for i in range(30):  # each suspended Job is about two events: the 40-event history moves past `stale`
        cc.batch.create_namespaced_job(NS, managed(f"new{i}"), _request_timeout=TIMEOUT)
    for i in range(0, 30, 3):
        cc.batch.delete_namespaced_job(f"new{i}", NS, propagation_policy="Background", _request_timeout=TIMEOUT)
    assert "old0" in cached(inf), "the cache is stale while the informer is stopped"

    inf.start()  # resumes from `stale`: the cluster answers 410 Gone (an ERROR event with code 410)
    try:
        await assert_eventually(lambda: inf.gone >= 1, timeout=10, message="the watch from a compacted resourceVersion got 410")

        def same() -> bool:
            assert cached(inf) == fresh_list(cc)
            return True

        await assert_eventually(same, timeout=10)
        assert inf.lists == 2, "exactly one re-list after the 410"
        assert "old0" not in cached(inf) and "new0" not in cached(inf) and "new1" in cached(inf)
        assert (inf.get("old1") or {})["metadata"]["annotations"]["v"] == "2"
        # and it keeps following after the re-list
        cc.batch.create_namespaced_job(NS, managed("after"), _request_timeout=TIMEOUT)
        await assert_eventually(lambda: "after" in cached(inf), timeout=10)
    finally:
        inf.stop()


async def test_changes_since_a_generation_and_the_label_index(cluster: tuple[LocalClusters, ClusterClient]) -> None:
    """What changed since a reader last looked (each add, update, delete once, in order), or
    "everything" after a re-list; and the objects by a label's value through every change."""
    _, cc = cluster

    def labelled(name: str, group: str) -> dict[str, Any]:
        body = managed(name)
        body["metadata"]["labels"]["group"] = group
        return body

    cc.batch.create_namespaced_job(NS, labelled("a", "g1"), _request_timeout=TIMEOUT)
    inf = Informer(cc.name, cc.batch.list_namespaced_job, namespace=NS, label_selector=k8s.MANAGED_SELECTOR, watch_seconds=2, index="group").start()
    try:
        await assert_eventually(lambda: inf.synced.is_set(), timeout=10)
        assert inf.changes_since(0)[1] is None, "before the list: not known one by one"
        gen, changes = inf.changes_since(inf.generation)
        assert changes == [] and names(inf.by_index("g1")) == {"a"}
        cc.batch.create_namespaced_job(NS, labelled("b", "g1"), _request_timeout=TIMEOUT)
        cc.batch.patch_namespaced_job("a", NS, {"metadata": {"labels": {"group": "g2"}}}, _request_timeout=TIMEOUT)
        cc.batch.delete_namespaced_job("b", NS, propagation_policy="Background", _request_timeout=TIMEOUT)
        await assert_eventually(lambda: "b" not in cached(inf) and names(inf.by_index("g2")) == {"a"}, timeout=10)
        now, changes = inf.changes_since(gen)
        assert changes is not None and now > gen
        seen = [(c.key[1], c.labels.get("group")) for c in changes]
        assert ("b", "g1") in seen and ("a", "g2") in seen, seen
        assert seen.index(("b", "g1")) < seen.index(("a", "g2")), "oldest first"
        assert inf.by_index("g1") == [], "moved and deleted objects leave the old value"
        assert inf.changes_since(now) == (now, [])
        inf.stop()
        for i in range(30):  # compact the 40-event history past the informer's resourceVersion
            cc.batch.create_namespaced_job(NS, labelled(f"n{i}", "g3"), _request_timeout=TIMEOUT)
        inf.start()
        await assert_eventually(lambda: inf.lists == 2 and len(inf.by_index("g3")) == 30, timeout=15)
        assert inf.changes_since(now)[1] is None, "a re-list: the reader looks at everything"
        assert names(inf.by_index("g2")) == {"a"}
    finally:
        inf.stop()


async def test_a_partitioned_cluster_is_reported_unreachable_and_a_quiet_one_is_not(
    cluster: tuple[LocalClusters, ClusterClient],
) -> None:
    lcs, cc = cluster
    group = ClusterInformers("c1")
    jobs_informer(cc, group, watch_seconds=1)
    group.add("nodes", cc.core.list_node, watch_seconds=1)
    group.start()
    try:
        await assert_eventually(lambda: group.synced, timeout=10)
        assert group.contacts()[-1][0] is True
        # quiet: nothing changes for several watch periods; the watches end cleanly and say so
        first = group.last_ok
        assert first is not None
        await assert_eventually(lambda: (group.last_ok or 0) >= first + 2.0, timeout=10)
        facts = group.contacts()
        assert facts and all(answered for answered, _, _ in facts), facts
        assert not group.failing

        lcs["c1"].partition()
        await assert_eventually(lambda: group.failing, timeout=10, message="a partitioned cluster's calls fail")
        assert group.error.startswith("unreachable:"), group.error
        facts = group.contacts()
        assert facts[-1][0] is False, facts
        assert facts.count((False, facts[-1][1], facts[-1][2])) == 1, "a run of failures: its first and latest"

        lcs["c1"].heal()
        await assert_eventually(lambda: not group.failing, timeout=15, message="answers again after heal")
        cc.batch.create_namespaced_job(NS, managed("healed"), _request_timeout=TIMEOUT)
        await assert_eventually(lambda: "healed" in cached(group["jobs"]), timeout=10)
        assert group.contacts()[-1][0] is True
    finally:
        group.stop()


async def test_a_watch_reopened_after_a_heal_is_contact_at_once_not_when_it_ends(
    cluster: tuple[LocalClusters, ClusterClient],
) -> None:
    """Issue 27: a watch that reopens quietly reported nothing until it ended (here 30 s), so a
    healed cluster stayed "failing" that long. The server accepting the watch is an answer."""
    lcs, cc = cluster
    group = ClusterInformers("c1", probe_interval=0.3)  # no probe: the watch alone
    jobs_informer(cc, group, watch_seconds=30)
    group.start()
    try:
        await assert_eventually(lambda: group.synced, timeout=10)
        lcs["c1"].partition()
        await assert_eventually(lambda: group.failing, timeout=10, message="the open watch breaks at the cut")
        lcs["c1"].heal()
        await assert_eventually(lambda: not group.failing, timeout=10, message="the reopened watch answered")
        assert group["jobs"].watches >= 2
    finally:
        group.stop()


async def test_the_liveness_probe_runs_while_suspected_and_when_quiet(cluster: tuple[LocalClusters, ClusterClient]) -> None:
    """The probe (GET /version) is the evidence of silence now: while the cluster fails, a failed
    probe every interval moves the run's latest failure on; after the heal it answers within an
    interval, whatever the informers' retries are doing. Quiet and healthy, it is a heartbeat."""
    lcs, cc = cluster
    group = ClusterInformers("c1", probe=cc.probe, probe_interval=0.2)  # the probe alone
    group.start()
    try:
        await assert_eventually(lambda: group.last_ok is not None, timeout=10)
        before = group.probes
        await assert_eventually(lambda: group.probes >= before + 3, timeout=10, message="a quiet cluster is probed")
        assert not group.failing and cc.calls_now()[("get", "version")] >= 3
        group.contacts()

        lcs["c1"].partition()
        await assert_eventually(lambda: group.failing, timeout=10)
        runs: list[tuple[bool, float, str]] = []

        def evidence() -> bool:
            runs.extend(group.contacts())
            failed = [at for answered, at, _ in runs if not answered]
            return len(failed) >= 2 and failed[-1] - failed[0] >= 0.6

        await assert_eventually(evidence, timeout=10, message="the latest failure keeps moving while partitioned")
        assert group.error.startswith("unreachable:"), group.error
        lcs["c1"].heal()
        await assert_eventually(lambda: not group.failing, timeout=10, message="the probe answers after the heal")
        assert group.contacts()[-1][0] is True
    finally:
        group.stop()


async def test_api_calls_do_not_grow_with_the_objects_followed(cluster: tuple[LocalClusters, ClusterClient]) -> None:
    """Over the same window, following 0 or 50 Jobs costs the same calls: no list, a few watches."""
    _, cc = cluster
    inf = jobs_informer(cc, watch_seconds=1).start()
    try:
        await assert_eventually(lambda: inf.synced.is_set(), timeout=10)

        async def window() -> dict[str, int]:
            before, watches = cc.calls_now(), inf.watches
            await assert_eventually(lambda: inf.watches >= watches + 3, timeout=15)  # three watch periods
            after = cc.calls_now()
            return {verb: after[(verb, "jobs")] - before[(verb, "jobs")] for verb in ("list", "watch", "get")}

        empty = await window()
        for i in range(50):
            cc.batch.create_namespaced_job(NS, managed(f"live{i}"), _request_timeout=TIMEOUT)
        await assert_eventually(lambda: len(inf.items()) == 50, timeout=10)
        full = await window()
        assert empty["list"] == full["list"] == 0, (empty, full)
        assert empty["get"] == full["get"] == 0, (empty, full)
        assert full["watch"] <= empty["watch"] + 1, (empty, full)
    finally:
        inf.stop()
