"""Hostile input through the shell, against a real nats-server (issue 9, defects 6 and 7).

Every rejection and dead letter is bound to the message (`evt.msg-<stream>-<seq>.rejected`);
nothing is ever published on the subject of a workload the message names.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import pytest
import structlog
from nats.js import JetStreamContext
from structlog.testing import LogCapture

from gpuorch.runtime import logs
from gpuorch.runtime.shell import (
    MAX_ERRORS,
    Incoming,
    Publisher,
    Reject,
    dead_letter_event_id,
    guard_commands,
    rejection_event_id,
)
from gpuorch_proto import Base, FieldError, Names, Workload, encode
from gpuorch_proto.events import Cancel, Rejected, Submit, Submitted, message_ref
from tests.runtime.helpers import (
    Recorder,
    consumer_exists,
    consumer_settled,
    running_consumer,
    submit_json,
    workload_obj,
)
from tests.support.nats import count, publish_raw, read_all
from tests.support.wait import assert_eventually

RUNNING = "train-a-0123456789"


async def rejections(js: JetStreamContext, names: Names, n: int | None = None) -> list[Rejected]:
    got = [
        r.event
        for r in await read_all(js, names.stream_evt, names.evt_kind("rejected"))
        if isinstance(r.event, Rejected)
    ]
    assert n is None or len(got) == n, got
    return got


async def settled(js: JetStreamContext, names: Names, durable: str = "test", stream: str | None = None) -> bool:
    return await consumer_settled(js, stream or names.stream_cmd, names.durable("test", durable))


async def test_an_invalid_submit_naming_a_running_workload_is_rejected_as_a_message(
    js: JetStreamContext, names: Names
) -> None:
    """Defect 6: the rejection goes to the message's record, never to the running workload."""
    body = json.loads(submit_json(gpus=0.5))
    body["workload_id"] = RUNNING
    ack = await publish_raw(js, names.cmd_submit, json.dumps(body).encode(), msg_id="attacker-1")
    rec = Recorder()
    async with running_consumer(js, names, rec):
        [rej] = await assert_eventually(lambda: rejections(js, names, 1))
        await assert_eventually(lambda: settled(js, names))
    assert rec.calls == []
    ref = message_ref(names.stream_cmd, ack.seq)
    assert rej.workload_id == ref and rej.event_id == rejection_event_id(names.stream_cmd, ack.seq)
    assert rej.claimed_workload_id == RUNNING  # reported, never acted on
    assert (rej.source_stream, rej.source_sequence, rej.idempotency_key) == (names.stream_cmd, ack.seq, "attacker-1")
    assert await count(js, names.stream_evt, names.evt_workload(RUNNING)) == 0
    assert await count(js, names.stream_evt, names.evt(ref, "rejected")) == 1


async def test_a_handler_that_refuses_a_message_records_it_under_the_message(
    js: JetStreamContext, names: Names
) -> None:
    def refuse(inc: Incoming) -> Sequence[Base]:
        raise Reject("exists with a different body", [FieldError(path="workload", message="differs")],
                     claimed_workload_id=RUNNING)  # fmt: skip

    ack = await publish_raw(js, names.cmd_submit, submit_json(), msg_id="k-refused")
    async with running_consumer(js, names, Recorder(refuse)):
        [rej] = await assert_eventually(lambda: rejections(js, names, 1))
        await assert_eventually(lambda: settled(js, names))
    assert rej.workload_id == message_ref(names.stream_cmd, ack.seq) and rej.claimed_workload_id == RUNNING
    assert rej.reason == "exists with a different body" and [e.path for e in rej.errors] == ["workload"]
    info = await js.consumer_info(names.stream_cmd, names.durable("test", "test"))
    assert info.num_redelivered == 0  # terminated, not retried


async def test_a_dead_letter_is_bound_to_the_message(js: JetStreamContext, names: Names) -> None:
    def boom(inc: Incoming) -> Sequence[Base]:
        raise ValueError("boom")

    cancel = Cancel(workload_id=RUNNING, at=1.0)
    ack = await publish_raw(js, names.cmd_cancel, encode(cancel), msg_id="c-1")
    async with running_consumer(js, names, Recorder(boom), filter_subject=names.cmd_cancel, max_deliver=2):
        [rej] = await assert_eventually(lambda: rejections(js, names, 1))
    durable = names.durable("test", "test")
    assert rej.event_id == dead_letter_event_id(names.stream_cmd, ack.seq, durable)
    assert rej.workload_id == message_ref(names.stream_cmd, ack.seq) and rej.claimed_workload_id == RUNNING
    assert "ValueError: boom" in rej.reason
    assert await count(js, names.stream_evt, names.evt_workload(RUNNING)) == 0


