"""Promotion through the store's own compare-and-set (issue 28), against a real S3 server
(SeaweedFS) and a local directory: the fencer reads an attempt's listing and upload record,
writes one manifest create-only, and never moves an output's bytes.

"Two fencers, 100 races, one manifest each time": two independent publishers (separate store
clients, separate connections) race to create the manifest of the same workload."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuorch.config import Settings
from gpuorch.dev.seaweed import SeaweedS3
from gpuorch.objectstore import Store, Stores, StoreUnavailable
from gpuorch.runtime.shell import Retry
from gpuorch_fencer import core, publish
from gpuorch_fencer.service import Fencer, Records
from gpuorch_proto import FenceRecord, decode_fence
from gpuorch_proto import events as ev
from gpuorch_proto.storage import (
    UPLOAD_RECORD,
    Manifest,
    StoreConfig,
    UploadedObject,
    UploadRecord,
    attempt_prefix,
    manifest_key,
)
from tests.fencer.test_collector import Bucket
from tests.storage.conftest import file_store, s3_store
from tests.support.builders import make_workload

OUTPUTS = {"model.bin": b"m" * 5000, "metrics.json": b'{"loss": 0.1}', "sub/params": b"0.013 3"}


@pytest.fixture(params=["s3", "file"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def two_clients(kind: str, s3: SeaweedS3 | None, tmp_path: Path) -> tuple[Store, Store]:
    """Two clients of one store, as two fencer replicas hold them."""
    if kind == "s3":
        assert s3 is not None
        return s3_store(s3, prefix=f"p-{tmp_path.name}"), s3_store(s3, prefix=f"p-{tmp_path.name}")
    return file_store(tmp_path / "store"), file_store(tmp_path / "store")


@pytest.fixture
def clients(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Store, Store]:
    s3 = request.getfixturevalue("s3") if kind == "s3" else None
    return two_clients(kind, s3, tmp_path)


async def upload(store: Store, wid: str, att: str, outputs: dict[str, bytes] = OUTPUTS, *, record: bool = True) -> None:
    """What gpuorch's agent does in the pod: the outputs, then the upload record, last."""
    prefix = attempt_prefix(wid, att)
    for key, data in outputs.items():
        await store.put(f"{prefix}/{key}", data)
    if record:
        rec = UploadRecord(workload_id=wid, attempt_id=att, completed_at=1.0,
                           objects=[UploadedObject(k, len(v), hashlib.sha256(v).hexdigest()) for k, v in outputs.items()])  # fmt: skip
        await store.put(f"{prefix}/{UPLOAD_RECORD}", msgspec.json.encode(rec))


async def prepared(store: Store, wid: str, att: str, epoch: int) -> Manifest:
    m = await publish.prepare(store, wid, att, epoch, 2.0)
    assert isinstance(m, Manifest), m
    return m


async def everything(store: Store, wid: str) -> dict[str, tuple[int, bytes]]:
    """Every object under the workload, with its bytes."""
    out: dict[str, tuple[int, bytes]] = {}
    for o in await store.list(wid):
        data = await store.get(f"{wid}/{o.key}")
        assert data is not None
        out[o.key] = (o.size, data)
    return out


# --- prepare: the attempt's outputs as the store holds them ------------------------------------------


async def test_a_complete_upload_gives_the_manifest_of_what_the_record_names(clients: tuple[Store, Store]) -> None:
    a, _ = clients
    await upload(a, "w", "w-a1")
    await a.put(f"{attempt_prefix('w', 'w-a1')}/not-recorded.tmp", b"x" * 10)  # written after the record: not published
    m = await prepared(a, "w", "w-a1", 3)
    assert (m.workload_id, m.attempt_id, m.epoch, m.store, m.prefix) == ("w", "w-a1", 3, "prod", "w/attempts/w-a1")
    assert [(o.key, o.size, o.sha256) for o in m.objects] == sorted((k, len(v), hashlib.sha256(v).hexdigest()) for k, v in OUTPUTS.items())
    assert m.total_bytes == sum(len(v) for v in OUTPUTS.values())


