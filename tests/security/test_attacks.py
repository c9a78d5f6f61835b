"""Attacks on the running embedded system, a real nats-server under the generated permissions.

Each forgery is refused, by the server (a permissions violation naming the subject) or by the
receiver (a recorded reason), and afterwards the victim workload's projection, the KV buckets,
the durable consumers, the streams' configs and the Jobs are what they were (`world`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from gpuorch.client import Client
from gpuorch.security import EVENT_PUBLISHERS
from gpuorch.security.identity import sign_headers
from gpuorch.system import System
from gpuorch_proto import INSTANCE_KEY_PREFIX, ClusterSnapshot, encode, event_id, instance_key
from gpuorch_proto import events as ev
from tests.e2e.workloads import train
from tests.security.conftest import Actor, connect_as
from tests.support.system import manifests_of
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

ALL_TYPES = [*EVENT_PUBLISHERS, "rejected"]


def forged_id() -> str:
    return f"forged-{uuid.uuid4().hex[:10]}"


async def try_publish(actor: Actor, subject: str, payload: bytes = b"{}", headers: dict[str, str] | None = None) -> str:
    """Publish to a stream as `actor`; the server's refusal (raises if the message was stored)."""
    since = len(actor.errors)
    hdrs = {"Nats-Msg-Id": forged_id(), **(headers or {})}
    try:
        ack = await actor.js.publish(subject, payload, headers=hdrs, timeout=2.0)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError):
        pass
    else:
        raise AssertionError(f"{actor.identity} published on {subject}: stored as seq {ack.seq}")

    def refused() -> str:
        hits = [e for e in actor.refusals(since) if subject.lower() in e.lower()]
        assert hits, f"no refusal of {subject} for {actor.identity}: {actor.errors[since:]}"
        return hits[0]

    return await assert_eventually(refused, timeout=5)


async def try_request(actor: Actor, subject: str, payload: bytes = b"") -> str:
    """A JetStream API request as `actor`: the server's refusal (raises if it was answered)."""
    since = len(actor.errors)
    try:
        reply = await actor.nc.request(subject, payload, timeout=1.5)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        pass
    else:
        raise AssertionError(f"{actor.identity}: {subject} was answered: {reply.data[:300]!r}")

    def refused() -> str:
        hits = [e for e in actor.refusals(since) if subject.lower() in e.lower()]
        assert hits, f"no refusal of {subject} for {actor.identity}: {actor.errors[since:]}"
        return hits[0]

    return await assert_eventually(refused, timeout=5)


async def keys_of(js: Any, bucket: str) -> list[str]:
    """The bucket's keys. nats-py's `keys()` answers NoKeysError when its watcher hears nothing in
    time, which a loaded machine can cause for a bucket that has keys: asked again then, and
    taken as empty only when the bucket's stream holds no message or after five tries."""
    kv = await js.key_value(bucket)
    for _ in range(5):
        try:
            return list(await kv.keys())
        except nats.js.errors.NoKeysError:
            if not (await js.stream_info(f"KV_{bucket}")).state.messages:
                return []
    return []


