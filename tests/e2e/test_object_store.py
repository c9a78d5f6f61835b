"""Two clusters that share no disk, only an object store (issue 28): a real S3 server (SeaweedFS)
holds the dataset, the checkpoints, the outputs and the result manifests; the control plane and the
pods reach it with credentials the registry names (a Secret in each cluster, never the bus).

The scenario: a workload stages its dataset from S3 into east's cache, checkpoints to S3, is lost in
a partition, resumes on west from the S3 checkpoint (step > 0, the same data version), and exactly
one manifest is promoted; the stale attempt on east runs on behind the partition and uploads its
outputs late: they are never promoted. A cancelled attempt's partial outputs are never published.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from gpuorch.client import Client
from gpuorch.dev.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3
from gpuorch.invariants import check
from gpuorch.kube import make_clients
from gpuorch.objectstore import Store, open_store
from gpuorch.system import System
from gpuorch.workloads.dataset import make_dataset
from gpuorch_proto import type_tag
from gpuorch_proto.k8s import NAMESPACE
from gpuorch_proto.storage import StoreConfig, attempt_prefix, manifest_key
from tests.e2e.workloads import train
from tests.support.system import manifests_of, one_node, registry, result_object, running
from tests.support.wait import assert_eventually

BUCKET = "gpuorch"
SECRET = "s3-credentials"  # the Secret each cluster holds for the bucket: its name is all gpuorch records
REF = "mnist@v1"


def s3_config(server: SeaweedS3, prefix: str) -> dict[str, str]:
    return {"url": f"s3://{BUCKET}/{prefix}", "endpoint": server.endpoint, "region": REGION}


def cluster(name: str, bandwidth: float) -> dict[str, Any]:
    """A cluster that reaches the artifact store and the data lake only over the network."""
    return one_node(name, 4, stores=("prod",), bandwidth_mbps={"lake": bandwidth},
                    store_credentials={"prod": SECRET, "lake": SECRET})  # fmt: skip


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with SeaweedS3(tmp_path_factory.mktemp("seaweed"), buckets=(BUCKET,)) as server:
        yield server


@pytest.fixture(scope="module")
def system(s3: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    state = tmp_path_factory.mktemp("objstore")
    doc = registry(cluster("east", 2000), cluster("west", 1000),
                   stores={"prod": s3_config(s3, "prod"), "lake": s3_config(s3, "lake")})  # fmt: skip
    # the control plane's own credentials for the bucket (the fencer publishes, the dispatcher lists)
    creds = {**s3.env("prod"), **s3.env("lake")}
    with running(state, clusters=doc, env_extra={"GPUORCH_LOST_AFTER": "2", **creds}) as s:
        for cc in make_clients(s.kubeconfig).values():
            secret = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=SECRET),
                                  string_data={"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY})  # fmt: skip
            cc.core.create_namespaced_secret(NAMESPACE, secret)
        yield s


def store(s3: SeaweedS3, name: str) -> Store:
    return open_store(name, StoreConfig(**s3_config(s3, name)), s3.env(name))


@pytest.fixture(scope="module")
def lake(s3: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The dataset, only in S3: its files and a SHA256SUMS the agent verifies. Returns name -> sha256."""
    d = make_dataset(tmp_path_factory.mktemp("dataset"), REF, seed=7)
    files = {f.name: f.read_bytes() for f in sorted(d.iterdir()) if f.is_file()}
    sums = {n: hashlib.sha256(b).hexdigest() for n, b in files.items()}

    async def upload() -> None:
        lake_store = store(s3, "lake")
        for n, b in files.items():
            await lake_store.put(f"{REF}/{n}", b)
        await lake_store.put(f"{REF}/SHA256SUMS", "".join(f"{h}  {n}\n" for n, h in sums.items()).encode())

    asyncio.run(upload())
    return sums


def s3_train(name: str, steps: int, **spec: Any) -> Any:
    return train(name, steps=steps, fencing="fast", lease="10h", inputs=[{"ref": REF, "size_gb": 10, "locations": ["lake"]}],
                 preferences={"clusters": ["east"]}, **spec)  # fmt: skip


async def keys_under(s: Store, prefix: str) -> set[str]:
    return {o.key for o in await s.list(prefix)}


async def attempt_on(client: Client, wid: str, cluster: str) -> Any:
    async def running_there() -> Any:
        v = await client.view(wid)
        assert v is not None, "no view yet"
        found = [a for a in v.attempts.values() if a.cluster == cluster and a.status == "running"]
        assert found, f"no running attempt on {cluster}: {[(a.cluster, a.status) for a in v.attempts.values()]} ({v.status}: {v.reason})"
        return found[0]

    return await assert_eventually(running_there, timeout=90, interval=0.2)


def jobs_name_stores_by_url_and_no_path_of_the_control_plane(system: System, cluster: str) -> None:
    """What the dispatcher created on `cluster`, read back through the official client: store URLs
    and the name of a Secret, never the control plane's state directory nor a credential."""
    cc = make_clients(system.kubeconfig)[cluster]
    jobs = cc.batch.list_namespaced_job(NAMESPACE).items
    assert jobs, f"no Job on {cluster}"
    for job in jobs:
        text = json.dumps(cc.api.sanitize_for_serialization(job))
        assert str(system.state_dir) not in text, job.metadata.name
        assert SECRET_KEY not in text and ACCESS_KEY not in text, job.metadata.name
        assert f"s3://{BUCKET}/prod" in text and f'"name": "{SECRET}"' in text, job.metadata.name


