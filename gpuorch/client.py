"""A small client for other Python systems (and the CLI): submit, cancel, follow, read state.

Everything here goes over the bus, exactly as a non-Python system would do it:
publish a submit with a `Nats-Msg-Id` idempotency key, read lifecycle events from
`gpuorch.evt.<workload>.>`, fold them into state with the same projection the
services use.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
from nats.js.api import DeliverPolicy
from opentelemetry.context import Context

from gpuorch.projection import Projection, WorkloadView
from gpuorch.runtime import telemetry
from gpuorch.runtime.shell import replay
from gpuorch_proto import (
    ClusterSnapshot,
    Event,
    Names,
    Workload,
    decode_event,
    decode_snapshot,
    encode,
    workload_id_for,
)
from gpuorch_proto import events as ev
from gpuorch_proto.subjects import valid_token


class Client:
    def __init__(self, nats_url: str, names: Names) -> None:
        self.url = nats_url
        self.names = names
        self.nc: Any = None
        self.js: Any = None

    async def __aenter__(self) -> Client:
        self.nc = await nats.connect(self.url, connect_timeout=5, max_reconnect_attempts=3, name="gpuorch-client")
        self.js = self.nc.jetstream()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    async def submit(self, workload: Workload, idempotency_key: str | None = None) -> str:
        """Publish a submit; returns the workload id (deterministic from the key)."""
        key = idempotency_key or uuid.uuid4().hex
        wid = workload_id_for(key, workload.metadata.name)
        cmd = ev.Submit(workload=workload, idempotency_key=key, at=time.time())
        tracer = telemetry.tracer()
        with tracer.start_as_current_span(f"{self.names.cmd_submit} publish", kind=telemetry.SpanKind.PRODUCER, attributes={"messaging.system": "nats", "gpuorch.workload": wid}):
            headers = {"Nats-Msg-Id": key, **telemetry.inject()}
            await self.js.publish(self.names.cmd_submit, encode(cmd), headers=headers)
        return wid

    async def cancel(self, workload_id: str, reason: str = "requested by user") -> str:
        """Publish a cancel; returns the message's record id (`msg-<stream>-<seq>`): a refusal of
        this cancel (an unknown id, say) is published under it, never under the workload."""
        cmd = ev.Cancel(workload_id=workload_id, reason=reason, at=time.time())
        parent = await self.trace_context(workload_id)  # the cancel joins the workload's one trace
        span_attrs = {"messaging.system": "nats", "gpuorch.workload_id": workload_id}
        with telemetry.tracer().start_as_current_span(f"{self.names.cmd_cancel} publish", context=parent, kind=telemetry.SpanKind.PRODUCER, attributes=span_attrs):
            ack = await self.js.publish(self.names.cmd_cancel, encode(cmd), headers={"Nats-Msg-Id": f"cancel-{workload_id}", **telemetry.inject()})
        return ev.message_ref(ack.stream, ack.seq)

    async def trace_context(self, workload_id: str) -> Context | None:
        """The trace context of the workload's `submitted` event (None for an unknown id)."""
        if not valid_token(workload_id):
            return None
        async for _evt, _subject, _seq, headers in replay(self.js, self.names.stream_evt, self.names.evt(workload_id, "submitted")):
            if headers.get("traceparent"):
                return telemetry.extract(headers)
        return None

    async def events(self, workload_id: str | None = None) -> list[tuple[int, Event]]:
        subject = self.names.evt_workload(workload_id) if workload_id else self.names.evt_all
        out: list[tuple[int, Event]] = []
        async for evt, _subject, seq, _headers in replay(self.js, self.names.stream_evt, subject):
            if evt is not None:
                out.append((seq, evt))
        return out

    async def follow(self, workload_id: str | None = None, *, from_start: bool = True) -> AsyncIterator[tuple[int, Event]]:
        subject = self.names.evt_workload(workload_id) if workload_id else self.names.evt_all
        queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

        async def cb(msg: Any) -> None:
            try:
                queue.put_nowait((msg.metadata.sequence.stream, decode_event(msg.data)))
            except Exception:  # an undecodable event is shown as nothing, never a crash
                return

        sub = await self.js.subscribe(subject, cb=cb, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL if from_start else DeliverPolicy.NEW)
        try:
            while True:
                yield await queue.get()
        finally:
            await sub.unsubscribe()

    async def projection(self, workload_id: str | None = None) -> Projection:
        p = Projection()
        for seq, e in await self.events(workload_id):
            p.apply(e, seq)
        return p

    async def view(self, workload_id: str) -> WorkloadView | None:
        return (await self.projection(workload_id)).get(workload_id)

    async def wait(self, workload_id: str, timeout: float = 300.0) -> WorkloadView:
        """Follow a workload until it is terminal; returns its final view."""
        p = Projection()

        async def run() -> WorkloadView:
            async for seq, e in self.follow(workload_id):
                v = p.apply(e, seq)
                if v is not None and v.terminal:
                    return v
            raise RuntimeError("event stream ended")

        return await asyncio.wait_for(run(), timeout)

    async def snapshots(self) -> dict[str, ClusterSnapshot]:
        out: dict[str, ClusterSnapshot] = {}
        try:
            info = await self.js.stream_info(self.names.stream_inventory)
        except Exception:
            return out
        if info.state.messages == 0:
            return out
        sub = await self.js.subscribe(self.names.inventory_all, ordered_consumer=True, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
        try:
            for _ in range(info.state.messages):
                msg = await sub.next_msg(timeout=2)
                snap = decode_snapshot(msg.data)
                out[snap.cluster] = snap
        except Exception:
            pass
        finally:
            await sub.unsubscribe()
        return out