async def world(system: System, admin: Actor, kube: dict, wid: str) -> dict[str, Any]:
    """What must not change: the victim's projection, KV buckets, durables, stream configs, Jobs."""
    names = system.settings.names
    js = admin.js
    out: dict[str, Any] = {}
    for bucket in (names.kv_fence, names.kv_staged):
        kv = await js.key_value(bucket)
        entries: dict[str, Any] = {}
        for key in await keys_of(js, bucket):
            e = await kv.get(key)
            entries[key] = (e.revision, e.value)
        out[bucket] = entries
    owners = await js.key_value(names.kv_owners)
    admission = await js.key_value(names.kv_admission)
    out["admission"] = {}  # the lease is renewed: compare who leads which term, not revisions
    for k in await keys_of(js, names.kv_admission):
        doc = json.loads((await admission.get(k)).value)
        out["admission"][k] = (doc["instance"], doc["term"])
    out["owners"] = {}
    for k in await keys_of(js, names.kv_owners):  # instance leases are renewed: compare who, not revisions
        doc = json.loads((await owners.get(k)).value)
        out["owners"][k] = (doc["instance"], doc["generation"]) if k.startswith(INSTANCE_KEY_PREFIX) else doc["owner"]
    for stream in (names.stream_cmd, names.stream_evt, names.stream_inventory):
        info = await js.stream_info(stream)
        cfg = info.config
        out[f"{stream}.config"] = (cfg.subjects, cfg.max_age, cfg.max_bytes, cfg.max_msg_size, cfg.duplicate_window)
        if stream != names.stream_inventory:  # (it keeps one message per subject: its first moves)
            out[f"{stream}.first_seq"] = info.state.first_seq  # a purge moves it
        durables = {c.name: (c.config.filter_subject, c.config.ack_policy) for c in await js.consumers_info(stream) if c.config.durable_name}
        out[f"{stream}.durables"] = durables
    async with Client(system.nats_url, names, creds=system.creds("admin")) as c:
        v = await c.view(wid)
    assert v is not None
    out["victim"] = (v.status, v.epoch, sorted((a.attempt_id, a.status, a.epoch, a.fenced, a.promoted) for a in v.attempts.values()))
    jobs = []
    for cluster, cc in kube.items():
        listed = await asyncio.to_thread(cc.batch.list_namespaced_job, "gpuorch", _request_timeout=10)
        jobs += [(cluster, j.metadata.name, j.metadata.uid) for j in listed.items]
    out["jobs"] = sorted(jobs)
    return out


async def forged_messages(system: System, admin: Actor) -> list[str]:
    """Every stored message whose Nats-Msg-Id says it is one of ours."""
    from gpuorch.runtime.shell import replay

    names = system.settings.names
    found = []
    for stream in (names.stream_cmd, names.stream_evt, names.stream_inventory):
        async for r in replay(admin.js, stream, include_undecodable=True):
            if r.headers.get("Nats-Msg-Id", "").startswith("forged-"):
                found.append(f"{stream}:{r.subject}")
    return found


@pytest.fixture(scope="module")
async def victim(system: System) -> str:
    """A workload running on a cluster for the whole module (300 s real time)."""
    s = system.settings
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        wid = await c.submit(train("victim", steps=3000))

        async def running() -> bool:
            v = await c.view(wid)
            assert v is not None and any(a.status == "running" for a in v.attempts.values()), v
            return True

        await assert_eventually(running, timeout=120, interval=0.2)
    admin = await connect_as(system, "admin")
    try:  # settled: the fencer has registered its attempt (the `unchanged` check compares the record)
        fence = await admin.js.key_value(s.names.kv_fence)

        async def registered() -> bool:
            try:
                return (await fence.get(wid)).value is not None
            except nats.js.errors.KeyNotFoundError:
                return False

        await assert_eventually(registered, timeout=60)
    finally:
        await admin.nc.close()
    return wid


