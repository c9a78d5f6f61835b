"""Waits per request shape are a compatible contract change (proto/EVOLUTION.md, rule 1): a
snapshot, registry entry or decision without the new fields decodes with their defaults; a new
one round-trips in JSON and msgpack; a reader built before the fields skips them."""

from __future__ import annotations

import msgspec
import pytest

from gpuorch_proto import (
    ClusterRegistryEntry,
    ClusterSnapshot,
    QueueInfo,
    RequestShape,
    RoutingDecision,
    ShapeWait,
    decode_snapshot,
    encode,
)
from gpuorch_proto.inventory import QueueRegistry
from gpuorch_proto.routing import ClusterVerdict, Estimate

#: a snapshot as inventory published it before waits per shape (its JSON, as it was on the bus)
OLD_SNAPSHOT = (
    b'{"schema_version":1,"cluster":"lab","reachable":true,"observed_at":10.0,"published_at":11.0,'
    b'"nodes":[{"name":"n0","gpu_product":"NVIDIA-A100-SXM4-80GB","gpus_allocatable":8,"gpus_free":0}],'
    b'"queues":[{"name":"default","owners":["*"],"pending_jobs":1,"pending_gpus":8,"estimated_wait_seconds":1800.0}],'
    b'"registry":{"admission":"kueue","queues":[{"name":"default","owners":["*"]}]}}'
)

NEW_QUEUE = QueueInfo(
    name="default", pending_jobs=1, pending_gpus=8, estimated_wait_seconds=1800.0,
    shape_waits=[
        ShapeWait(shape=RequestShape(gpus=1), seconds=1800.0),
        ShapeWait(shape=RequestShape(gpus=8, workers=2, gpu_product="NVIDIA-A100-SXM4-80GB", pool="train"), seconds=7200.0,
                  source="history"),
    ],
)  # fmt: skip
NEW_SNAPSHOT = ClusterSnapshot(
    cluster="lab", reachable=True, observed_at=10.0, published_at=11.0, queues=[NEW_QUEUE],
    registry=ClusterRegistryEntry(admission="kueue", queueing="priority",
                                  queues=[QueueRegistry(name="default", cluster_queue="gpu")]),
)  # fmt: skip


def test_an_old_snapshot_decodes_with_no_waits_per_shape_and_best_effort_queueing() -> None:
    snap = decode_snapshot(OLD_SNAPSHOT)
    (q,) = snap.queues
    assert (q.estimated_wait_seconds, q.shape_waits) == (1800.0, [])
    assert snap.registry.queueing == "best-effort"
    assert snap.registry.queues[0].cluster_queue is None


def test_a_new_snapshot_round_trips() -> None:
    data = encode(NEW_SNAPSHOT)  # JSON, as inventory publishes it
    assert decode_snapshot(data) == NEW_SNAPSHOT
    assert decode_snapshot(data).queues[0].shape_waits[1].shape.workers == 2
    assert msgspec.msgpack.decode(encode(NEW_SNAPSHOT, "msgpack"), type=ClusterSnapshot) == NEW_SNAPSHOT


# The contract's types as a reader built before the change has them (no new fields).
class OldQueueInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    owners: list[str] = msgspec.field(default_factory=lambda: ["*"])
    pending_jobs: int = 0
    pending_gpus: int = 0
    estimated_wait_seconds: float = 0.0


class OldQueueRegistry(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    owners: list[str] = msgspec.field(default_factory=lambda: ["*"])


class OldRegistry(msgspec.Struct, frozen=True, kw_only=True):
    admission: str = "none"
    queues: list[OldQueueRegistry] = []


class OldSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    schema_version: int = 1
    cluster: str
    reachable: bool
    observed_at: float
    published_at: float
    queues: list[OldQueueInfo] = []
    registry: OldRegistry = OldRegistry()


class OldEstimate(msgspec.Struct, frozen=True, kw_only=True):
    queue_wait: float = 0.0
    total: float = 0.0


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_a_reader_from_before_the_change_skips_the_new_fields(fmt: str) -> None:
    data = encode(NEW_SNAPSHOT, fmt)  # type: ignore[arg-type]
    assert b"shape_waits" in data and b"queueing" in data
    decoder = msgspec.json.Decoder(OldSnapshot) if fmt == "json" else msgspec.msgpack.Decoder(OldSnapshot)
    old = decoder.decode(data)
    assert old.queues == [OldQueueInfo(name="default", pending_jobs=1, pending_gpus=8, estimated_wait_seconds=1800.0)]
    assert old.registry == OldRegistry(admission="kueue", queues=[OldQueueRegistry(name="default")])
    est = encode(Estimate(queue_wait=60.0, total=90.0, queue_basis="queue default: inventory's wait for 1 GPU on any node"), fmt)  # type: ignore[arg-type]
    decode = msgspec.json.decode if fmt == "json" else msgspec.msgpack.decode
    assert decode(est, type=OldEstimate) == OldEstimate(queue_wait=60.0, total=90.0)


def test_a_decision_without_the_queue_basis_decodes_and_a_new_one_round_trips() -> None:
    old = b'{"workload_id":"w","decided_at":1.0,"outcome":"routed","cluster":"lab","summary":"s","verdicts":[{"cluster":"lab","eligible":true,"estimate":{"queue_wait":5.0}}]}'
    d = msgspec.json.decode(old, type=RoutingDecision)
    assert d.verdicts[0].estimate == Estimate(queue_wait=5.0) and d.verdicts[0].estimate.queue_basis == ""
    new = RoutingDecision(workload_id="w", decided_at=1.0, outcome="routed", cluster="lab", summary="s", verdicts=[
        ClusterVerdict(cluster="lab", eligible=True, estimate=Estimate(queue_wait=5.0, queue_basis="fits now"))])
    assert msgspec.json.decode(msgspec.json.encode(new), type=RoutingDecision) == new


def test_an_unknown_queueing_is_refused_with_its_path() -> None:
    bad = msgspec.json.decode(OLD_SNAPSHOT)
    bad["registry"]["queueing"] = "lifo"
    with pytest.raises(msgspec.ValidationError, match=r"registry.queueing"):
        decode_snapshot(msgspec.json.encode(bad))