async def test_an_upload_without_its_record_is_rejected_with_the_reason(clients: tuple[Store, Store]) -> None:
    a, _ = clients
    await upload(a, "w", "w-a1", record=False)
    why = await publish.prepare(a, "w", "w-a1", 1, 2.0)
    assert isinstance(why, str) and why.startswith("no upload record"), why


async def test_an_object_deleted_under_the_record_is_rejected_with_the_reason(clients: tuple[Store, Store]) -> None:
    a, _ = clients
    await upload(a, "w", "w-a1")
    await a.delete(f"{attempt_prefix('w', 'w-a1')}/sub/params")
    why = await publish.prepare(a, "w", "w-a1", 1, 2.0)
    assert why == "'sub/params' is in the upload record but not in the store"
    await a.put(f"{attempt_prefix('w', 'w-a1')}/sub/params", b"short")  # replaced by another size
    why = await publish.prepare(a, "w", "w-a1", 1, 2.0)
    assert why == f"'sub/params' is 5 bytes in the store, {len(OUTPUTS['sub/params'])} in the upload record"


async def test_a_record_that_is_not_gpuorchs_or_of_another_attempt_is_rejected(clients: tuple[Store, Store]) -> None:
    a, _ = clients
    await upload(a, "w", "w-a1")
    await a.put(f"{attempt_prefix('w', 'w-a1')}/{UPLOAD_RECORD}", b"{not json")
    why = await publish.prepare(a, "w", "w-a1", 1, 2.0)
    assert isinstance(why, str) and "not a gpuorch upload record" in why and UPLOAD_RECORD in why
    await upload(a, "w", "w-a2")
    await a.copy(f"{attempt_prefix('w', 'w-a2')}/{UPLOAD_RECORD}", f"{attempt_prefix('w', 'w-a1')}/{UPLOAD_RECORD}")
    assert await publish.prepare(a, "w", "w-a1", 1, 2.0) == "the upload record is for w/w-a2, not this attempt"


# --- publish: one manifest, create-only --------------------------------------------------------------


async def test_two_fencers_100_races_one_manifest_each_time(clients: tuple[Store, Store]) -> None:
    """Two publishers with separate clients race to create the manifest of the same workload:
    each race, exactly one writes it and the other finds it (the same attempt's: a retried
    promotion, fine; another's: lost, and it says so); the manifest is the winner's."""
    a, b = clients
    for i in range(100):
        wid = f"race{i}"
        await upload(a, wid, f"{wid}-a1", {"out": b"1"})
        await upload(a, wid, f"{wid}-a2", {"out": b"22"})
        if i % 2:  # two replicas of one fencer: the same attempt, the same epoch
            m1 = m2 = await prepared(a, wid, f"{wid}-a1", 1)
        else:  # the other one bypassed the fence: another attempt
            m1, m2 = await prepared(a, wid, f"{wid}-a1", 1), await prepared(b, wid, f"{wid}-a2", 2)
        got = await asyncio.gather(publish.publish(a, wid, m1.attempt_id, m1.epoch, m1), publish.publish(b, wid, m2.attempt_id, m2.epoch, m2))
        outcomes = sorted(p.outcome for p in got)
        assert outcomes == (["created", "same"] if i % 2 else ["conflict", "created"]), (i, got)
        winner = next(p for p in got if p.outcome == "created")
        stored = await publish.read_manifest(b, wid)
        assert stored == winner.manifest, i
        if not i % 2:
            loser = next(p for p in got if p.outcome == "conflict")
            assert loser.manifest == winner.manifest and "never overwritten" in loser.reason, loser
        objects = {o.key for o in await a.list(f"{wid}/result")}
        assert objects == {"manifest.json"}, (i, objects)


