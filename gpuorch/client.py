"""A small client for other Python systems (and the CLI): submit, cancel, follow, read state.

Everything here goes over the bus, exactly as a non-Python system would do it:
publish a submit with a `Nats-Msg-Id` idempotency key, read lifecycle events from
`gpuorch.evt.<workload>.>`, fold them into state with the same projection the
services use.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry.context import Context

from gpuorch.projection import Projection, WorkloadView
from gpuorch.runtime import bus, telemetry
from gpuorch.runtime.shell import moved, replay
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
    """`creds`: the client identity's nkey seed file (docs/security.md); a client may publish
    commands and read events and snapshots through consumers of its own, nothing else."""

    def __init__(self, nats_url: str, names: Names, *, creds: str | os.PathLike[str] | None = None, tls: Any = None) -> None:
        self.url = nats_url
        self.names = names
        self.creds = creds
        self.tls = tls
        self.nc: Any = None
        self.js: Any = None

    async def __aenter__(self) -> Client:
        opts = bus.auth_options(self.creds)
        if self.tls is not None:
            opts["tls"] = self.tls
        try:
            self.nc = await nats.connect(self.url, connect_timeout=5, max_reconnect_attempts=3, name="gpuorch-client", **opts)
        except Exception as exc:  # never echo a URL's user:password
            raise ConnectionError(f"could not connect to NATS at {bus.redact_url(self.url)}: {type(exc).__name__}") from None
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
            body = encode(cmd)
            limit = self.nc.max_payload  # the server's; it would close the connection over a larger one
            if len(body) > limit:
                raise ValueError(f"submit body is {len(body):,} bytes: the server's max_payload is {limit:,} bytes")
            headers = {"Nats-Msg-Id": key, **self.signature_headers(self.names.cmd_submit, key, body), **telemetry.inject()}
            await self.js.publish(self.names.cmd_submit, body, headers=headers)
        return wid

    def signature_headers(self, subject: str, msg_id: str, body: bytes) -> dict[str, str]:
        """The command signed with this client's nkey (gpuorch.security.identity): the receiver
        decides what it may do by who signed it, not by what the body says."""
        if not self.creds or Path(self.creds).suffix == ".creds":
            return {}
        from gpuorch.security.identity import sign_headers

        return sign_headers(Path(self.creds).read_text(), subject, msg_id, body)

    async def cancel(self, workload_id: str, reason: str = "requested by user") -> str:
        """Publish a cancel; returns the message's record id (`msg-<stream>-<seq>`): a refusal of
        this cancel (an unknown id, say) is published under it, never under the workload."""
        cmd = ev.Cancel(workload_id=workload_id, reason=reason, at=time.time())
        body, msg_id = encode(cmd), f"cancel-{workload_id}"
        parent = await self.trace_context(workload_id)  # the cancel joins the workload's one trace
        span_attrs = {"messaging.system": "nats", "gpuorch.workload_id": workload_id}
        with telemetry.tracer().start_as_current_span(f"{self.names.cmd_cancel} publish", context=parent, kind=telemetry.SpanKind.PRODUCER, attributes=span_attrs):
            headers = {"Nats-Msg-Id": msg_id, **self.signature_headers(self.names.cmd_cancel, msg_id, body), **telemetry.inject()}
            ack = await self.js.publish(self.names.cmd_cancel, body, headers=headers)
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

    async def pipeline_events(self, pipeline_id: str) -> list[tuple[int, Event]]:
        """A pipeline's events and its children's (stages, trials), in stream order: what
        `gpuorch get <pipeline>` folds into the graph (docs/pipelines.md). A child is known from
        the pipeline's own `pipeline-expanded` record; a large sweep is read in one pass."""
        own = await self.events(pipeline_id)
        children = [c.workload_id for _, e in own if isinstance(e, ev.PipelineExpanded) for c in e.children]
        if not children:
            return own
        if len(children) > 64:  # one pass over the stream beats a replay per child
            ids = {*children, pipeline_id}
            return [(seq, e) for seq, e in await self.events() if e.workload_id in ids]
        every = list(own)
        for got in await asyncio.gather(*(self.events(c) for c in children)):
            every += got
        return sorted(every, key=lambda x: x[0])

    async def follow(self, workload_id: str | None = None, *, from_start: bool = True) -> AsyncIterator[tuple[int, Event]]:
        subject = self.names.evt_workload(workload_id) if workload_id else self.names.evt_all
        # A pull consumer under a name of this client's own (nats-py names it): a client may not use
        # the name-less create of ordered consumers on the event stream (it could rewrite the
        # services' durables), and may not touch their durables by name.
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE, inactive_threshold=60.0, mem_storage=True,
            deliver_policy=DeliverPolicy.ALL if from_start else DeliverPolicy.NEW,
        )  # fmt: skip
        sub = await self.js.pull_subscribe(subject, durable=None, stream=self.names.stream_evt, config=config)
        try:
            while True:
                try:
                    msgs = await sub.fetch(64, timeout=1.0)
                except (TimeoutError, nats.errors.TimeoutError):
                    continue
                for msg in msgs:
                    try:
                        event = decode_event(msg.data)
                    except Exception:  # an undecodable event is shown as nothing, never a crash
                        continue
                    if moved(self.names, msg.subject, event):  # refused by the services: not folded here either
                        continue
                    yield msg.metadata.sequence.stream, event
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            with contextlib.suppress(Exception):
                await self.js.delete_consumer(self.names.stream_evt, sub._consumer)

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
        return {snap.cluster: snap for _subject, snap in await self.snapshot_messages()}

    async def snapshot_messages(self) -> list[tuple[str, ClusterSnapshot]]:
        """The latest snapshot on each inventory subject, with its subject (what the router checks
        a snapshot against: `gpuorch.security.receive.trusted_snapshot`)."""
        out: list[tuple[str, ClusterSnapshot]] = []
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
                out.append((msg.subject, decode_snapshot(msg.data)))
        except Exception:
            pass
        finally:
            await sub.unsubscribe()
        return out