WRONG_TYPE = [
    pytest.param("cmd_submit", encode(Cancel(workload_id=RUNNING, at=1.0)), "type", "only 'submit'", id="cancel-on-submit"),
    pytest.param("cmd_submit", encode(Submitted(workload_id=RUNNING, at=1.0, workload=msgspec.convert(workload_obj(), Workload))), "type", "'submitted' message", id="event-on-submit"),
    pytest.param("cmd_cancel", submit_json(), "type", "only 'cancel'", id="submit-on-cancel"),
]  # fmt: skip


@pytest.mark.parametrize(("subject", "payload", "path", "fragment"), WRONG_TYPE)
async def test_a_well_formed_message_of_the_wrong_type_is_rejected_not_ignored(
    js: JetStreamContext, names: Names, subject: str, payload: bytes, path: str, fragment: str
) -> None:
    rec = Recorder()
    subj = getattr(names, subject)
    ack = await publish_raw(js, subj, payload, msg_id="wrong-type")
    async with running_consumer(js, names, rec, filter_subject=subj):
        [rej] = await assert_eventually(lambda: rejections(js, names, 1))
        await assert_eventually(lambda: settled(js, names))
    assert rec.calls == [], "the handler never sees a message of the wrong type"
    assert rej.reason == "wrong subject" and [e.path for e in rej.errors] == [path]
    assert fragment in rej.errors[0].message, rej.errors
    assert rej.workload_id == message_ref(names.stream_cmd, ack.seq)


async def test_an_unknown_command_subject_is_rejected_by_the_guard(js: JetStreamContext, names: Names) -> None:
    stop = asyncio.Event()
    pub = Publisher(js, names)
    unknown = await publish_raw(js, f"{names.prefix}.cmd.delete-everything", encode(Cancel(workload_id=RUNNING, at=1.0)))
    garbage = await publish_raw(js, f"{names.prefix}.cmd.submit.extra", b"\x00\x01")
    fine = await publish_raw(js, names.cmd_submit, submit_json(), msg_id="fine")
    task = asyncio.create_task(guard_commands(js, names=names, publisher=pub, stop=stop, fetch_timeout=0.5))
    try:
        await assert_eventually(lambda: consumer_exists(js, names.stream_cmd, names.durable("guard", "commands")))
        got = await assert_eventually(lambda: rejections(js, names, 2))
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("guard", "commands")))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    by_seq = {r.source_sequence: r for r in got}
    assert set(by_seq) == {unknown.seq, garbage.seq}, "a good submit is acked, not rejected"
    for ack in (unknown, garbage):
        r = by_seq[ack.seq]
        assert r.reason == "wrong subject" and "unknown command subject" in r.errors[0].message, r
        assert r.workload_id == message_ref(names.stream_cmd, ack.seq)
    assert fine.seq not in by_seq
    assert await count(js, names.stream_evt, names.evt_workload(RUNNING)) == 0


@pytest.mark.parametrize("version", [0, -1, 2, 99])
async def test_a_cancel_of_an_unknown_schema_version_never_reaches_the_handler(
    js: JetStreamContext, names: Names, version: int
) -> None:
    rec = Recorder(lambda inc: [])
    body = json.dumps({"type": "cancel", "schema_version": version, "workload_id": RUNNING}).encode()
    await publish_raw(js, names.cmd_cancel, body, msg_id=f"v{version}")
    async with running_consumer(js, names, rec, filter_subject=names.cmd_cancel):
        [rej] = await assert_eventually(lambda: rejections(js, names, 1))
    assert rec.calls == []
    assert [e.message for e in rej.errors] == [f"schema_version {version} not supported; this build reads 1"]


async def test_a_json_array_is_rejected_as_not_an_object(js: JetStreamContext, names: Names) -> None:
    await publish_raw(js, names.cmd_submit, b'[{"type": "submit"}]', msg_id="array")
    async with running_consumer(js, names, Recorder()):
        [rej] = await assert_eventually(lambda: rejections(js, names, 1))
    [e] = rej.errors
    assert e.path == "$" and e.message.startswith("expected an object") and "array" in e.message, e


