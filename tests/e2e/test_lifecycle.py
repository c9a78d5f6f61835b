"""End to end through the four service processes, real clusters API, a real program."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from gpuorch.client import Client
from gpuorch.runtime.telemetry import read_trace_file
from gpuorch.system import System
from gpuorch_proto import encode, type_tag
from gpuorch_proto import events as ev
from tests.e2e.workloads import train
from tests.support.system import result_object
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

LIFECYCLE = ["submitted", "routed", "attempt-created", "admitted", "running", "succeeded", "promote-requested", "promoted", "completed"]


async def kinds(client: Client, wid: str) -> list[str]:
    return [type_tag(e) for _, e in await client.events(wid)]


async def test_workload_completes_with_one_promoted_attempt_in_lifecycle_order(system: System, client: Client) -> None:
    wid = await client.submit(train("happy", steps=20))
    view = await client.wait(wid, timeout=120)
    assert view.status == "completed", view.reason
    promoted = [a for a in view.attempts.values() if a.promoted]
    assert len(promoted) == 1 and view.promoted_attempt == promoted[0].attempt_id
    assert promoted[0].cluster == "alpha", "the data lives on alpha: no copy needed there"
    # the output is where the promotion says: the trainer's metrics, written by that attempt
    metrics = json.loads(await result_object(system, view.result_path, "metrics.json"))
    assert metrics["attempt_id"] == promoted[0].attempt_id and metrics["steps"] == 20
    order = await kinds(client, wid)
    assert [k for k in order if k in LIFECYCLE] == LIFECYCLE, order


async def test_one_trace_covers_all_four_services(system: System, client: Client) -> None:
    wid = await client.submit(train("traced", steps=5))
    assert (await client.wait(wid, timeout=120)).status == "completed"
    trace_file = system.state_dir / "spans.jsonl"

    def workload_traces() -> dict[str, set[str]]:
        by_trace: dict[str, set[str]] = {}
        for span in read_trace_file(trace_file):
            attrs = span.get("attributes") or {}
            text = json.dumps(attrs) + span.get("name", "")
            if wid in text:
                by_trace.setdefault(span["trace_id"], set()).add(span["service"])
        return by_trace

    def covered() -> dict[str, set[str]]:
        t = workload_traces()
        assert len(t) == 1, f"expected one trace for {wid}, got {t}"
        services = next(iter(t.values()))
        assert {"router", "dispatcher", "fencer", "inventory"} <= services, services
        return t

    await assert_eventually(covered, timeout=60)  # inventory's span comes with its next round


async def test_duplicate_submit_with_the_same_key_is_one_workload(system: System, client: Client) -> None:
    key = f"dup-{uuid.uuid4().hex}"
    wl = train("dup", steps=3)
    wid1 = await client.submit(wl, idempotency_key=key)
    assert (await client.wait(wid1, timeout=120)).status == "completed"
    # re-sent after the first one finished, and once more with the same key
    wid2 = await client.submit(wl, idempotency_key=key)
    body, subject = encode(ev.Submit(workload=wl, idempotency_key=key)), system.settings.names.cmd_submit
    await client.js.publish(subject, body, headers={"Nats-Msg-Id": key + "-other-transport-id", **client.signature_headers(subject, key + "-other-transport-id", body)})
    assert wid1 == wid2
    marker = await client.submit(train("after-dup", steps=1))
    await client.wait(marker, timeout=120)  # the router has processed everything before it
    order = await kinds(client, wid1)
    assert order.count("submitted") == 1 and order.count("attempt-created") == 1, order


async def test_malformed_submit_is_rejected_naming_the_field(system: System, client: Client) -> None:
    body = json.loads(encode(ev.Submit(workload=train("bad"))))
    body["workload"]["spec"]["resources"]["gpus"] = 0.5
    key = f"bad-{uuid.uuid4().hex}"
    await client.js.publish(system.settings.names.cmd_submit, json.dumps(body).encode(), headers={"Nats-Msg-Id": key})
    await client.js.publish(system.settings.names.cmd_submit, b"{not json", headers={"Nats-Msg-Id": key + "-garbage"})

    async def rejected() -> list[ev.Rejected]:
        out = [e for _, e in await client.events() if isinstance(e, ev.Rejected) and e.idempotency_key in (key, key + "-garbage")]
        assert len(out) == 2, out
        return out

    found = await assert_eventually(rejected, timeout=20)
    by_key = {e.idempotency_key: e for e in found}
    assert any(x.path == "spec.resources.gpus" and "not a whole number" in x.message for x in by_key[key].errors)
    assert by_key[key + "-garbage"].errors, "an undecodable body still says why"
    # and the services are still there: a good workload goes through afterwards
    wid = await client.submit(train("after-bad", steps=1))
    assert (await client.wait(wid, timeout=120)).status == "completed"


async def test_cancel_a_running_workload_leaves_no_job(system: System, client: Client, kube: dict) -> None:
    wid = await client.submit(train("cancel-me", steps=400))

    async def running() -> bool:
        v = await client.view(wid)
        return v is not None and any(a.status == "running" for a in v.attempts.values())

    await assert_eventually(running, timeout=60)
    await client.cancel(wid)
    view = await client.wait(wid, timeout=60)
    assert view.status == "cancelled"
    assert all(a.cancel_confirmed for a in view.attempts.values())
    for cc in kube.values():
        jobs = cc.batch.list_namespaced_job("gpuorch", label_selector=f"gpuorch.io/workload={wid}", _request_timeout=(2, 5))
        assert jobs.items == [], f"job left on {cc.name}"
        pods = cc.core.list_namespaced_pod("gpuorch", label_selector=f"gpuorch.io/workload={wid}", _request_timeout=(2, 5))
        assert pods.items == [], f"pod left on {cc.name}"


@pytest.mark.parametrize("service", ["router", "dispatcher", "fencer", "inventory"])
async def test_kill_9_of_a_service_mid_flight_then_restart_completes_exactly_once(system: System, client: Client, service: str) -> None:
    wid = await client.submit(train(f"kill-{service}", steps=30))

    async def in_flight() -> bool:
        v = await client.view(wid)
        return v is not None and bool(v.attempts)

    await assert_eventually(in_flight, timeout=60)
    system.kill(service)
    started = time.monotonic()
    system.restart(service)
    assert time.monotonic() - started < 60
    view = await client.wait(wid, timeout=120)
    assert view.status == "completed", view.reason
    order = await kinds(client, wid)
    assert order.count("promoted") == 1 and order.count("completed") == 1, order
    assert sum(1 for a in view.attempts.values() if a.promoted) == 1