@pytest.fixture
async def unchanged(system: System, actors: dict[str, Actor], kube: dict, victim: str):  # type: ignore[no-untyped-def]
    before = await world(system, actors["admin"], kube, victim)
    yield
    after = await world(system, actors["admin"], kube, victim)
    changed = {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
    assert not changed, f"the attack changed: {changed}"
    assert await forged_messages(system, actors["admin"]) == []


def _attempt(victim: str) -> str:
    return f"{victim}-a1"


def _forged_event(kind: str, wid: str) -> bytes:
    """A well-formed body of type `kind` for workload `wid` (what a forger would send)."""
    att = _attempt(wid)
    base: dict[str, Any] = {"type": kind, "workload_id": wid, "at": time.time(), "event_id": f"{att}.{kind}"}
    attempt = {"attempt_id": att, "epoch": 1, "cluster": "alpha"}
    extra: dict[str, dict[str, Any]] = {
        "promoted": {**attempt, "output_path": "/tmp/forged", "result_path": "/tmp/forged"},
        "succeeded": {**attempt, "output_path": "/tmp/forged"},
        "failed": {**attempt, "reason": "forged", "retryable": False},
        "lost": {**attempt, "reason": "forged"},
        "completed": {"attempt_id": att, "result_path": "/tmp/forged"},
        "rejected": {"reason": "forged"},
    }
    if kind in extra:
        base.update(extra[kind])
    elif kind not in ("submitted", "routed", "unroutable", "route-requested", "cancel-requested", "cancelled", "workload-failed"):
        base.update(attempt)
    return json.dumps(base).encode()


# -- 1. identities ---------------------------------------------------------------------------------



async def cancel_refused(reader: Client, victim: str, ref: str, what: str) -> ev.Rejected:
    """The refusal recorded under the cancel's message `ref`; fails at once if the victim was
    cancelled after all."""

    async def refused() -> ev.Rejected:
        if done := [ev.type_tag(e) for _, e in await reader.events(victim) if isinstance(e, (ev.CancelRequested, ev.Cancelled))]:
            pytest.fail(f"{what} was carried out: {done}")
        found = [e for _, e in await reader.events(ref) if isinstance(e, ev.Rejected)]
        assert found, f"no record under {ref}"
        return found[0]

    return await assert_eventually(refused, timeout=30)

async def test_an_anonymous_connection_is_refused(system: System) -> None:
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(system.nats_url, max_reconnect_attempts=0, connect_timeout=2, allow_reconnect=False)


async def test_a_seed_the_server_does_not_know_is_refused(system: System, tmp_path: Path) -> None:
    from gpuorch.security.bundle import new_seed

    (tmp_path / "stranger.nk").write_text(new_seed())
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(system.nats_url, max_reconnect_attempts=0, allow_reconnect=False, nkeys_seed=str(tmp_path / "stranger.nk"))


def test_credentials_are_private_files(system: System) -> None:
    for f in (system.auth_dir / "creds").iterdir():
        assert f.stat().st_mode & 0o777 == 0o600, f
    assert (system.auth_dir / "creds").stat().st_mode & 0o777 == 0o700
    seed = system.creds("router").read_text().strip()
    for log in system.logs.iterdir():  # no seed in any log
        assert seed not in log.read_text(errors="replace"), log


# -- 2. one publisher per event type -----------------------------------------------------------------


async def test_a_client_may_publish_no_lifecycle_event_and_no_snapshot(system: System, actors: dict[str, Actor], victim: str, unchanged: None) -> None:
    names = system.settings.names
    client = actors["client"]
    refusals = await asyncio.gather(*(try_publish(client, names.evt(victim, kind), _forged_event(kind, victim)) for kind in ALL_TYPES))
    assert len(refusals) == len(ALL_TYPES)
    await try_publish(client, names.inventory("alpha"), b"{}")
    await try_publish(client, f"{names.prefix}.cmd.purge-all", b"{}")  # only cmd.submit and cmd.cancel


@pytest.mark.parametrize("service", ["router", "dispatcher", "fencer", "inventory"])
async def test_each_service_publishes_only_its_own_event_types(system: System, actors: dict[str, Actor], victim: str, unchanged: None, service: str) -> None:
    names = system.settings.names
    actor = actors[service]
    others = [k for k, who in EVENT_PUBLISHERS.items() if who != service]
    if service == "inventory":
        others.append("rejected")  # it consumes nothing, so it rejects nothing
    await asyncio.gather(*(try_publish(actor, names.evt(victim, kind), _forged_event(kind, victim)) for kind in others))
    if service != "inventory":
        await try_publish(actor, names.inventory("alpha"))
    await try_publish(actor, names.cmd_submit)


async def test_inventory_publishes_snapshots_only_of_registered_clusters(system: System, actors: dict[str, Actor]) -> None:
    await try_publish(actors["inventory"], system.settings.names.inventory("ghost"))


# -- 3. state only its owner writes ----------------------------------------------------------------


async def test_only_the_fencer_writes_fencing_state_and_only_dispatchers_leases(system: System, actors: dict[str, Actor], victim: str, unchanged: None) -> None:
    names = system.settings.names
    record = encode(msgspec.convert({"epoch": 99, "current_attempt": None}, type=dict))
    attempts = [try_publish(actors[who], f"$KV.{names.kv_fence}.{victim}", record) for who in ("client", "mallory", "router", "dispatcher", "inventory")]
    for who in ("client", "router", "fencer", "inventory"):
        attempts += [
            try_publish(actors[who], f"$KV.{names.kv_owners}.{victim}", b'{"owner": "mallory", "generation": 1}'),
            try_publish(actors[who], f"$KV.{names.kv_owners}.{instance_key('0')}", b'{"instance": "0", "generation": 1, "expires_at": 0, "ended": true}'),
            try_publish(actors[who], f"$KV.{names.kv_staged}.alpha.x", b'{"cluster": "alpha", "ref": "forged@1", "at": 1}'),
        ]
    await asyncio.gather(*attempts)


async def test_only_routers_write_the_admission_lease_and_only_its_one_key(system: System, actors: dict[str, Actor], victim: str, unchanged: None) -> None:
    names = system.settings.names
    forged = b'{"instance": "mallory", "term": 99, "expires_at": 9999999999}'
    attempts = [try_publish(actors[who], f"$KV.{names.kv_admission}.leader", forged) for who in ("client", "mallory", "dispatcher", "fencer", "inventory")]
    attempts.append(try_publish(actors["router"], f"$KV.{names.kv_admission}.other", forged))  # its one key only
    await asyncio.gather(*attempts)


# -- 4. the topology belongs to the admin ----------------------------------------------------------


async def test_nobody_but_the_admin_purges_deletes_or_reconfigures(system: System, actors: dict[str, Actor], victim: str, unchanged: None) -> None:
    names = system.settings.names
    api = "$JS.API"
    router_events = names.durable("router", "events")
    attempts = []
    for who in ("client", "mallory", "router", "dispatcher", "fencer", "inventory"):
        a = actors[who]
        for stream in (names.stream_evt, names.stream_cmd, names.stream_inventory, f"KV_{names.kv_fence}"):
            attempts += [
                try_request(a, f"{api}.STREAM.PURGE.{stream}", b"{}"),
                try_request(a, f"{api}.STREAM.DELETE.{stream}"),
                try_request(a, f"{api}.STREAM.UPDATE.{stream}", json.dumps({"name": stream, "subjects": [">"]}).encode()),
            ]
        attempts += [
            try_request(a, f"{api}.STREAM.MSG.DELETE.{names.stream_evt}", b'{"seq": 1}'),
            try_request(a, f"{api}.STREAM.CREATE.EVIL", b'{"name": "EVIL", "subjects": ["gpuorch.>"]}'),
            try_request(a, f"{api}.CONSUMER.DELETE.{names.stream_evt}.{router_events}"),
            try_request(a, f"{api}.CONSUMER.DELETE.{names.stream_cmd}.{names.durable('router', 'submit')}"),
        ]
    await asyncio.gather(*attempts)


async def test_nobody_pulls_from_or_rewrites_another_identitys_durable(system: System, actors: dict[str, Actor], victim: str, unchanged: None) -> None:
    names = system.settings.names
    api = "$JS.API"
    submit = names.durable("router", "submit")
    events = names.durable("router", "events")
    attempts = [try_request(actors[who], f"{api}.CONSUMER.MSG.NEXT.{names.stream_cmd}.{submit}", b'{"batch": 1}')
                for who in ("client", "mallory", "fencer", "inventory")]
    for who in ("client", "fencer", "dispatcher", "inventory"):
        attempts += [
            try_request(actors[who], f"{api}.CONSUMER.MSG.NEXT.{names.stream_evt}.{events}", b'{"batch": 1}'),
            try_request(actors[who], f"$JS.ACK.{names.stream_evt}.{events}.1.1.1.1.0"),
        ]
    # rewriting the router's durable: by name, or through the name-less create (whose body names it)
    hijack = json.dumps({"stream_name": names.stream_evt, "config": {"name": events, "ack_policy": "explicit", "filter_subject": f"{names.prefix}.evt.none"}}).encode()
    for who in ("client", "fencer", "dispatcher"):
        attempts += [
            try_request(actors[who], f"{api}.CONSUMER.CREATE.{names.stream_evt}.{events}.{names.prefix}.evt.none", hijack),
            try_request(actors[who], f"{api}.CONSUMER.CREATE.{names.stream_evt}", hijack),
        ]
    # the client reads no other stream: not the commands, not a bucket
    attempts += [
        try_request(actors["client"], f"{api}.CONSUMER.CREATE.{names.stream_cmd}.mine.{names.cmd_submit}", b"{}"),
        try_request(actors["client"], f"{api}.STREAM.INFO.KV_{names.kv_fence}"),
        try_request(actors["client"], f"{api}.DIRECT.GET.KV_{names.kv_fence}.$KV.{names.kv_fence}.{victim}"),
    ]
    await asyncio.gather(*attempts)


async def test_a_client_reads_events_through_a_consumer_of_its_own(system: System, client: Client, victim: str) -> None:
    kinds = [ev.type_tag(e) for _, e in await client.events(victim)]
    assert "attempt-created" in kinds
    sub = await client.js.pull_subscribe(system.settings.names.evt_workload(victim), durable=None, stream=system.settings.names.stream_evt,
                                         config=ConsumerConfig(ack_policy=AckPolicy.NONE, inactive_threshold=30.0))  # fmt: skip
    try:
        assert (await sub.fetch(1, timeout=5))[0].subject.startswith(system.settings.names.evt_workload(victim)[:-1])
    finally:
        await sub.unsubscribe()


# -- 5. receivers check what they trust ------------------------------------------------------------


async def test_snapshots_of_unregistered_clusters_or_on_another_clusters_subject_are_refused(system: System, actors: dict[str, Actor], client: Client) -> None:
    names = system.settings.names
    admin = actors["admin"]  # may publish anywhere: what the receiver does is under test
    ghost = ClusterSnapshot(cluster="ghost", reachable=True, observed_at=time.time(), published_at=time.time())
    await admin.js.publish(names.inventory("ghost"), encode(ghost))
    alpha_dead = ClusterSnapshot(cluster="alpha", reachable=False, observed_at=0.0, published_at=time.time(), error="forged")
    await admin.js.publish(names.inventory("beta"), encode(alpha_dead))
    router_log = system.procs["router"].log

    def refused() -> list[str]:
        lines = [json.loads(x) for x in router_log.read_text().splitlines() if '"snapshot.refused"' in x]
        subjects = {x["subject"] for x in lines}
        assert {names.inventory("ghost"), names.inventory("beta")} <= subjects, lines
        return [x["reason"] for x in lines]

    reasons = await assert_eventually(refused, timeout=15)
    assert any("not in this receiver's registry" in r for r in reasons)
    assert any("snapshots go on" in r for r in reasons)
    wid = await client.submit(train("after-ghost", steps=1))
    view = await assert_eventually(lambda: _decided(client, wid), timeout=60)
    assert view.decision is not None
    assert {v.cluster for v in view.decision.verdicts} <= {"alpha", "beta"}, view.decision.verdicts
    assert view.decision.cluster in ("alpha", "beta")
    # the beta subject's last message is the forgery: the real inventory's next one replaces it
    await admin.js.publish(names.inventory("ghost"), b"", headers={"KV-Operation": "PURGE"})


async def test_an_event_moved_to_a_subject_its_body_does_not_name_is_refused(system: System, actors: dict[str, Actor], client: Client, victim: str, unchanged: None) -> None:
    """The reply-subject residual (docs/security.md): an identity that may pull from the event
    stream can have the server copy one of its genuine messages onto another subject, stored there
    once the duplicate window is past. The admin stands in for that copy: the victim's own
    `attempt-created`, byte for byte under a new message id, on another workload's subject and on
    another type's. Each consuming service refuses it with a recorded reason; nothing changes."""
    names = system.settings.names
    admin = actors["admin"]
    genuine = await admin.js.get_last_msg(names.stream_evt, names.evt(victim, "attempt-created"))
    moved = {}
    for subject in (names.evt(f"decoy-{uuid.uuid4().hex[:8]}", "attempt-created"), names.evt(victim, "succeeded")):
        ack = await admin.js.publish(subject, genuine.data, headers={"Nats-Msg-Id": f"moved-{uuid.uuid4().hex[:10]}"})
        moved[ack.seq] = subject

    async def refused() -> list[ev.Rejected]:
        found = [e for _, e in await client.events() if isinstance(e, ev.Rejected) and e.source_stream == names.stream_evt and e.source_sequence in moved]
        assert {r.source_sequence for r in found} == set(moved), found
        return found

    for r in await assert_eventually(refused, timeout=30):
        assert r.reason == "wrong subject" and [e.path for e in r.errors] == ["workload_id"], r
        assert r.source_subject == moved[r.source_sequence] and r.claimed_workload_id == victim, r
        assert "the subject must be evt.<workload_id>.<type> of the body" in r.errors[0].message


async def _decided(client: Client, wid: str) -> Any:
    v = await client.view(wid)
    assert v is not None and v.decision is not None, v
    return v


async def test_a_promotion_whose_path_escapes_the_attempt_directory_is_refused(system: System, actors: dict[str, Actor], client: Client) -> None:
    """As a compromised dispatcher would: a `succeeded` and a `promote-requested` naming a path that
    climbs out of the attempt's directory into another workload's. The fencer derives the source
    from its own records and refuses; nothing is copied, no `promoted`."""
    names = system.settings.names
    wid = await client.submit(train("escape", steps=3000))
    donor = await client.submit(train("donor", steps=1))
    done = await client.wait(donor, timeout=120)
    assert done.status == "completed" and done.promoted_attempt, done

    async def running() -> Any:
        v = await client.view(wid)
        assert v is not None and any(a.status == "running" for a in v.attempts.values()), v
        return v

    view = await assert_eventually(running, timeout=120, interval=0.2)
    [att] = view.attempts.values()
    escape = f"{att.output_path}/../../../{donor}/attempts/{done.promoted_attempt}"  # a1, or a later one if a1 was lost
    assert att.output_path.startswith("file://") and done.result_path, "the donor's outputs are there to steal"
    admin = actors["admin"]
    base = {"workload_id": wid, "at": time.time(), "attempt_id": att.attempt_id, "epoch": att.epoch, "cluster": att.cluster}
    for kind in ("succeeded", "promote-requested"):
        body = encode(msgspec.convert({"type": kind, "event_id": f"compromised-{att.attempt_id}.{kind}", "output_path": escape, **base}, ev.Event))  # type: ignore[arg-type]
        await admin.js.publish(names.evt(wid, kind), body, headers={"Nats-Msg-Id": f"compromised-{att.attempt_id}.{kind}"})

    async def refused() -> ev.Rejected:
        events = [e for _, e in await client.events()]
        if promoted := [e for e in events if isinstance(e, ev.Promoted) and e.workload_id == wid]:
            pytest.fail(f"the fencer promoted {promoted[0].attempt_id} into {promoted[0].result_path}")
        found = [e for e in events if isinstance(e, ev.Rejected) and e.claimed_workload_id == wid and "promotion refused" in e.reason]
        assert found, "no recorded refusal"
        return found[0]

    rej = await assert_eventually(refused, timeout=30)
    assert "is not the attempt's prefix" in rej.reason, rej.reason
    kinds = [ev.type_tag(e) for _, e in await client.events(wid)]
    assert "promoted" not in kinds and "completed" not in kinds, kinds
    assert await manifests_of(system, wid) == {}, "no manifest was written for the workload"
    await client.cancel(wid)


# -- 6. who the submitter is decides what it may do ----------------------------------------------------


async def test_a_submit_as_an_owner_the_identity_may_not_use_is_refused(system: System, actors: dict[str, Actor]) -> None:
    names = system.settings.names
    s = system.settings
    async with Client(s.nats_url, names, creds=system.creds("mallory")) as mallory:
        theirs = await mallory.submit(msgspec.structs.replace(train("as-tests", steps=1)))  # owner "tests"
        ok = train("as-team-x", steps=1)
        mine = await mallory.submit(msgspec.structs.replace(ok, metadata=msgspec.structs.replace(ok.metadata, owner="team-x")))
        # unsigned, and signed by mallory while claiming the client's identity
        body = encode(ev.Submit(workload=train("unsigned", steps=1), at=time.time()))
        await actors["mallory"].js.publish(names.cmd_submit, body, headers={"Nats-Msg-Id": "unsigned-1"})
        signed = sign_headers(system.creds("mallory").read_text(), names.cmd_submit, "spoofed-1", body)
        signed["Gpuorch-Identity"] = system.auth_dir.joinpath("identities.json").read_text() and json.loads(
            system.auth_dir.joinpath("identities.json").read_text())["identities"]["client"]["public_key"]  # fmt: skip
        await actors["mallory"].js.publish(names.cmd_submit, body, headers={"Nats-Msg-Id": "spoofed-1", **signed})

        async def recorded() -> dict[str, ev.Rejected]:
            events = [e for _, e in await mallory.events()]
            if wrong := [e for e in events if isinstance(e, ev.Submitted) and (e.workload_id == theirs or e.idempotency_key in ("unsigned-1", "spoofed-1"))]:
                pytest.fail(f"accepted: {[(e.workload_id, e.idempotency_key, e.workload.metadata.owner) for e in wrong]}")
            out = {e.idempotency_key: e for e in events if isinstance(e, ev.Rejected) and e.idempotency_key}
            keys = {r.idempotency_key for r in out.values()}
            assert {"unsigned-1", "spoofed-1"} <= keys and any("may not submit as owner" in r.reason for r in out.values()), out
            return out

        found = await assert_eventually(recorded, timeout=30)
        assert "unsigned command" in found["unsigned-1"].reason
        assert "does not match" in found["spoofed-1"].reason
        assert (await mallory.wait(mine, timeout=120)).status == "completed"  # its own owner: accepted
        assert (await mallory.view(theirs)) is None or (await mallory.view(theirs)).workload is None
        assert event_id(theirs, "submitted") not in {e.event_id for _, e in await mallory.events(theirs)}


async def test_a_cancel_by_an_identity_that_may_not_use_the_owner_is_refused(system: System, victim: str, unchanged: None) -> None:
    s = system.settings
    async with Client(s.nats_url, s.names, creds=system.creds("mallory")) as mallory:
        ref = await mallory.cancel(victim, reason="mallory wants the GPUs")

        rej = await cancel_refused(mallory, victim, ref, "mallory's cancel")
        assert "may not cancel" in rej.reason and rej.claimed_workload_id == victim, rej


async def test_a_cancel_by_the_router_of_a_workload_that_is_no_pipelines_stage_is_refused(system: System, actors: dict[str, Actor], client: Client, victim: str, unchanged: None) -> None:
    """docs/security.md: the router may cancel the stages of a pipeline it expanded, and nothing
    else. As a compromised router would: a cancel of the victim (a plain workload), signed with
    the router's own seed and published on `cmd.cancel`, which the router may publish on. The
    dispatcher refuses it with a record; the victim runs on (`unchanged`)."""
    names = system.settings.names
    body = encode(ev.Cancel(workload_id=victim, reason="a compromised router wants the GPUs", at=time.time()))
    msg_id = f"router-cancel-{uuid.uuid4().hex[:10]}"  # (not `cancel-<victim>`: another test's cancel may hold that id)
    signed = sign_headers(system.creds("router").read_text(), names.cmd_cancel, msg_id, body)
    ack = await actors["router"].js.publish(names.cmd_cancel, body, headers={"Nats-Msg-Id": msg_id, **signed})
    ref = ev.message_ref(ack.stream, ack.seq)

    rej = await cancel_refused(client, victim, ref, "the router's cancel of a workload that is no pipeline's stage")
    assert "'router' may not cancel" in rej.reason and "stage" in rej.reason and rej.claimed_workload_id == victim, rej