async def test_a_stale_attempt_never_produces_a_manifest_once_one_exists(clients: tuple[Store, Store]) -> None:
    a, b = clients
    await upload(a, "w", "w-a1")
    await upload(a, "w", "w-a2", {"out": b"2"})
    current = await prepared(a, "w", "w-a2", 2)
    assert (await publish.publish(a, "w", "w-a2", 2, current)).outcome == "created"
    before = await a.get(manifest_key("w"))
    for att, epoch in (("w-a1", 1), ("w-a1", 2), ("w-a2", 1)):  # another attempt, or the same at another epoch
        stale = await prepared(b, "w", att, epoch)
        lost = await publish.publish(b, "w", att, epoch, stale)
        assert lost.outcome == "conflict" and "w/w-a2 at epoch 2" in lost.reason, lost
    assert await a.get(manifest_key("w")) == before
    again = await publish.publish(b, "w", "w-a2", 2, current)
    assert again.outcome == "same" and again.manifest == current


async def test_a_hand_written_manifest_is_never_overwritten_and_the_reason_is_clear(clients: tuple[Store, Store]) -> None:
    a, _ = clients
    await upload(a, "w", "w-a1")
    m = await prepared(a, "w", "w-a1", 1)
    await a.put(manifest_key("w"), b'{"hello": "by hand"}')
    got = await publish.publish(a, "w", "w-a1", 1, m)
    assert got.outcome == "conflict" and got.manifest is None
    assert "not a gpuorch result manifest" in got.reason and "never overwritten" in got.reason and got.url.endswith("w/result/manifest.json")
    assert await a.get(manifest_key("w")) == b'{"hello": "by hand"}'
    # a well-formed one of another workload's attempt, copied here by hand
    other = msgspec.structs.replace(m, workload_id="v", attempt_id="v-a1")
    await a.put(manifest_key("w"), publish.encode_manifest(other))
    got = await publish.publish(a, "w", "w-a1", 1, m)
    assert got.outcome == "conflict" and "holds the manifest of v/v-a1 at epoch 1" in got.reason
    assert await a.get(manifest_key("w")) == publish.encode_manifest(other)


async def test_the_fencer_writes_only_the_manifest(clients: tuple[Store, Store]) -> None:
    """No object's bytes pass through the fencer: after prepare and publish the attempt's
    objects are exactly as they were (sizes, entity tags, bytes), and the one new key is the
    manifest, which names them where they are."""
    a, _ = clients
    await upload(a, "w", "w-a1")
    listing_before = {o.key: (o.size, o.etag) for o in await a.list("w")}
    before = await everything(a, "w")
    m = await prepared(a, "w", "w-a1", 1)
    assert (await publish.publish(a, "w", "w-a1", 1, m)).outcome == "created"
    after = await everything(a, "w")
    assert set(after) - set(before) == {"result/manifest.json"}
    assert {k: v for k, v in after.items() if k != "result/manifest.json"} == before
    assert {o.key: (o.size, o.etag) for o in await a.list("w") if o.key != "result/manifest.json"} == listing_before
    assert after["result/manifest.json"][0] == len(publish.encode_manifest(m))


# --- readers: resolve a result through its manifest ---------------------------------------------------


