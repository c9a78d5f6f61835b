"""Hostile input never reaches another workload's state (issue 9, the third rule).

While real workloads run through the four service processes, the command subjects are flooded
with garbage, JSON arrays, wrong types, forged ids of the running workloads, unknown schema
versions, huge bodies and unknown `cmd.*` subjects. Every running workload completes with its
events untouched, and every hostile message has a rejection bound to it (its stream and
sequence) that names what is wrong.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from gpuorch.client import Client
from gpuorch.system import System
from gpuorch_proto import encode, type_tag
from gpuorch_proto import events as ev
from gpuorch_proto.events import message_ref
from tests.e2e.workloads import train
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

UNTOUCHED = {"rejected", "cancel-requested", "cancelled", "fence-requested", "fenced", "workload-failed", "lost"}


@dataclass
class Hostile:
    label: str
    subject: str
    payload: bytes
    expect: str  # a fragment of the rejection's reason or of one of its errors
    headers: dict[str, str] | None = None
    seq: int = 0
    stream: str = ""


def _body(wl: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "submit", "workload": msgspec.to_builtins(wl), **extra}


def hostile_messages(system: System, victims: list[str]) -> list[Hostile]:
    n = system.settings.names
    a, b = victims
    bad_gpus = _body(train("forged"))
    bad_gpus["workload"]["spec"]["resources"]["gpus"] = 0.5
    huge = _body(train("huge"))
    huge["workload"]["spec"]["inputs"] = [{"ref": "x" * 240, "size_gb": -1} for _ in range(3000)]
    out = [
        Hostile("garbage", n.cmd_submit, b"\xff\xfe\x00\x13garbage", "undecodable"),
        Hostile("nul-garbage", n.cmd_submit, b"\x00\x01\x02", "undecodable"),
        Hostile("json-array", n.cmd_submit, b'[{"type": "submit"}, 1, 2]', "expected an object"),
        Hostile("json-string", n.cmd_cancel, json.dumps(a).encode(), "expected an object"),
        Hostile("msgpack-junk", n.cmd_submit, b"\x93\x01\x02\x03", "expected an object",
                {"Content-Type": "application/msgpack"}),
        Hostile("cancel-on-submit", n.cmd_submit, encode(ev.Cancel(workload_id=a, at=1.0)), "only 'submit'"),
        Hostile("submit-on-cancel", n.cmd_cancel, encode(ev.Submit(workload=train("x"))), "only 'cancel'"),
        Hostile("event-on-submit", n.cmd_submit,
                encode(ev.Failed(workload_id=a, at=1.0, attempt_id=f"{a}-a1", epoch=1, cluster="alpha", reason="forged",
                                 retryable=False)), "only 'submit'"),
        Hostile("forged-invalid-submit", n.cmd_submit, json.dumps({**bad_gpus, "workload_id": a}).encode(),
                "not a whole number"),
        # a valid submit naming victim b's id: the id is ignored (the router derives ids), so it is its own
        # workload and b is untouched (tests/security covers who may submit what)
        Hostile("forged-record-id", n.cmd_submit, json.dumps(_body(train("y"), workload_id="msg-gpuorch-cmd-1")).encode(),
                "reserved"),
        Hostile("bad-cancel-id", n.cmd_cancel, json.dumps({"type": "cancel", "workload_id": f"{a}.>"}).encode(),
                "is not a workload id"),
        Hostile("huge", n.cmd_submit, json.dumps(huge).encode(), "invalid workload"),
    ]  # fmt: skip
    for version in (0, -1, 2, 99):
        out.append(Hostile(f"cancel-v{version}", n.cmd_cancel,
                           json.dumps({"type": "cancel", "schema_version": version, "workload_id": a}).encode(),
                           f"schema_version {version} not supported; this build reads 1"))  # fmt: skip
        out.append(Hostile(f"submit-v{version}", n.cmd_submit,
                           json.dumps({**_body(train("v")), "schema_version": version, "workload_id": b}).encode(),
                           f"schema_version {version} not supported"))  # fmt: skip
    for sub in ("delete", "purge-all", "submit.extra", "cancel.now"):
        out.append(Hostile(f"unknown-{sub}", f"{n.prefix}.cmd.{sub}",
                           encode(ev.Cancel(workload_id=a, at=1.0)), "unknown command subject"))  # fmt: skip
    return out


def _mentions(r: ev.Rejected, fragment: str) -> bool:
    return fragment in r.reason or any(fragment in e.message for e in r.errors)


async def test_a_flood_of_hostile_commands_touches_no_running_workload(system: System, client: Client, admin: Client) -> None:
    victims = [await client.submit(train(f"victim-{i}", steps=120)) for i in range(2)]

    async def all_running() -> bool:
        for wid in victims:
            v = await client.view(wid)
            assert v is not None and any(a.status == "running" for a in v.attempts.values()), v
        return True

    await assert_eventually(all_running, timeout=90)
    before = {wid: [(s, type_tag(e)) for s, e in await client.events(wid)] for wid in victims}

    flood = hostile_messages(system, victims)
    for h in flood:
        hdrs = {"Nats-Msg-Id": f"flood-{h.label}-{uuid.uuid4().hex[:8]}", **(h.headers or {})}
        # as the admin: a client may not even publish on an unknown cmd.* subject (tests/security);
        # the receivers' own checks are what this flood tests
        hdrs.update(admin.signature_headers(h.subject, hdrs["Nats-Msg-Id"], h.payload))  # authenticated: past the identity check
        ack = await admin.js.publish(h.subject, h.payload, headers=hdrs)
        assert not ack.duplicate, h.label
        h.stream, h.seq = ack.stream, ack.seq

    async def all_recorded() -> dict[str, ev.Rejected]:
        got: dict[str, ev.Rejected] = {}
        for h in flood:
            ref = message_ref(h.stream, h.seq)
            records = [e for _, e in await client.events(ref) if isinstance(e, ev.Rejected)]
            assert records, f"{h.label}: no rejection on evt.{ref}.rejected"
            got[h.label] = records[0]
        return got

    recorded = await assert_eventually(all_recorded, timeout=60)
    for h in flood:
        r = recorded[h.label]
        assert (r.source_stream, r.source_sequence, r.source_subject) == (h.stream, h.seq, h.subject), h.label
        assert r.idempotency_key and r.idempotency_key.startswith(f"flood-{h.label}-"), h.label
        assert _mentions(r, h.expect), (h.label, r.reason, r.errors)
        assert len(encode(r)) < 64_000, h.label
    assert recorded["forged-invalid-submit"].claimed_workload_id == victims[0]

    for wid in victims:
        view = await client.wait(wid, timeout=180)
        assert view.status == "completed", (wid, view.status, view.reason)
        assert len(view.attempts) == 1 and not view.cancel_requested
        events = [(s, type_tag(e)) for s, e in await client.events(wid)]
        assert events[: len(before[wid])] == before[wid], "history rewritten"
        kinds = [k for _, k in events]
        assert not UNTOUCHED & set(kinds), (wid, kinds)
        assert kinds.count("submitted") == 1 and kinds.count("attempt-created") == 1, kinds
        # nothing of the flood is on the workload's own subjects
        assert all(not isinstance(e, ev.Rejected) for _, e in await client.events(wid))

    # and the services still serve: a new workload goes through after the flood
    after = await client.submit(train("after-flood", steps=1))
    assert (await client.wait(after, timeout=120)).status == "completed"