async def test_a_huge_bad_body_gets_its_real_rejection_small_enough_to_publish(
    js: JetStreamContext, names: Names
) -> None:
    """A body near the max payload whose errors echo it must not yield an unpublishable rejection
    (which used to end as a dead letter saying the handler "did not complete")."""
    wl = workload_obj()
    wl["spec"]["inputs"] = [{"ref": "x" * 240, "size_gb": -1} for _ in range(3000)]
    payload = json.dumps({"type": "submit", "workload": wl}).encode()
    assert 600_000 < len(payload) < 1_000_000
    await publish_raw(js, names.cmd_submit, payload, msg_id="huge")
    async with running_consumer(js, names, Recorder(), max_deliver=2):
        [rej] = await assert_eventually(lambda: rejections(js, names, 1), timeout=20)
    assert rej.reason == "invalid workload", rej.reason
    assert len(rej.errors) == MAX_ERRORS + 1 and rej.errors[-1].message.startswith("... and ")
    assert len(encode(rej)) < 64_000


@pytest.fixture
def captured_logs() -> Iterator[LogCapture]:
    cap = LogCapture()
    old = structlog.get_config()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, logs.merge_message, cap], cache_logger_on_first_use=False)
    was, logs.debugging = logs.debugging, True  # every level is captured: the shell's debug lines too
    try:
        yield cap
    finally:
        structlog.configure(**old)
        logs.debugging = was


async def test_log_context_is_scoped_to_each_message(
    js: JetStreamContext, names: Names, captured_logs: LogCapture
) -> None:
    """A line never carries the previous message's workload id."""
    await publish_raw(js, names.cmd_submit, submit_json(), msg_id="first")
    bad = await publish_raw(js, names.cmd_submit, b"\x00 not an event", msg_id="second")
    # a good message that binds a workload id, then a bad one
    body = json.loads(encode(Submit(workload=msgspec.json.decode(submit_json(), type=Submit).workload)))
    body["workload_id"] = RUNNING
    good = await publish_raw(js, names.cmd_submit, json.dumps(body).encode(), msg_id="third")
    worse = await publish_raw(js, names.cmd_submit, b"[]", msg_id="fourth")
    async with running_consumer(js, names, Recorder()):
        await assert_eventually(lambda: rejections(js, names, 2))
        await assert_eventually(lambda: settled(js, names))
    lines: list[dict[str, Any]] = captured_logs.entries
    by_seq: dict[int, list[dict[str, Any]]] = {}
    for line in lines:
        if "stream_seq" in line:
            by_seq.setdefault(line["stream_seq"], []).append(line)
    assert any(x.get("workload_id") == RUNNING for x in by_seq[good.seq])
    for seq in (bad.seq, worse.seq):
        assert by_seq[seq], seq
        assert all(x.get("workload_id") is None for x in by_seq[seq]), by_seq[seq]
    outside = [x for x in lines if "stream_seq" not in x]
    assert outside and all("workload_id" not in x for x in outside), outside


async def test_a_poison_message_on_the_event_stream_is_rejected_once_and_not_looped(
    js: JetStreamContext, names: Names
) -> None:
    """An event whose subject does not match its body is refused; the refusal itself is a valid
    event on its own subject, which the same consumer then handles normally."""
    seen: list[str] = []

    def note(inc: Incoming) -> Sequence[Base]:
        seen.append(inc.subject)
        return []

    forged = Submitted(workload_id="someone-else", at=1.0, workload=msgspec.json.decode(submit_json(), type=Submit).workload)
    ack = await publish_raw(js, names.evt(RUNNING, "submitted"), encode(forged), msg_id="forged")
    async with running_consumer(js, names, Recorder(note), stream=names.stream_evt, filter_subject=names.evt_all):
        [rej] = await assert_eventually(lambda: rejections(js, names, 1))
        await assert_eventually(lambda: settled(js, names, stream=names.stream_evt))
    ref = message_ref(names.stream_evt, ack.seq)
    assert rej.workload_id == ref and rej.errors[0].path == "workload_id"
    assert seen == [names.evt(ref, "rejected")]
