"""The shared shell against a real nats-server: ack after publish, retries, rejections, dead letters."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest
from nats.js import JetStreamContext

from gpuorch.runtime.bus import connect, ensure_topology
from gpuorch.runtime.natsembed import EmbeddedNats
from gpuorch.runtime.shell import (
    Incoming,
    Publisher,
    Retry,
    consume,
    dead_letter_event_id,
    rejection_event_id,
    replay,
)
from gpuorch_proto import Base, Names, event_id, workload_id_for
from gpuorch_proto.events import Cancel, Rejected, Submit, Submitted, message_ref
from tests.runtime.helpers import (
    Recorder,
    consumer_exists,
    consumer_settled,
    outputs_for_submit,
    running_consumer,
    submit_json,
    workload_obj,
)
from tests.support.nats import count, publish_raw, read_all
from tests.support.wait import assert_eventually


async def rejected_events(js: JetStreamContext, names: Names) -> list[Rejected]:
    return [
        r.event
        for r in await read_all(js, names.stream_evt, names.evt_kind("rejected"))
        if isinstance(r.event, Rejected)
    ]


# -- publishing -------------------------------------------------------------------------------


async def test_duplicate_msg_id_is_dropped_by_jetstream(js: JetStreamContext, names: Names) -> None:
    pub = Publisher(js, names)
    evt = Submitted(
        event_id=event_id("train-a-1", "submitted"),
        workload_id="train-a-1",
        at=1.0,
        workload=msgspec.json.decode(submit_json(), type=Submit).workload,
    )
    first = await pub.publish([evt])
    again = await pub.publish([evt])
    raw = await pub.publish_raw(names.evt("train-a-1", "submitted"), b"{}", msg_id=evt.event_id)
    assert [bool(a.duplicate) for a in first + again] == [False, True]
    assert raw.duplicate is True
    assert await count(js, names.stream_evt, names.evt_all) == 1
    # a different id is a different message
    other = msgspec.structs.replace(evt, event_id=event_id("train-a-1", "submitted", "x"))
    await pub.publish([other])
    assert await count(js, names.stream_evt, names.evt_all) == 2


async def test_publish_keeps_order_and_routes_commands(js: JetStreamContext, names: Names) -> None:
    pub = Publisher(js, names)
    wl = msgspec.json.decode(submit_json(), type=Submit).workload
    submit = Submit(workload=wl, idempotency_key="client-key-1")
    cancel = Cancel(workload_id="w-1", event_id="cancel-1")
    events: list[Base] = [
        Submitted(event_id=event_id("w-1", "submitted", i), workload_id="w-1", at=float(i), workload=wl)
        for i in range(20)
    ]
    acks = await pub.publish([submit, cancel, *events])
    assert len(acks) == 22
    got = await read_all(js, names.stream_evt, names.evt_all)
    assert [r.event.at for r in got if r.event is not None] == [float(i) for i in range(20)]
    cmds = await read_all(js, names.stream_cmd, names.cmd_all)
    assert [(r.subject, r.headers.get("Nats-Msg-Id")) for r in cmds] == [
        (names.cmd_submit, "client-key-1"),
        (names.cmd_cancel, "cancel-1"),
    ]
    assert all(r.headers.get("traceparent") for r in cmds)


# -- the happy path ------------------------------------------------------------------------------


async def test_outputs_are_published_before_the_input_is_acked(js: JetStreamContext, names: Names) -> None:
    durable = names.durable("test", "test")
    unacked_after_publish: list[int] = []

    class Watching(Publisher):
        async def publish(self, events: Sequence[Base], **kw):  # type: ignore[no-untyped-def, override]
            acks = await super().publish(events, **kw)
            info = await js.consumer_info(names.stream_cmd, durable)
            unacked_after_publish.append(info.num_ack_pending)
            return acks

    ack = await publish_raw(js, names.cmd_submit, submit_json(), msg_id="key-1")
    async with running_consumer(js, names, Recorder(), publisher=Watching(js, names)):
        wid = workload_id_for("key-1", "train-a")
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, durable))
        got = await read_all(js, names.stream_evt, names.evt_workload(wid))
    assert unacked_after_publish == [1]  # outputs in the stream, input still unacked
    assert [r.subject for r in got] == [names.evt(wid, "submitted"), names.evt(wid, "route-requested")]
    first = got[0].event
    assert isinstance(first, Submitted) and first.source_sequence == ack.seq
    assert got[0].headers["Nats-Msg-Id"] == event_id(wid, "submitted")


# -- retries and redelivery ----------------------------------------------------------------------


async def test_raising_handler_is_redelivered_and_outputs_published_once(
    js: JetStreamContext, names: Names
) -> None:
    def flaky(inc: Incoming) -> Sequence[Base]:
        if inc.delivered < 3:
            raise ConnectionError("cluster API timed out")
        return outputs_for_submit(inc)

    rec = Recorder(flaky)
    await publish_raw(js, names.cmd_submit, submit_json(), msg_id="key-flaky")
    async with running_consumer(js, names, rec, max_deliver=5):
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test")))
    wid = workload_id_for("key-flaky", "train-a")
    assert rec.deliveries() == [1, 2, 3]
    assert await count(js, names.stream_evt, names.evt(wid, "submitted")) == 1
    assert await count(js, names.stream_evt, names.evt_all) == 2
    assert await rejected_events(js, names) == []


async def test_consumer_killed_after_publishing_but_before_ack_republishes_nothing_new(
    js: JetStreamContext, names: Names, nats_url: str, admin_creds: Path
) -> None:
    """The process dies between publishing the outputs and acking the input: the input is
    redelivered, the handler runs again, and the same deterministic ids are dropped."""
    published = asyncio.Event()

    class DiesAfterPublish(Publisher):
        async def publish(self, events: Sequence[Base], **kw):  # type: ignore[no-untyped-def, override]
            acks = await super().publish(events, **kw)
            published.set()
            await asyncio.Event().wait()  # never returns: the "process" is dead before its ack
            return acks

    rec = Recorder()
    await publish_raw(js, names.cmd_submit, submit_json(name="crashy"), msg_id="key-crash")
    doomed = await connect(nats_url, "doomed", creds=admin_creds)
    doomed_js = doomed.jetstream()
    stop = asyncio.Event()
    task = asyncio.create_task(
        consume(
            doomed_js,
            stream=names.stream_cmd,
            durable=names.durable("test", "test"),
            filter_subject=names.cmd_submit,
            handler=rec,
            publisher=DiesAfterPublish(doomed_js, names),
            names=names,
            stop=stop,
            ack_wait=1.0,
            fetch_timeout=0.5,
        )
    )
    await asyncio.wait_for(published.wait(), 10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await doomed.close()

    wid = workload_id_for("key-crash", "crashy")
    assert await count(js, names.stream_evt, names.evt_workload(wid)) == 2
    async with running_consumer(js, names, rec, ack_wait=1.0):
        await assert_eventually(lambda: len(rec.calls) == 2, timeout=10)
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test")))
    assert rec.deliveries() == [1, 2]
    assert await count(js, names.stream_evt, names.evt(wid, "submitted")) == 1
    assert await count(js, names.stream_evt, names.evt(wid, "route-requested")) == 1


async def test_retry_naks_with_the_requested_delay(js: JetStreamContext, names: Names) -> None:
    stamps: list[float] = []

    def later(inc: Incoming) -> Sequence[Base]:
        stamps.append(time.monotonic())
        if inc.delivered == 1:
            raise Retry(0.6)
        return outputs_for_submit(inc)

    rec = Recorder(later)
    await publish_raw(js, names.cmd_submit, submit_json(), msg_id="key-retry")
    async with running_consumer(js, names, rec):
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test")))
    assert rec.deliveries() == [1, 2]
    assert stamps[1] - stamps[0] >= 0.5


async def test_a_handler_that_always_fails_is_dead_lettered_and_the_next_message_runs(
    js: JetStreamContext, names: Names
) -> None:
    def picky(inc: Incoming) -> Sequence[Base]:
        assert isinstance(inc.event, Submit)
        if inc.event.workload.metadata.name == "doomed":
            raise ValueError("boom")
        return outputs_for_submit(inc)

    rec = Recorder(picky)
    bad = await publish_raw(js, names.cmd_submit, submit_json(name="doomed"), msg_id="key-doomed")
    await publish_raw(js, names.cmd_submit, submit_json(name="fine"), msg_id="key-fine")
    async with running_consumer(js, names, rec, max_deliver=3, handler_name="router.on_command"):
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test")))
    doomed_calls = [c.delivered for c in rec.calls if c.msg_id == "key-doomed"]
    assert doomed_calls == [1, 2, 3]
    [rej] = await rejected_events(js, names)
    # bound to the message, not to the workload it would have been
    assert rej.workload_id == message_ref(names.stream_cmd, bad.seq)
    assert rej.claimed_workload_id == workload_id_for("key-doomed", "doomed")
    assert rej.event_id == dead_letter_event_id(names.stream_cmd, bad.seq, names.durable("test", "test"))
    assert "router.on_command" in rej.reason and "3 times" in rej.reason and "ValueError: boom" in rej.reason
    assert rej.source_sequence == bad.seq and rej.idempotency_key == "key-doomed"
    assert await count(js, names.stream_evt, names.evt(workload_id_for("key-fine", "fine"), "submitted")) == 1


async def test_a_message_that_kills_its_consumer_every_time_is_dead_lettered_not_looped(
    js: JetStreamContext, names: Names, nats_url: str, admin_creds: Path
) -> None:
    """max_deliver=1: the consumer dies during the first delivery; the server's extra delivery
    is dead-lettered without running the handler again."""
    entered = asyncio.Event()

    async def hangs(inc: Incoming) -> Sequence[Base]:
        entered.set()
        await asyncio.Event().wait()
        return []

    await publish_raw(js, names.cmd_submit, submit_json(name="killer"), msg_id="key-killer")
    doomed = await connect(nats_url, "doomed", creds=admin_creds)
    stop = asyncio.Event()
    task = asyncio.create_task(
        consume(
            doomed.jetstream(),
            stream=names.stream_cmd,
            durable=names.durable("test", "test"),
            filter_subject=names.cmd_submit,
            handler=hangs,
            publisher=Publisher(doomed.jetstream(), names),
            names=names,
            stop=stop,
            ack_wait=1.0,
            max_deliver=1,
            fetch_timeout=0.5,
        )
    )
    await asyncio.wait_for(entered.wait(), 10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await doomed.close()

    rec = Recorder()
    async with running_consumer(js, names, rec, ack_wait=1.0, max_deliver=1):
        await assert_eventually(lambda: rejected_events(js, names), timeout=10)
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test")))
    assert rec.calls == []
    [rej] = await rejected_events(js, names)
    assert rej.claimed_workload_id == workload_id_for("key-killer", "killer")
    assert rej.workload_id.startswith("msg-") and rej.workload_id == message_ref(names.stream_cmd, rej.source_sequence or 0)
    assert "did not complete" in rej.reason


# -- poison messages -------------------------------------------------------------------------------


BAD_SUBMITS = [
    pytest.param(b'{"type": "submit", "workload": {', "$", "truncated", id="bad-json"),
    pytest.param(
        submit_json(gpus=0.5), "spec.resources.gpus", "0.5 is not a whole number", id="half-gpu-no-sharing"
    ),
    pytest.param(
        json.dumps({"type": "submit", "workload": {**workload_obj(), "spec": {"command": ["x"]}}}).encode(),
        "spec",
        "missing required field `image`",
        id="missing-image",
    ),
    pytest.param(
        submit_json(gpus="many"), "spec.resources.gpus", "Expected `float`, got `str`", id="gpus-not-a-number"
    ),
    pytest.param(
        msgspec.msgpack.encode({"type": "submit", "workload": workload_obj(gpus=-2)}),
        "spec.resources.gpus",
        "-2 is negative",
        id="msgpack-negative-gpus",
    ),
    pytest.param(
        json.dumps({"type": "teleport", "workload": workload_obj()}).encode(),
        "type",
        "Invalid value 'teleport'",
        id="unknown-tag",
    ),
]


@pytest.mark.parametrize(("payload", "path", "message"), BAD_SUBMITS)
async def test_malformed_submit_yields_rejected_naming_the_field(
    js: JetStreamContext, names: Names, payload: bytes, path: str, message: str
) -> None:
    rec = Recorder()
    ack = await publish_raw(js, names.cmd_submit, payload, msg_id="client-key-7")
    async with running_consumer(js, names, rec):
        [rej] = await assert_eventually(lambda: rejected_events(js, names))
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test")))
    assert rec.calls == []
    assert [(e.path, message in e.message) for e in rej.errors] == [(path, True)], rej.errors
    assert rej.source_subject == names.cmd_submit
    assert rej.source_sequence == ack.seq
    assert rej.idempotency_key == "client-key-7"
    assert rej.claimed_workload_id is not None
    assert rej.claimed_workload_id.endswith(workload_id_for("client-key-7").split("-", 1)[1])
    assert rej.workload_id == message_ref(names.stream_cmd, ack.seq)
    assert rej.event_id == rejection_event_id(names.stream_cmd, ack.seq)
    assert rej.source_stream == names.stream_cmd
    info = await js.consumer_info(names.stream_cmd, names.durable("test", "test"))
    assert info.num_redelivered == 0  # terminated, not retried


async def test_rejection_reports_the_claimed_workload_id_from_body_or_key(
    js: JetStreamContext, names: Names
) -> None:
    with_key = await publish_raw(js, names.cmd_submit, submit_json(name="nice-name", gpus=0.5), msg_id="k-1")
    no_key = await publish_raw(js, names.cmd_submit, b"not json at all")
    own_id = await publish_raw(
        js, names.cmd_submit, b'{"type": "cancel", "workload_id": "w-7", "at": "soon"}', msg_id="k-2"
    )
    async with running_consumer(js, names, Recorder()):
        rejected = await assert_eventually(lambda: _when(rejected_events(js, names), lambda r: len(r) == 3))
    by_seq = {r.source_sequence: r for r in rejected}
    assert by_seq[with_key.seq].claimed_workload_id == workload_id_for("k-1", "nice-name")
    # a valid workload_id in the body wins (the cancel is on the wrong subject too, but its
    # shape is judged first: the record says what is wrong with it)
    assert by_seq[own_id.seq].claimed_workload_id == "w-7"
    assert [e.path for e in by_seq[own_id.seq].errors] == ["at"]
    assert by_seq[no_key.seq].claimed_workload_id is None
    assert by_seq[no_key.seq].idempotency_key is None
    # every record is filed under its message, whatever it claims
    assert {r.workload_id for r in rejected} == {message_ref(names.stream_cmd, seq) for seq in by_seq}


async def _when(aw, cond):  # type: ignore[no-untyped-def]
    value = await aw
    return value if cond(value) else None


async def test_poison_messages_never_stop_the_loop(js: JetStreamContext, names: Names) -> None:
    rec = Recorder()
    await publish_raw(js, names.cmd_submit, b"\xff\xfe\x00garbage", msg_id="p-1")
    await publish_raw(js, names.cmd_submit, submit_json(gpus=0.5), msg_id="p-2")
    await publish_raw(js, names.cmd_submit, b"", msg_id="p-3")
    await publish_raw(js, names.cmd_submit, submit_json(name="good"), msg_id="good-1")
    async with running_consumer(js, names, rec) as task:
        wid = workload_id_for("good-1", "good")
        await assert_eventually(lambda: count(js, names.stream_evt, names.evt(wid, "submitted")))
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test")))
        assert not task.done()
    assert [c.msg_id for c in rec.calls] == ["good-1"]
    assert sorted(r.idempotency_key or "" for r in await rejected_events(js, names)) == ["p-1", "p-2", "p-3"]


async def test_deeply_nested_submits_are_refused_with_the_limit_and_the_path_and_the_loop_goes_on(
    js: JetStreamContext, names: Names
) -> None:
    """Issue 27: 40 submits with deeply nested fields each got "undecodable message $:
    RecursionError: maximum recursion depth exceeded". Each is refused with the depth limit and
    the field path where it was crossed (JSON, and msgpack), its key on the record, and the next
    message is handled."""
    from gpuorch_proto.nesting import MAX_DEPTH

    good = json.loads(submit_json(name="after"))
    acks = []
    for i in range(40):
        levels = (40, 500, 5_000, 50_000)[i % 4]
        labels = b'{"a": ' * levels + b"1" + b"}" * levels
        body = submit_json(name=f"deep-{i}").replace(b'"owner": "team-a"', b'"owner": "team-a", "labels": ' + labels)
        if i % 5 == 4:  # the same document as msgpack: its header bytes walked, not recursed into
            doc = json.loads(submit_json(name=f"deep-{i}"))
            doc["workload"]["metadata"]["labels"] = "here"
            body = msgspec.msgpack.encode(doc).replace(b"\xa4here", b"\x81\xa1a" * levels + b"\x01")
        acks.append(await publish_raw(js, names.cmd_submit, body, msg_id=f"deep-{i}"))
    await publish_raw(js, names.cmd_submit, json.dumps(good).encode(), msg_id="after-1")
    rec = Recorder()
    async with running_consumer(js, names, rec) as task:
        await assert_eventually(lambda: count(js, names.stream_evt, names.evt(workload_id_for("after-1", "after"), "submitted")))
        rejected = await assert_eventually(lambda: _when(rejected_events(js, names), lambda r: len(r) == 40))
        assert not task.done()
    assert [c.msg_id for c in rec.calls] == ["after-1"]
    by_key = {r.idempotency_key: r for r in rejected}
    assert sorted(by_key) == sorted(f"deep-{i}" for i in range(40))
    for i, ack in enumerate(acks):
        r = by_key[f"deep-{i}"]
        assert r.source_sequence == ack.seq
        assert r.reason == "too deeply nested", r.reason
        [err] = r.errors
        assert err.path == "workload.metadata.labels" + ".a" * (MAX_DEPTH - 3), err.path
        assert f"nested more than {MAX_DEPTH} levels deep" in err.message, err.message
        assert "Recursion" not in r.reason + err.message
    info = await js.consumer_info(names.stream_cmd, names.durable("test", "test"))
    assert info.num_redelivered == 0  # each terminated at once, none retried


async def test_redelivered_poison_republishes_the_same_rejection(js: JetStreamContext, names: Names) -> None:
    """Rejection ids are deterministic: handling the same bad input twice records it once."""
    ack = await publish_raw(js, names.cmd_submit, submit_json(gpus=0.5), msg_id="twice")
    for durable in ("first", "second"):  # two independent consumers both see the message
        async with running_consumer(js, names, Recorder(), durable=durable):
            await assert_eventually(
                lambda d=durable: consumer_settled(js, names.stream_cmd, names.durable("test", d))
            )
    [rej] = await rejected_events(js, names)
    assert rej.source_sequence == ack.seq


# -- shutdown ----------------------------------------------------------------------------------------


async def test_consume_returns_promptly_when_stopped(js: JetStreamContext, names: Names) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(
        consume(
            js,
            stream=names.stream_cmd,
            durable=names.durable("test", "idle"),
            filter_subject=names.cmd_submit,
            handler=Recorder(),
            publisher=Publisher(js, names),
            names=names,
            stop=stop,
            fetch_timeout=1.0,
        )
    )
    await assert_eventually(lambda: consumer_exists(js, names.stream_cmd, names.durable("test", "idle")))
    started = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert time.monotonic() - started < 2.0


# -- replay --------------------------------------------------------------------------------------------


async def test_replay_reads_up_to_the_last_sequence_and_skips_undecodable(
    js: JetStreamContext, names: Names
) -> None:
    pub = Publisher(js, names)
    wl = msgspec.json.decode(submit_json(), type=Submit).workload
    assert [r async for r in replay(js, names.stream_evt, names.evt_all)] == []
    await pub.publish(
        [Submitted(event_id=f"a{i}", workload_id="w-a", at=float(i), workload=wl) for i in range(3)]
    )
    await publish_raw(js, names.evt("w-a", "submitted"), b"garbage", msg_id="junk")
    await pub.publish([Submitted(event_id="b0", workload_id="w-b", at=9.0, workload=wl)])

    everything = [r async for r in replay(js, names.stream_evt, names.evt_all)]
    assert [(r.event.workload_id, r.event.at) for r in everything if r.event] == [
        ("w-a", 0.0), ("w-a", 1.0), ("w-a", 2.0), ("w-b", 9.0),
    ]  # fmt: skip
    assert [r.seq for r in everything] == [1, 2, 3, 5]
    only_b = [r async for r in replay(js, names.stream_evt, names.evt_workload("w-b"))]
    assert [r.seq for r in only_b] == [5]
    with_junk = [r async for r in replay(js, names.stream_evt, None, include_undecodable=True)]
    assert [r.event is None for r in with_junk] == [False, False, False, True, False]
    nothing = [r async for r in replay(js, names.stream_evt, names.evt_workload("w-none"))]
    assert nothing == []


async def test_replay_skips_an_event_moved_to_a_subject_its_body_does_not_name(js: JetStreamContext, names: Names) -> None:
    """What the live shell refuses (`subject_problem`), no reader of the log folds: the same
    body under another workload's or another type's subject is skipped, kept only as a record."""
    wl = msgspec.json.decode(submit_json(), type=Submit).workload
    body = msgspec.json.encode(Submitted(event_id="w-a.submitted", workload_id="w-a", at=1.0, workload=wl))
    await publish_raw(js, names.evt("w-a", "submitted"), body, msg_id="own")
    await publish_raw(js, names.evt("w-b", "submitted"), body, msg_id="other-workload")
    await publish_raw(js, names.evt("w-a", "running"), body, msg_id="other-type")
    got = [r async for r in replay(js, names.stream_evt, None, include_undecodable=True)]
    assert [(r.subject, r.event is not None) for r in got] == [
        (names.evt("w-a", "submitted"), True), (names.evt("w-b", "submitted"), False), (names.evt("w-a", "running"), False),
    ]  # fmt: skip
    assert [r.seq async for r in replay(js, names.stream_evt, names.evt_all)] == [got[0].seq]


# -- long handlers, bad outputs, a NATS restart --------------------------------------------------------


async def test_a_handler_slower_than_ack_wait_is_kept_in_progress_not_redelivered(
    js: JetStreamContext, names: Names
) -> None:
    async def slow(inc: Incoming) -> Sequence[Base]:
        await asyncio.sleep(1.3)  # the work itself takes this long (ack_wait is 0.5 s)
        return outputs_for_submit(inc)

    rec = Recorder(slow)
    await publish_raw(js, names.cmd_submit, submit_json(), msg_id="key-slow")
    # two replicas on one durable: a message whose ack_wait lapsed would go to the idle one
    async with (
        running_consumer(js, names, rec, ack_wait=0.5),
        running_consumer(js, names, rec, ack_wait=0.5),
    ):
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test")))
        info = await js.consumer_info(names.stream_cmd, names.durable("test", "test"))
    assert rec.deliveries() == [1]
    assert info.num_redelivered == 0


async def test_an_output_without_a_usable_workload_id_is_retried_not_published(
    js: JetStreamContext, names: Names
) -> None:
    def broken(inc: Incoming) -> Sequence[Base]:
        [submitted, _] = outputs_for_submit(inc)
        return [msgspec.structs.replace(submitted, workload_id="has.dots")]

    rec = Recorder(broken)
    await publish_raw(js, names.cmd_submit, submit_json(), msg_id="key-broken")
    async with running_consumer(js, names, rec, max_deliver=2):
        [rej] = await assert_eventually(lambda: rejected_events(js, names))
    assert rec.deliveries() == [1, 2]
    assert "not a subject token" in rej.reason
    assert await count(js, names.stream_evt, names.evt_kind("submitted")) == 0


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_the_consumer_survives_a_nats_restart(tmp_path: Path, how: str) -> None:
    """`stop`: the server ends the open pull requests as it goes; `kill` (-9): it says nothing,
    so the consumer must notice that its requests are gone (no heartbeat) and ask again."""
    srv = EmbeddedNats(tmp_path / "nats")
    await asyncio.to_thread(srv.start)
    names = Names(prefix="restart")
    nc = await connect(srv.url, "survivor", creds=srv.creds("admin"), reconnect_time_wait=0.1)
    try:
        js = nc.jetstream()
        await ensure_topology(js, names)
        rec = Recorder()
        async with running_consumer(js, names, rec):
            await publish_raw(js, names.cmd_submit, submit_json(name="before"), msg_id="k-before")
            await assert_eventually(lambda: len(rec.calls) == 1)
            await asyncio.to_thread(srv.stop if how == "stop" else srv.kill)
            await asyncio.to_thread(srv.start)
            await assert_eventually(lambda: nc.is_connected, timeout=10)
            await publish_raw(js, names.cmd_submit, submit_json(name="after"), msg_id="k-after")
            await assert_eventually(lambda: "k-after" in [c.msg_id for c in rec.calls], timeout=15)
            if how == "kill":
                # a killed server may not have stored the first ack (acks are not awaited): that
                # message comes again after ack_wait, and its outputs are the same ids
                assert {c.msg_id for c in rec.calls} == {"k-before", "k-after"}
                return
            await assert_eventually(
                lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test"))
            )
        assert [c.msg_id for c in rec.calls] == ["k-before", "k-after"]
        assert await count(js, names.stream_evt, names.evt_kind("submitted")) == 2
    finally:
        await nc.close()
        srv.stop()