async def test_lost_on_east_resumes_on_west_from_s3_and_one_manifest_is_promoted(
    s3: SeaweedS3, system: System, client: Client, lake: dict[str, str]
) -> None:
    prod = store(s3, "prod")
    wid = await client.submit(s3_train("s3-resume", steps=120))
    a1 = await attempt_on(client, wid, "east")
    assert a1.output_path == f"s3://{BUCKET}/prod/{attempt_prefix(wid, a1.attempt_id)}", a1.output_path
    # staged from S3 into east's cache (a PersistentVolumeClaim of east's), checksums verified
    cache = system.state_dir / "clusters" / "east" / "claims" / NAMESPACE / "gpuorch-cache" / REF
    assert (cache / ".complete").is_file(), "the agent staged the dataset into east's cache"
    assert {f: hashlib.sha256((cache / f).read_bytes()).hexdigest() for f in lake} == lake
    assert not (system.state_dir / "data" / "lake").exists(), "the dataset is only in S3"

    # a checkpoint in S3, uploaded by the agent beside the program
    ck_prefix = f"{attempt_prefix(wid, a1.attempt_id)}/checkpoints"

    async def checkpointed() -> set[str]:
        keys = await keys_under(prod, ck_prefix)
        assert keys, f"no checkpoint under {prod.url_of(ck_prefix)} yet"
        return keys

    await assert_eventually(checkpointed, timeout=60, interval=0.2)
    system.fault("east", "partition")
    try:
        a2 = await attempt_on(client, wid, "west")
        assert a2.mode == "resume" and (a2.resume_from or "").startswith(f"s3://{BUCKET}/prod/{ck_prefix}/"), (a2.mode, a2.resume_from)
        jobs_name_stores_by_url_and_no_path_of_the_control_plane(system, "west")
        # behind the partition the stale attempt runs on and its agent uploads its outputs: late
        a1_metrics = f"{attempt_prefix(wid, a1.attempt_id)}/metrics.json"

        async def late_upload() -> bytes:
            data = await prod.get(a1_metrics)
            assert data is not None, f"{prod.url_of(a1_metrics)} not uploaded yet"
            return data

        late = json.loads(await assert_eventually(late_upload, timeout=90, interval=0.3))
        assert late["attempt_id"] == a1.attempt_id and late["resumed_from_step"] is None
    finally:
        system.fault("east", "heal")
    view = await client.wait(wid, timeout=120)
    assert view.status == "completed", view.reason
    assert view.promoted_attempt == a2.attempt_id
    # exactly one manifest, the replacement's, and it resolves to what west computed from step > 0
    found = await manifests_of(system, wid)
    assert set(found) == {"prod"} and found["prod"].attempt_id == a2.attempt_id and found["prod"].epoch == a2.epoch, found
    assert view.result_path == prod.url_of(manifest_key(wid))
    metrics = json.loads(await result_object(system, view.result_path, "metrics.json"))
    assert metrics["attempt_id"] == a2.attempt_id and metrics["steps"] == 120
    assert metrics["resumed_from_step"] and metrics["resumed_from_step"] > 0, metrics
    assert metrics["input"]["fingerprint"] == late["input"]["fingerprint"], "the same data version on both clusters"
    assert {o.key for o in found["prod"].objects} >= {"metrics.json", "model.npz"}

    async def stale_settled() -> bool:
        v = await client.view(wid)
        assert v is not None
        old = v.attempts[a1.attempt_id]
        assert old.orphan_deleted or old.promotion_rejected or old.cancel_confirmed, old
        return True

    await assert_eventually(stale_settled, timeout=60)
    events = await client.events(wid)
    assert [type_tag(e) for _, e in events].count("promoted") == 1
    assert check(events) == []
    found = await manifests_of(system, wid)
    assert found["prod"].attempt_id == a2.attempt_id, "the stale attempt's late upload was never promoted"


async def test_a_cancelled_attempts_partial_outputs_are_never_published(
    s3: SeaweedS3, system: System, client: Client, lake: dict[str, str]
) -> None:
    prod = store(s3, "prod")
    # pinned: after the first test both clusters have staged, and measured links may favour west
    wid = await client.submit(s3_train("s3-cancel", steps=3000, requirements={"clusters": ["east"]}))
    a1 = await attempt_on(client, wid, "east")
    ck_prefix = f"{attempt_prefix(wid, a1.attempt_id)}/checkpoints"

    async def partial() -> set[str]:
        keys = await keys_under(prod, ck_prefix)
        assert keys, "no partial output yet"
        return keys

    await assert_eventually(partial, timeout=60, interval=0.2)
    await client.cancel(wid)
    view = await client.wait(wid, timeout=60)
    assert view.status == "cancelled", view.status
    assert await keys_under(prod, attempt_prefix(wid, a1.attempt_id)), "its partial outputs are in the store"
    assert await manifests_of(system, wid) == {}, "and never published"
    assert await prod.get(manifest_key(wid)) is None


def test_the_lake_was_never_copied_to_the_control_planes_disk(system: System) -> None:
    leaked = [p for p in Path(system.state_dir).rglob("data.npz") if "claims" not in p.parts]
    assert leaked == [], leaked