async def test_a_result_url_resolves_to_its_manifest_and_objects(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    stores = _stores(kind, request, tmp_path)
    store = stores["prod"]
    await upload(store, "w", "w-a1")
    m = await prepared(store, "w", "w-a1", 1)
    await publish.publish(store, "w", "w-a1", 1, m)
    url = store.url_of(manifest_key("w"))
    assert await publish.resolve_result(stores, url) == m
    assert await publish.read_object(stores, m, "sub/params") == OUTPUTS["sub/params"]
    out = tmp_path / "copy.bin"
    with out.open("wb") as f:
        assert await publish.copy_object_to(stores, m, "model.bin", f) == len(OUTPUTS["model.bin"])
    assert out.read_bytes() == OUTPUTS["model.bin"]
    with pytest.raises(publish.ResultError, match="has no object 'nope'"):
        await publish.read_object(stores, m, "nope")
    with pytest.raises(publish.ResultError, match=r"no result manifest at .*/v/result/manifest\.json"):
        await publish.resolve_result(stores, store.url_of(manifest_key("v")))
    with pytest.raises(publish.ResultError, match="in none of the registry's stores"):
        await publish.resolve_result(stores, "s3://elsewhere/w/result/manifest.json")
    await store.put(manifest_key("x"), b"[]")
    with pytest.raises(publish.ResultError, match="not a gpuorch result manifest"):
        await publish.resolve_result(stores, store.url_of(manifest_key("x")))


def _stores(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    if kind == "s3":
        s3: SeaweedS3 = request.getfixturevalue("s3")
        from gpuorch.dev.seaweed import REGION

        cfg = StoreConfig(url=f"s3://gpuorch/r-{tmp_path.name}", endpoint=s3.endpoint, region=REGION)
        return Stores({"prod": cfg}, None, s3.env("prod"))
    return Stores({"prod": StoreConfig(url=(tmp_path / "store").resolve().as_uri())}, None, {})


# --- the fencer's shell: gate, prepare, compare-and-set, publish ---------------------------------------


W = "train-0123456789"


def fencer_with(stores: Stores) -> tuple[Fencer, Bucket]:
    f = Fencer(Settings())
    bucket = Bucket()
    f.records, f.stores, f.store_names = Records(bucket), stores, ["prod"]
    wl = make_workload("train", output_store="prod")
    f.follower.projection.apply(ev.Submitted(workload_id=W, at=1.0, workload=wl), 1)
    return f, bucket


def attempt(f: Fencer, n: int, epoch: int, seq: int) -> ev.PromoteRequested:
    aid = f"{W}-a{n}"
    out = core.attempt_url(f.stores.url("prod"), W, aid)
    assert out is not None
    base: dict[str, Any] = {"workload_id": W, "at": 1.0, "attempt_id": aid, "epoch": epoch, "cluster": "east"}
    f.follower.projection.apply(ev.AttemptCreated(**base, attempt_number=n, job_name=aid, output_path=out, checkpoint_path=out + "/checkpoints"), seq)
    f.follower.projection.apply(ev.Succeeded(**base, output_path=out), seq + 1)
    return ev.PromoteRequested(**base, output_path=out)


async def test_the_fencer_promotes_through_the_manifest(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    stores = _stores(kind, request, tmp_path)
    f, bucket = fencer_with(stores)
    e = attempt(f, 1, 1, 10)
    await upload(stores["prod"], W, e.attempt_id)
    out = await f.promote(e, 5.0)
    result = stores.url("prod").rstrip("/") + f"/{W}/result/manifest.json"
    assert [type(x) for x in out] == [ev.Promoted]
    promoted = out[0]
    assert isinstance(promoted, ev.Promoted)
    assert promoted.result_path == result and promoted.result_bytes == sum(len(v) for v in OUTPUTS.values())
    rec = decode_fence(bucket.data[W][0])
    assert rec.promoted_attempt == e.attempt_id and rec.result_path == result
    m = await publish.resolve_result(stores, promoted.result_path)
    assert (m.attempt_id, m.epoch) == (e.attempt_id, 1)
    again = await f.promote(e, 6.0)  # redelivered: the same result, nothing written again
    assert [type(x) for x in again] == [ev.Promoted] and again[0].event_id == promoted.event_id
    assert await publish.resolve_result(stores, result) == m


async def test_the_fencer_rejects_an_incomplete_upload_and_fences_the_attempt(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    stores = _stores(kind, request, tmp_path)
    f, bucket = fencer_with(stores)
    e = attempt(f, 1, 1, 10)
    await upload(stores["prod"], W, e.attempt_id, record=False)
    out = await f.promote(e, 5.0)
    assert [type(x) for x in out] == [ev.PromotionRejected, ev.Fenced, ev.ReplacementAllowed]
    assert "no upload record" in out[0].reason  # type: ignore[attr-defined]
    assert decode_fence(bucket.data[W][0]) == FenceRecord(epoch=2)
    assert e.attempt_id in f.pursuits, "its Job is deleted"
    assert await stores["prod"].get(manifest_key(W)) is None


async def test_the_fencer_never_overwrites_a_hand_written_manifest(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    stores = _stores(kind, request, tmp_path)
    f, bucket = fencer_with(stores)
    e = attempt(f, 1, 1, 10)
    await upload(stores["prod"], W, e.attempt_id)
    await stores["prod"].put(manifest_key(W), b"by hand")
    out = await f.promote(e, 5.0)
    assert [type(x) for x in out] == [ev.PromotionRejected]
    assert out[0].reason.startswith("result manifest conflict: ") and "never overwritten" in out[0].reason  # type: ignore[attr-defined]
    assert decode_fence(bucket.data[W][0]).promoted_attempt == e.attempt_id, "the record keeps the promotion"
    assert await stores["prod"].get(manifest_key(W)) == b"by hand"


async def test_a_store_that_does_not_answer_retries_the_promotion_later(tmp_path: Path) -> None:
    dead = Stores({"prod": StoreConfig(url="s3://gpuorch/x", endpoint="http://127.0.0.1:9", region="us-east-1")}, None,
                  {"GPUORCH_STORE_PROD_ACCESS_KEY_ID": "k", "GPUORCH_STORE_PROD_SECRET_ACCESS_KEY": "s"})  # fmt: skip
    f, bucket = fencer_with(dead)
    e = attempt(f, 1, 1, 10)
    with pytest.raises(Retry) as got:
        await f.promote(e, 5.0)
    assert "waits for its store" in got.value.reason and "store prod" in got.value.reason
    assert W not in bucket.data, "nothing decided: the record is untouched"
    with pytest.raises(StoreUnavailable):
        await publish.prepare(dead["prod"], W, e.attempt_id, 1, 5.0)



# --- `gpuorch result`: what a user reads ---------------------------------------------------------------


async def test_gpuorch_result_shows_the_manifest_and_streams_one_object(tmp_path: Path, capfdbinary: Any) -> None:
    from gpuorch.cli import show_result
    from gpuorch.projection import Projection

    stores = Stores({"prod": StoreConfig(url=(tmp_path / "store").resolve().as_uri())}, None, {})
    f, _ = fencer_with(stores)
    e = attempt(f, 1, 1, 10)
    view = f.follower.projection.get(W)
    assert view is not None
    assert await show_result(stores, view, None, "table") == 1
    assert "has no result yet" in capfdbinary.readouterr().err.decode()
    await upload(stores["prod"], W, e.attempt_id)
    (promoted,) = await f.promote(e, 5.0)
    p = Projection()
    for seq, x in enumerate([ev.Submitted(workload_id=W, at=1.0, workload=make_workload("train", output_store="prod")), promoted], start=1):
        p.apply(x, seq)
    v = p.get(W)
    assert v is not None and v.result_path == promoted.result_path  # type: ignore[attr-defined]
    assert await show_result(stores, v, None, "table") == 0
    shown = capfdbinary.readouterr().out.decode()
    assert f"{e.attempt_id} (epoch 1)" in shown and "sub/params" in shown and hashlib.sha256(OUTPUTS["sub/params"]).hexdigest() in shown
    assert await show_result(stores, v, None, "json") == 0
    doc = msgspec.json.decode(capfdbinary.readouterr().out.decode())
    assert doc["kind"] == "gpuorch.result" and doc["attempt_id"] == e.attempt_id and doc["result"] == promoted.result_path  # type: ignore[attr-defined]
    capfdbinary.readouterr()
    assert await show_result(stores, v, "model.bin", "table") == 0
    assert capfdbinary.readouterr().out == OUTPUTS["model.bin"]
    assert await show_result(stores, v, "missing.bin", "table") == 1
    assert "has no object 'missing.bin'" in capfdbinary.readouterr().err.decode()
    await stores["prod"].delete(manifest_key(W))
    await stores["prod"].put(manifest_key(W), b"by hand")
    assert await show_result(stores, v, None, "table") == 1
    assert "not a gpuorch result manifest" in capfdbinary.readouterr().err.decode()
