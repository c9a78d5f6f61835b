"""The imperative shell every service shares: consume, decode, call the pure core, publish, ack.

Per input message, in order:

1. bind the message's log context (`logs.message_context`: subject, stream, stream_seq,
   delivered, msg_id, trace_id, event_id, workload_id, type), unbound again when the message is
   done, and open the
   CONSUMER span "<subject> process" as a child of the producer's `traceparent`;
2. decode with `gpuorch_proto.decode_event` and check the subject against the body (a known
   `cmd.*` subject, the command type it takes, `evt.<workload>.<type>` of the body). A
   `ContractError` (or any decode failure, or a handler's `Reject`) publishes a `rejected`
   event naming each bad field path and the input message is terminated (`term`): a poison
   message is recorded, never retried, never dropped silently. The record is bound to the
   message (`evt.msg-<stream>-<seq>.rejected`, `gpuorch_proto.events.message_ref`), never to a
   workload the message names, which is only reported as `claimed_workload_id`;
3. call the handler; publish every output (awaiting every JetStream ack); only then `ack` the
   input. Output event ids are deterministic, so if the process dies between publishing and
   acking, the redelivered input republishes the same `Nats-Msg-Id`s and JetStream drops them;
4. on `Retry(delay)` `nak` with that delay; on any other exception `nak` with a backoff by
   delivery count. On the last allowed delivery (`max_deliver`) the message is dead-lettered
   instead: a `rejected` event says which handler failed, how many times and why, and the input
   is terminated (bound to the message too). The consumer is created with one delivery more than `max_deliver`, so a
   message whose handler kills the process every time is dead-lettered on that extra delivery
   without calling the handler again: no crash loop, no silent drop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import cProfile
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, PubAck
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode

from gpuorch.config import Tuning
from gpuorch.observe import metrics
from gpuorch_proto import (
    Base,
    ContractError,
    Event,
    FieldError,
    Names,
    encode,
    idempotency_key,
    type_tag,
    workload_id_for,
)
from gpuorch_proto.codec import decode_event, is_msgpack
from gpuorch_proto.events import Cancel, Rejected, Submit, message_ref
from gpuorch_proto.nesting import depth_error
from gpuorch_proto.subjects import valid_token

from . import heap, logs, telemetry

log = structlog.get_logger("gpuorch.runtime.shell")

MSG_ID = "Nats-Msg-Id"
CONTENT_TYPE = "Content-Type"
JSON_CONTENT_TYPE = "application/json"
PUBLISH_TIMEOUT = 10.0  # seconds to wait for all acks of one publish() call
#: JetStream's error code for a message whose `Nats-Expected-Last-...-Sequence` does not hold
WRONG_LAST_SEQUENCE = 10071

T = TypeVar("T")


@dataclass(frozen=True)
class Incoming:
    """One decoded input as the handler sees it; `context` has the CONSUMER span current."""

    event: Event
    subject: str
    stream: str
    stream_seq: int
    delivered: int
    headers: dict[str, str]
    msg_id: str | None
    context: Context
    data: bytes = b""  # the body as received (signatures are over these bytes: gpuorch.security.identity)


class Retry(Exception):
    """Raised by a handler: not now, try again after `delay` seconds (nak with delay)."""

    def __init__(self, delay: float = 1.0, reason: str = "retry later") -> None:
        super().__init__(f"{reason} (retry in {delay:g}s)")
        self.delay = float(delay)
        self.reason = reason


class Reject(Exception):
    """Raised by a handler: this message is refused for good. The shell records a `rejected`
    event bound to the message (`evt.<message_ref>.rejected`, never a workload's subject) and
    terminates it, exactly as for an undecodable message."""

    def __init__(
        self, reason: str, errors: Sequence[FieldError] = (), *, claimed_workload_id: str | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.errors = list(errors)
        self.claimed_workload_id = claimed_workload_id


class Fenced(Exception):
    """The stream refused a message published with an expected last sequence that no longer
    holds (`Publisher.publish_fenced`): someone moved the fence since."""


Handler = Callable[[Incoming], Awaitable[Sequence[Base]]]




def default_backoff(delivered: int) -> float:
    """Nak delay after an unexpected handler error: 0.5 s, 1 s, 2 s, ... capped at 30 s."""
    return float(min(0.5 * 2 ** max(delivered - 1, 0), 30.0))


# -- publishing ---------------------------------------------------------------------------------


#: what a handler published itself while it ran (a gate round's releases and decisions, published
#: under the round's fence: `gpuorch_router.service.Router.publish_round`), for its metrics: the
#: shell counts them with the outputs it publishes for the handler (`metrics.handled`)
_PUBLISHED_BY_HANDLER: contextvars.ContextVar[list[Base] | None] = contextvars.ContextVar("published_by_handler", default=None)


class Publisher:
    """Publishes contract messages to their subjects with deterministic `Nats-Msg-Id`s."""

    def __init__(self, js: JetStreamContext, names: Names, *, timeout: float = PUBLISH_TIMEOUT) -> None:
        self.js = js
        self.names = names
        self.timeout = timeout

    def subject_for(self, event: Base) -> str:
        if isinstance(event, Submit):
            return self.names.cmd_submit
        if isinstance(event, Cancel):
            return self.names.cmd_cancel
        if not valid_token(event.workload_id):
            raise ValueError(
                f"{type_tag(event)} event has workload_id {event.workload_id!r}, which is not a subject token"
            )
        return self.names.evt(event.workload_id, type_tag(event))

    @staticmethod
    def msg_id_for(event: Base) -> str | None:
        if event.event_id:
            return event.event_id
        if isinstance(event, Submit) and event.idempotency_key:
            return event.idempotency_key
        return None

    async def publish(self, events: Sequence[Base], *, context: Context | None = None) -> list[PubAck]:
        """Publish all `events` in order and wait for every ack (raises if any failed).

        Messages are written in order on the one connection (so the stream keeps their order);
        the acks are awaited together. One PRODUCER span "<subject> publish" per message, child
        of `context` (default: the current context); its `traceparent` goes in the headers.
        """
        if not events:
            return []
        pending: list[tuple[Span, str, str | None, asyncio.Future[PubAck]]] = []
        try:
            for event in events:
                subject, msg_id, span, headers = self._outgoing(event, context)
                try:
                    fut = await self.js.publish_async(subject, encode(event), headers=headers)
                except BaseException as exc:
                    _end_error(span, exc)
                    raise
                pending.append((span, subject, msg_id, fut))
            results = await asyncio.wait_for(
                asyncio.gather(*(p[3] for p in pending), return_exceptions=True),
                self.timeout,
            )
        except BaseException as exc:
            for span, _, _, fut in pending:
                fut.cancel()
                if span.is_recording():
                    _end_error(span, exc)
            raise
        acks: list[PubAck] = []
        first_error: BaseException | None = None
        for event, (span, subject, msg_id, _), result in zip(events, pending, results, strict=True):
            if isinstance(result, BaseException):
                _end_error(span, result)
                first_error = first_error or result
                continue
            acks.append(_acked(event, span, subject, msg_id, result))
        if first_error is not None:
            raise first_error
        return acks

    async def publish_fenced(
        self, events: Sequence[Base], fence: Mapping[str, str], *, context: Context | None = None
    ) -> list[PubAck]:
        """Publish `events` one after another, each with the `fence` headers (an expected last
        sequence: `gpuorch_router.lease.fence_headers`), so the stream stores each only while
        the fence holds. Raises `Fenced` at the first one refused for it (those before it are
        stored, none after it is sent).

        One request per message, in order, rather than `publish_async`: nats.py 2.16 leaves an
        async publish's future pending when the server answers with an error
        (nats-io/nats.py#985), so a refusal could not be told from a timeout."""
        acks: list[PubAck] = []
        for event in events:
            subject, msg_id, span, headers = self._outgoing(event, context)
            try:
                ack = await self.js.publish(subject, encode(event), headers={**headers, **fence}, timeout=self.timeout)
            except BaseException as exc:
                _end_error(span, exc)
                if isinstance(exc, nats.js.errors.APIError) and exc.err_code == WRONG_LAST_SEQUENCE:
                    raise Fenced(f"{type_tag(event)} {msg_id}: {exc.description}") from None
                raise
            acks.append(_acked(event, span, subject, msg_id, ack))
        return acks

    def _outgoing(self, event: Base, context: Context | None) -> tuple[str, str | None, Span, dict[str, str]]:
        """One message's subject, id, PRODUCER span and headers (its `traceparent`, its id)."""
        subject = self.subject_for(event)
        if (by_handler := _PUBLISHED_BY_HANDLER.get()) is not None:
            by_handler.append(event)
        msg_id = self.msg_id_for(event)
        if msg_id is None:
            log.warning("publish.no_msg_id", subject=subject, type=type_tag(event))
        span = telemetry.start_publish_span(subject, msg_id, context)
        headers = {
            CONTENT_TYPE: JSON_CONTENT_TYPE,
            **telemetry.inject(telemetry.span_context(span, context)),
        }
        if msg_id:
            headers[MSG_ID] = msg_id
        return subject, msg_id, span, headers

    async def publish_raw(
        self,
        subject: str,
        payload: bytes,
        msg_id: str | None = None,
        headers: dict[str, str] | None = None,
        *,
        context: Context | None = None,
    ) -> PubAck:
        """Publish bytes as they are (other systems' commands, tests); traceparent is added."""
        span = telemetry.start_publish_span(subject, msg_id, context)
        hdrs = {**telemetry.inject(telemetry.span_context(span, context)), **(headers or {})}
        if msg_id:
            hdrs[MSG_ID] = msg_id
        try:
            ack = await self.js.publish(subject, payload, headers=hdrs, timeout=self.timeout)
        except BaseException as exc:
            _end_error(span, exc)
            raise
        span.end()
        return ack


def _acked(event: Base, span: Span, subject: str, msg_id: str | None, ack: PubAck) -> PubAck:
    """A stored message's ack: its span ended, counted once (a republished duplicate is not)."""
    if ack.duplicate:
        span.set_attribute("messaging.nats.duplicate", True)
        if logs.debugging:
            log.debug(logs.MSG_DUPLICATE, to=subject, msg_id=msg_id)
    else:
        metrics.published(event)
    span.end()
    return ack


def _end_error(span: Span, exc: BaseException) -> None:
    if isinstance(exc, Exception):
        span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    span.end()


# -- consuming ------------------------------------------------------------------------------------


async def bind_consumer(
    js: JetStreamContext,
    *,
    stream: str,
    durable: str,
    filter_subject: str,
    ack_wait: float,
    max_deliver: int,
    max_ack_pending: int = 1000,
) -> JetStreamContext.PullSubscription:
    """Create (or update) the durable pull consumer and bind to it; idempotent."""
    config = durable_config(durable, filter_subject, ack_wait=ack_wait, max_deliver=max_deliver, max_ack_pending=max_ack_pending)
    await js.add_consumer(stream, config)
    return await js.pull_subscribe_bind(durable=durable, stream=stream)


def durable_config(
    durable: str, filter_subject: str | Sequence[str], *, ack_wait: float, max_deliver: int, max_ack_pending: int = 1000
) -> ConsumerConfig:
    """The durable pull consumer every service reads through (`consume`); several subjects:
    a consumer with `filter_subjects` (only the event types a service reads)."""
    scope: dict[str, Any] = (
        {"filter_subject": filter_subject}
        if isinstance(filter_subject, str)
        else {"filter_subject": filter_subject[0]}
        if len(filter_subject) == 1
        else {"filter_subjects": list(filter_subject)}
    )
    return ConsumerConfig(
        durable_name=durable,
        name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        **scope,
        ack_wait=ack_wait,
        # one extra server delivery: the shell dead-letters on it instead of calling the handler
        max_deliver=max_deliver + 1 if max_deliver > 0 else -1,
        max_ack_pending=max_ack_pending,
    )


async def consume(
    js: JetStreamContext,
    *,
    stream: str,
    durable: str,
    filter_subject: str | Sequence[str],
    handler: Handler,
    publisher: Publisher,
    names: Names,
    stop: asyncio.Event,
    batch: int = 32,
    ack_wait: float = 30.0,
    max_deliver: int = 5,
    fetch_timeout: float = 1.0,
    backoff: Callable[[int], float] = default_backoff,
    handler_name: str | None = None,
    concurrency: int = 1,
    key: Callable[[Msg], str] | None = None,
    unread: Callable[[Msg], bool] | None = None,
) -> None:
    """Run `handler` over a durable pull consumer until `stop` is set (see the module doc).

    `unread(msg)` True: the message is acked as it is, neither decoded nor handled (a consumer
    that another one's messages pass through, such as `guard_commands`).

    `concurrency` > 1: up to that many messages are handled at a time (`_Pipeline`), those with
    the same `key(msg)` (default `workload_key`: the workload token of `evt.<workload>.<type>`;
    `submit_key` for commands: the idempotency key) one after the other in stream order, so
    each workload still sees its events in order; fetching goes on as slots free up. Each
    message is still acked only after its own outputs are.

    Returns within about `fetch_timeout` of `stop` being set (after the message in hand).
    `max_deliver <= 0` means unlimited deliveries (no dead-lettering). Raises
    `nats.errors.ConnectionClosedError` if the connection is closed while `stop` is not set.
    """
    worker = _Worker(
        stream=stream,
        durable=durable,
        handler=handler,
        handler_name=handler_name or durable,
        publisher=publisher,
        names=names,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        backoff=backoff,
    )
    await js.add_consumer(stream, durable_config(durable, filter_subject, ack_wait=ack_wait, max_deliver=max_deliver))
    metrics.consumer_started(worker.handler_name)
    log.info("consumer.started", stream=stream, durable=durable, filter=filter_subject if isinstance(filter_subject, str) else f"{len(filter_subject)} subjects")
    pipeline = _Pipeline(worker, concurrency, key or workload_key) if concurrency > 1 else None
    # Messages are asked for ahead of the handler (`_Pulls`): a window of `batch` (at least twice
    # what the pipeline holds), topped up as it is used, so a busy consumer never waits for a
    # fetch round trip and an idle one has one request open.
    pulls = _Pulls(js, stream, durable, window=max(batch, 2 * concurrency), expires=max(fetch_timeout, 1.0) * 5)
    await pulls.start()
    reminding = asyncio.Event()
    reminder = asyncio.create_task(worker.remind(reminding), name=f"{durable}.in_progress")
    try:
        while not stop.is_set():
            got = await pulls.next(stop, timeout=fetch_timeout)
            if got is None:
                if js._nc.is_closed and not stop.is_set():
                    raise nats.errors.ConnectionClosedError
                if pulls.problem is not None:
                    log.warning("consumer.fetch_error", durable=durable, error=pulls.problem)
                    pulls.problem = None
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=min(fetch_timeout, 1.0))
                metrics.consumer_lag(stream, durable, len(pulls.buf))
                continue
            msg, delivered_at = got
            if unread is not None and unread(msg):
                with contextlib.suppress(Exception):
                    await msg.ack()
                continue
            if time.monotonic() - delivered_at > ack_wait / 2:
                with contextlib.suppress(Exception):
                    await msg.in_progress()  # it waited in the window: its ack_wait began at delivery
            if pipeline is not None:
                await pipeline.submit(msg)
            else:
                await worker.process(msg)
            if not pulls.buf:
                metrics.consumer_lag(stream, durable, msg.metadata.num_pending)
    finally:
        if pipeline is not None:
            await pipeline.drain()  # what is in hand finishes (and is acked) before the consumer goes
        reminding.set()
        await asyncio.gather(reminder, return_exceptions=True)
        await pulls.stop()  # the rest is handed back now rather than after ack_wait
        log.info("consumer.stopped", stream=stream, durable=durable)


class _Pulls:
    """A durable pull consumer's messages as they come, asked for ahead of the handler.

    Pull requests (`$JS.API.CONSUMER.MSG.NEXT`) of up to `window` messages, each open for
    `expires` seconds with idle heartbeats, answered on an inbox of our own whose callback only
    queues: as nats.go's `Consume` and nats.js's `consume` do. A new request is sent whenever
    half the window is free (delivered or ended), so a busy consumer always has messages in hand
    and pays one request per half window instead of a fetch round trip per message (nats-py's
    `fetch` also waits for every message with a timer of its own). The server's status replies
    end requests early (408 expired, 409 with `Nats-Pending-Messages`); if it says nothing at
    all for a few heartbeats (a reconnect drops open requests), the requests count as ended and
    are asked again. Unacknowledged messages stay bounded by the window plus those in hand."""

    HEARTBEAT = 1.0  # seconds between the server's idle heartbeats on an open request

    def __init__(self, js: JetStreamContext, stream: str, durable: str, *, window: int, expires: float) -> None:
        self.nc = js._nc  # the connection the JetStream context publishes on
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.window, self.expires = max(1, window), expires
        self.buf: collections.deque[tuple[Msg, float]] = collections.deque()
        self.ready = asyncio.Event()
        self.asked = 0  # messages asked for by requests still open
        self.heard = time.monotonic()  # the last word from the server on our inbox
        self.problem: str | None = None
        self.inbox = ""
        self.sub: Any = None

    async def start(self) -> None:
        self.inbox = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(self.inbox, cb=self._arrived)

    async def _arrived(self, msg: Msg) -> None:
        self.heard = time.monotonic()
        if msg.reply:  # a message of the stream (status replies have no ack subject)
            self.asked = max(0, self.asked - 1)
            self.buf.append((msg, self.heard))
            self.ready.set()
            return
        headers = msg.headers or {}
        code = str(headers.get("Status", ""))
        if code == "100" or not code:
            return  # an idle heartbeat
        pending = headers.get("Nats-Pending-Messages")
        if pending is not None and str(pending).isdigit():
            self.asked = max(0, self.asked - int(pending))
        elif code in ("404", "408", "409"):
            self.asked = 0  # the request ended without saying how much was left: ask again
        if code not in ("404", "408") and "MaxAckPending" not in str(headers.get("Description", "")):
            self.problem = f"{code} {headers.get('Description', '')}".strip()
        self.ready.set()

    async def _top_up(self) -> None:
        if time.monotonic() - self.heard > 3 * self.HEARTBEAT + 1.0 and self.asked:
            self.asked = 0  # not a word for several heartbeats: the open requests are gone
            self.heard = time.monotonic()
        room = self.window - self.asked - len(self.buf)
        if room < max(1, self.window // 2) or self.nc.is_closed:
            return
        request = {"batch": room, "expires": int(self.expires * 1e9), "idle_heartbeat": int(self.HEARTBEAT * 1e9)}
        try:
            await self.nc.publish(self.next_subject, json.dumps(request).encode(), reply=self.inbox)
        except Exception as exc:  # reconnecting: asked again on the next call
            self.problem = repr(exc)
            return
        self.asked += room
        if not self.asked - room:
            self.heard = time.monotonic()  # the first open request: its heartbeats start now

    async def next(self, stop: asyncio.Event, timeout: float) -> tuple[Msg, float] | None:
        """The next message and when it arrived; None after `timeout` without one, or at `stop`."""
        await self._top_up()
        if not self.buf:
            self.ready.clear()
            waiter = asyncio.ensure_future(self.ready.wait())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait((waiter, stopper), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                stopper.cancel()
            if not self.buf or stop.is_set():
                return None
        return self.buf.popleft()

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            if self.sub is not None:
                await self.sub.unsubscribe()
        while self.buf:
            msg, _ = self.buf.popleft()
            with contextlib.suppress(Exception):
                await msg.nak()


def workload_key(msg: Msg) -> str:
    """`<prefix>.evt.<workload>.<type>` -> the workload token (other subjects: the subject)."""
    parts = msg.subject.split(".")
    return parts[-2] if len(parts) >= 4 and parts[-3] == "evt" else msg.subject


def submit_key(msg: Msg) -> str:
    """A command's idempotency key (`Nats-Msg-Id`): one workload's submits (re-sends included)
    run one after the other, different workloads' at once. Without the header (the key is then
    in the body, read only after decoding) the subject: all such commands in one line, in order."""
    msg_id = (msg.headers or {}).get(MSG_ID)
    return f"key:{msg_id}" if msg_id else msg.subject


class _Pipeline:
    """Messages handled concurrently, up to `limit` in flight; one key's messages in order.

    A message whose key has one in flight waits for it (chained tasks), so each workload still
    sees its events in stream order while the others go on; the consume loop keeps fetching as
    slots free up, so one slow workload holds only its own events.
    """

    def __init__(self, worker: _Worker, limit: int, key: Callable[[Msg], str]) -> None:
        self.worker, self.key = worker, key
        self.slots = asyncio.Semaphore(limit)
        self.limit = limit
        self.in_flight = 0
        self.chains: dict[str, asyncio.Task[None]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def free(self) -> int:
        return self.limit - self.in_flight

    async def submit(self, msg: Msg) -> None:
        await self.slots.acquire()
        self.in_flight += 1
        k = self.key(msg)
        before = self.chains.get(k)

        async def run() -> None:
            try:
                if before is not None:
                    await asyncio.gather(before, return_exceptions=True)
                await self.worker.process(msg)
            except asyncio.CancelledError:
                raise
            except Exception:  # the connection went away mid-message: redelivered after ack_wait
                log.exception("consumer.process_failed", durable=self.worker.durable, subject=msg.subject)
            finally:
                self.in_flight -= 1
                self.slots.release()
                if self.chains.get(k) is task:
                    del self.chains[k]

        task = asyncio.create_task(run())
        self.chains[k] = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self) -> None:
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)


@dataclass
class _Worker:
    stream: str
    durable: str
    handler: Handler
    handler_name: str
    publisher: Publisher
    names: Names
    ack_wait: float
    max_deliver: int
    backoff: Callable[[int], float]
    #: the messages whose handler is running: id -> (message, when it was last said in progress)
    in_hand: dict[int, list[Any]] = field(default_factory=dict)

    async def remind(self, stop: asyncio.Event) -> None:
        """Tell JetStream every ack_wait/2 that each message still in its handler is in progress
        (so a slow handler's message is not redelivered to another replica). One loop for the
        consumer, not a timer per message: almost every handler is done long before."""
        every_s = max(self.ack_wait / 2, 0.05)
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every_s / 2)
            now = time.monotonic()
            for entry in list(self.in_hand.values()):
                if now - entry[1] >= every_s:
                    entry[1] = now
                    with contextlib.suppress(Exception):
                        await entry[0].in_progress()

    async def process(self, msg: Msg) -> None:
        md = msg.metadata
        headers = {str(k): str(v) for k, v in (msg.headers or {}).items()}
        msg_id = headers.get(MSG_ID)
        seq = md.sequence.stream
        delivered = md.num_delivered
        stream = md.stream or self.stream
        parent = telemetry.extract(headers)
        span = telemetry.start_process_span(
            msg.subject,
            msg_id,
            parent,
            **{"messaging.nats.stream_sequence": seq, "messaging.nats.delivered": delivered},
        )
        ctx = telemetry.span_context(span, parent)
        # Every key any line of this message may carry is bound (and so unbound) here: nothing of
        # one message's context is left for the next one's lines, or for the loop's own.
        with logs.message_context(
            subject=msg.subject,
            stream=stream,
            stream_seq=seq,
            delivered=delivered,
            msg_id=msg_id,
            trace_id=telemetry.trace_id_hex(span),
            event_id=None,
            workload_id=None,
            attempt_id=None,
            type=None,
        ):
            try:
                await self._process(msg, headers, msg_id, stream, seq, delivered, ctx, span)
            except Exception as exc:  # the loop must survive anything
                log.exception("msg.shell_error", error=repr(exc))
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                with contextlib.suppress(Exception):
                    await msg.nak(delay=self.backoff(delivered))
            finally:
                span.end()

    def _admit(self, msg: Msg, headers: dict[str, str]) -> Event | ContractError:
        """Decode and check the message against its subject; a ContractError says why not."""
        problem = subject_problem(self.names, msg.subject, None)
        if problem is not None:
            return ContractError("wrong subject", [problem])
        try:
            event = decode_event(msg.data, content_type=headers.get(CONTENT_TYPE))
        except Exception as exc:
            return exc if isinstance(exc, ContractError) else ContractError(
                "undecodable message", [FieldError(path="$", message=f"{type(exc).__name__}: {exc}")]
            )  # fmt: skip
        problem = subject_problem(self.names, msg.subject, event)
        if problem is not None:
            return ContractError("wrong subject", [problem])
        return event

    async def _process(
        self,
        msg: Msg,
        headers: dict[str, str],
        msg_id: str | None,
        stream: str,
        seq: int,
        delivered: int,
        ctx: Context,
        span: Span,
    ) -> None:
        admitted = self._admit(msg, headers)
        if isinstance(admitted, ContractError):
            # poison (also on the server's extra delivery: its own reason, not "did not complete")
            await self._reject(msg, headers, msg_id, stream, seq, admitted, ctx, span)
            return
        event = admitted
        if self.max_deliver > 0 and delivered > self.max_deliver:
            # The server's extra delivery: the handler never finished (process killed, ack lost).
            await self._dead_letter(
                msg, headers, msg_id, stream, seq, event, ctx,
                f"handler {self.handler_name!r} did not complete in {self.max_deliver} deliveries "
                "(process died or ack_wait exceeded each time)",
            )  # fmt: skip
            return
        if event.workload_id:
            logs.remember_trace(event.workload_id, telemetry.trace_id_hex(span))
        # bound, not a context of its own: `process` bound these keys (to None) and unbinds them
        logs.bind_message(
            event_id=event.event_id or None,
            workload_id=event.workload_id or None,
            type=type_tag(event),
            attempt_id=getattr(event, "attempt_id", None),
        )
        await self._handle(msg, headers, msg_id, stream, seq, delivered, event, ctx, span)

    async def _handle(
        self,
        msg: Msg,
        headers: dict[str, str],
        msg_id: str | None,
        stream: str,
        seq: int,
        delivered: int,
        event: Event,
        ctx: Context,
        span: Span,
    ) -> None:
        span.set_attribute("gpuorch.event.type", type_tag(event))
        if event.workload_id:
            span.set_attribute("gpuorch.workload_id", event.workload_id)
        incoming = Incoming(
            event=event,
            subject=msg.subject,
            stream=stream,
            stream_seq=seq,
            delivered=delivered,
            headers=headers,
            msg_id=msg_id,
            context=ctx,
            data=msg.data,
        )
        started = time.monotonic()
        try:
            with telemetry.phase_span(type_tag(event), ctx):  # "routing", "dispatch", "fence", ...
                self.in_hand[id(msg)] = [msg, started]  # `remind` says it is in progress if it takes long
                own: list[Base] = []
                token = _PUBLISHED_BY_HANDLER.set(own)
                try:
                    outputs = await self.handler(incoming)
                finally:
                    _PUBLISHED_BY_HANDLER.reset(token)
                    self.in_hand.pop(id(msg), None)
            await self.publisher.publish(outputs, context=ctx)
        except Reject as r:
            metrics.handled(self.handler_name, "rejected")
            err = ContractError(r.reason, r.errors)
            await self._reject(
                msg, headers, msg_id, stream, seq, err, ctx, span, claimed=r.claimed_workload_id
            )
            return
        except Retry as r:
            metrics.handled(self.handler_name, "retry")
            await self._failed(msg, headers, msg_id, stream, seq, delivered, event, ctx, span, r, r.delay)
            return
        except Exception as exc:
            metrics.handled(self.handler_name, "retry")
            await self._failed(msg, headers, msg_id, stream, seq, delivered, event, ctx, span, exc, None)
            return
        metrics.handled(self.handler_name, "ok", time.monotonic() - started, [*own, *outputs])
        try:
            # Not `ack_sync`: no round trip per message. The outputs are already in the stream
            # (their acks awaited above); if this ack is lost, the redelivery republishes the same
            # ids, which the stream drops, and the handlers are idempotent.
            await msg.ack()
        except Exception as exc:
            log.warning("msg.ack_failed", error=repr(exc))
        # at debug: a line costs about a quarter of the shell's time per message, and the
        # handlers log what they decide (workload.routed, job.created, fence.bumped, ...)
        if logs.debugging:
            log.debug(logs.MSG_PROCESSED, outputs=len(outputs), handler=self.handler_name)

    async def _failed(
        self,
        msg: Msg,
        headers: dict[str, str],
        msg_id: str | None,
        stream: str,
        seq: int,
        delivered: int,
        event: Event,
        ctx: Context,
        span: Span,
        exc: Exception,
        delay: float | None,
    ) -> None:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        why = f"{type(exc).__name__}: {exc}"
        if self.max_deliver > 0 and delivered >= self.max_deliver:
            await self._dead_letter(
                msg, headers, msg_id, stream, seq, event, ctx,
                f"handler {self.handler_name!r} failed {delivered} times (max_deliver={self.max_deliver}); "
                f"last error: {why}",
            )  # fmt: skip
            return
        wait = delay if delay is not None else self.backoff(delivered)
        if isinstance(exc, Retry):
            log.info(logs.MSG_RETRY, reason=exc.reason, delay=wait, handler=self.handler_name)
        else:
            log.warning(logs.MSG_RETRY, error=why, delay=wait, handler=self.handler_name, exc_info=exc)
        await msg.nak(delay=wait)

    async def _record_then_term(self, msg: Msg, rejected: Rejected, ctx: Context, failure_event: str) -> bool:
        """Publish the rejection, then terminate the input; if it cannot be recorded, keep the
        input (nak with backoff) so that nothing is dropped silently. True when terminated."""
        try:
            await self.publisher.publish([rejected], context=ctx)
        except Exception as exc:
            log.warning(failure_event, error=repr(exc))
            await msg.nak(delay=self.backoff(msg.metadata.num_delivered))
            return False
        await msg.term()
        return True

    async def _reject(
        self,
        msg: Msg,
        headers: dict[str, str],
        msg_id: str | None,
        stream: str,
        seq: int,
        err: ContractError,
        ctx: Context,
        span: Span,
        *,
        claimed: str | None = None,
    ) -> None:
        span.set_status(Status(StatusCode.ERROR, "ContractError"))
        ref = message_ref(stream, seq)
        raw = _raw_mapping(msg.data, headers)
        claimed = claimed or _claimed_workload_id(raw, msg_id)
        key = _message_key(raw, msg_id)
        rejected = Rejected(
            event_id=rejection_event_id(stream, seq),
            workload_id=ref,
            at=time.time(),
            reason=_clip(err.reason, MAX_REASON),
            errors=bounded_errors(err.errors),
            source_subject=_clip(msg.subject, MAX_SUBJECT),
            source_sequence=seq,
            source_stream=stream,
            idempotency_key=_clip(key, MAX_KEY) if key else None,
            claimed_workload_id=claimed,
        )
        if not await self._record_then_term(msg, rejected, ctx, "msg.reject_publish_failed"):
            return
        log.warning(
            logs.MSG_REJECTED,
            record=ref,
            claimed_workload_id=claimed,
            reason=rejected.reason,
            errors=[f"{e.path}: {e.message}" for e in rejected.errors],
        )

    async def _dead_letter(
        self,
        msg: Msg,
        headers: dict[str, str],
        msg_id: str | None,
        stream: str,
        seq: int,
        event: Event | None,
        ctx: Context,
        reason: str,
    ) -> None:
        if isinstance(event, Rejected):
            # Never answer a rejection with another one (no feedback loop); it is on record.
            await msg.term()
            log.error(logs.MSG_DEAD_LETTERED, reason=reason, republished=False)
            return
        ref = message_ref(stream, seq)
        raw = _raw_mapping(msg.data, headers)
        claimed = _workload_id_for_event(event, msg_id) or _claimed_workload_id(raw, msg_id)
        key = _message_key(raw, msg_id)
        rejected = Rejected(
            event_id=dead_letter_event_id(stream, seq, self.durable),
            workload_id=ref,
            at=time.time(),
            reason=_clip(reason, MAX_REASON),
            source_subject=_clip(msg.subject, MAX_SUBJECT),
            source_sequence=seq,
            source_stream=stream,
            idempotency_key=_clip(key, MAX_KEY) if key else None,
            claimed_workload_id=claimed,
        )
        if not await self._record_then_term(msg, rejected, ctx, "msg.dead_letter_publish_failed"):
            return
        metrics.handled(self.handler_name, "dead_lettered")
        log.error(logs.MSG_DEAD_LETTERED, record=ref, claimed_workload_id=claimed, reason=rejected.reason)


def rejection_event_id(stream: str, seq: int) -> str:
    """Deterministic and bound to the message: a redelivered poison message republishes the same
    rejection, and every service that reads the same bad message records it once."""
    return f"{message_ref(stream, seq)}.rejected"


def dead_letter_event_id(stream: str, seq: int, durable: str) -> str:
    """Deterministic, bound to the message and per consumer: each handler that gave up on it is on record."""
    return f"{message_ref(stream, seq)}.rejected.{durable}"


# Bounds on a rejection, so that it can always be published (a huge bad body must not yield a
# rejection larger than the server's max payload): at most MAX_ERRORS errors of MAX_TEXT characters.
MAX_ERRORS = 20
MAX_TEXT = 400
MAX_REASON = 1000
MAX_SUBJECT = 256
MAX_KEY = 256


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def bounded_errors(errors: Sequence[FieldError]) -> list[FieldError]:
    out = [
        FieldError(path=_clip(e.path, MAX_SUBJECT), message=_clip(e.message, MAX_TEXT))
        for e in errors[:MAX_ERRORS]
    ]
    if len(errors) > MAX_ERRORS:
        out.append(FieldError(path="$", message=f"... and {len(errors) - MAX_ERRORS} more errors"))
    return out


def subject_problem(names: Names, subject: str, event: Event | None) -> FieldError | None:
    """Why `event` may not arrive on `subject` (None: it may). With `event=None`, only what the
    subject alone says (an unknown command subject). Commands go to `cmd.submit` / `cmd.cancel`,
    one type each; lifecycle events to `evt.<their workload>.<their type>`."""
    cmd = f"{names.prefix}.cmd."
    if subject.startswith(cmd) and subject not in (names.cmd_submit, names.cmd_cancel):
        return FieldError(
            path="$",
            message=f"unknown command subject {_clip(subject, MAX_SUBJECT)!r}: commands go to "
            f"{names.cmd_submit} or {names.cmd_cancel}",
        )
    if event is None:
        return None
    tag = type_tag(event)
    for expected, kind in ((names.cmd_submit, Submit), (names.cmd_cancel, Cancel)):
        if subject == expected and not isinstance(event, kind):
            return FieldError(
                path="type",
                message=f"a {tag!r} message on {subject}: only {type_tag(kind)!r} is accepted here",
            )
    if subject.startswith(f"{names.prefix}.evt."):
        if isinstance(event, (Submit, Cancel)):
            return FieldError(
                path="type",
                message=f"a {tag!r} command on the event subject {subject}: commands go to "
                f"{names.cmd_submit} or {names.cmd_cancel}",
            )
        want = names.evt(event.workload_id, tag) if valid_token(event.workload_id) else None
        if subject != want:
            return FieldError(
                path="workload_id",
                message=f"a {tag!r} event of workload {event.workload_id[:80]!r} on {subject}: "
                "the subject must be evt.<workload_id>.<type> of the body",
            )
    return None


def moved(names: Names, subject: str, event: Event) -> bool:
    """An event on a subject its body does not name (docs/security.md, "Residual: reply subjects"):
    the live shell rejects it (`subject_problem`), so no reader of the log folds it either."""
    return subject.startswith(f"{names.prefix}.evt.") and subject_problem(names, subject, event) is not None


def _event_stream_names(stream_subjects: Sequence[str]) -> Names | None:
    """The `Names` of the event stream (its one subject is `<prefix>.evt.>`); None for another stream."""
    for s in stream_subjects:
        if s.endswith(".evt.>"):
            return Names(s.removesuffix(".evt.>"))
    return None


def _try_decode(data: bytes, headers: dict[str, str]) -> Event | None:
    try:
        return decode_event(data, content_type=headers.get(CONTENT_TYPE))
    except Exception:
        return None


def _workload_id_for_event(event: Event | None, msg_id: str | None) -> str | None:
    if event is None:
        return None
    if event.workload_id and valid_token(event.workload_id):
        return event.workload_id
    if isinstance(event, Submit):
        key = idempotency_key(msg_id, event.idempotency_key)
        if key:
            return workload_id_for(key, event.workload.metadata.name)
    return None


def _message_key(raw: dict[str, Any] | None, msg_id: str | None) -> str | None:
    """The message's idempotency key as the router takes it (`gpuorch_proto.idempotency_key`):
    the `Nats-Msg-Id` header, else a string `idempotency_key` in the raw body. A refused message's
    record carries it, so a client that put its key in the body finds its answer too."""
    body_key = raw.get("idempotency_key") if raw else None
    return idempotency_key(msg_id, body_key if isinstance(body_key, str) else None)


def _claimed_workload_id(raw: dict[str, Any] | None, msg_id: str | None) -> str | None:
    """The workload a message that is being rejected names, for information only.

    A `workload_id` in the raw body (if it is a valid token) wins; else the id the router would
    derive from the idempotency key (`_message_key`) and `metadata.name`; else None. The rejection
    is never published under it: it is the message's record, not that workload's.
    """
    wid = raw.get("workload_id") if raw else None
    if isinstance(wid, str) and wid and valid_token(wid):
        return wid
    key = _message_key(raw, msg_id)
    if key:
        name = "wl"
        wl = raw.get("workload") if raw else None
        meta = (wl if isinstance(wl, dict) else raw or {}).get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("name"), str) and meta["name"]:
            name = meta["name"]
        return workload_id_for(key, name)
    return None


def _raw_mapping(data: bytes, headers: dict[str, str]) -> dict[str, Any] | None:
    """The body as plain data, for what a rejection's record says of it; None when it is not a
    mapping, or nests too deeply to decode (`gpuorch_proto.nesting`: decoders recurse)."""
    msgpack = is_msgpack(data, headers.get(CONTENT_TYPE))
    if depth_error(data, msgpack=msgpack) is not None:
        return None
    try:
        obj = msgspec.msgpack.decode(data) if msgpack else json.loads(data)
    except Exception:
        return None
    return obj if isinstance(obj, dict) else None


async def _accept_all(_: Incoming) -> list[Base]:
    return []


async def guard_commands(
    js: JetStreamContext,
    *,
    names: Names,
    publisher: Publisher,
    stop: asyncio.Event,
    durable: str | None = None,
    **options: Any,
) -> None:
    """A consumer on every command subject (`cmd.>`, which the command stream stores) that
    handles nothing itself: a message on an unknown `cmd.*` subject, a command on the wrong
    subject or an undecodable one is rejected (the same record the command's own consumer makes,
    so it is stored once); everything else is acked. Without it, a message on a subject no
    service consumes would sit in the stream unanswered. Messages on `cmd.submit` and
    `cmd.cancel` are acked unread: their own consumers decode, check and record them."""
    owned = {names.cmd_submit, names.cmd_cancel}
    await consume(
        js, stream=names.stream_cmd, durable=durable or names.durable("guard", "commands"),
        filter_subject=names.cmd_all, handler=_accept_all, publisher=publisher, names=names,
        stop=stop, handler_name="command-guard", unread=lambda m: m.subject in owned, **options,
    )  # fmt: skip


# -- replay ---------------------------------------------------------------------------------------


class Replayed(NamedTuple):
    event: Event | None  # None only with include_undecodable=True
    subject: str
    seq: int
    headers: dict[str, str]


REPLAY_BATCH = 2048  # messages asked for per pull request of a replay


async def replay(
    js: JetStreamContext,
    stream: str,
    filter_subject: str | Sequence[str] | None = None,
    *,
    batch: int = REPLAY_BATCH,
    fetch_timeout: float = 2.0,
    include_undecodable: bool = False,
    start_seq: int = 0,
) -> AsyncIterator[Replayed]:
    """Read `stream` (optionally filtered) from the start (or from `start_seq`: after a state
    snapshot, gpuorch.runtime.snapshot) up to its last sequence at call time.

    For services that rebuild an in-memory projection from the event log at start-up, and for
    clients reading a workload's history. Uses an ephemeral, unacknowledged pull consumer under a
    name of the reader's own, deleted afterwards (`_pulled`). Undecodable messages are skipped
    (logged `replay.skipped`) unless `include_undecodable`, and so are the event stream's events on
    a subject their body does not name (`moved`): the live shell refused them, so a projection
    folded from the log is the one the services folded live.
    """
    info = await js.stream_info(stream)
    last = info.state.last_seq or 0
    if not info.state.messages or start_seq > last:
        return
    names = _event_stream_names(info.config.subjects or [])
    subjects = (
        [filter_subject] if isinstance(filter_subject, str) else list(filter_subject or info.config.subjects or [])
    )
    async for msg in _pulled(js, stream, subjects, last, start_seq, batch, fetch_timeout):
        seq = msg.metadata.sequence.stream
        headers = {str(k): str(v) for k, v in (msg.headers or {}).items()}
        event = _try_decode(msg.data, headers)
        reason = "undecodable" if event is None else None
        if event is not None and names is not None and moved(names, msg.subject, event):
            event, reason = None, "wrong subject"
        if event is None:
            log.warning("replay.skipped", stream=stream, stream_seq=seq, subject=msg.subject, reason=reason)
            if include_undecodable:
                yield Replayed(None, msg.subject, seq, headers)
        else:
            yield Replayed(event, msg.subject, seq, headers)


async def _pulled(
    js: JetStreamContext,
    stream: str,
    subjects: list[str],
    last: int,
    start_seq: int,
    batch: int,
    timeout: float,
) -> AsyncIterator[Msg]:
    """The messages of `subjects` in `stream` up to sequence `last`.

    Pull requests of `batch` (`no_wait`) answered on an inbox of our own, whose callback only
    queues: nats-py's `fetch` waits for each message with a timer of its own, which made a
    replay cost about 80 µs of CPU per event (this about 30). The consumer has a name of ours
    (the permission model refuses name-less creates) and is deleted at the end."""
    nc = js._nc  # the connection the JetStream context publishes on
    name = f"replay-{uuid.uuid4().hex[:16]}"
    start = (
        {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": start_seq}
        if start_seq > 1
        else {"deliver_policy": DeliverPolicy.ALL}
    )
    scope = {"filter_subject": subjects[0]} if len(subjects) == 1 else {"filter_subjects": subjects}
    config = ConsumerConfig(
        name=name, ack_policy=AckPolicy.NONE, inactive_threshold=60.0, mem_storage=True, **scope, **start
    )
    await js.add_consumer(stream, config)
    buf: collections.deque[Msg] = collections.deque()
    status: list[str] = []  # the server's word that a request ended early (404: no messages now)
    ready = asyncio.Event()

    async def cb(msg: Msg) -> None:
        code = (msg.headers or {}).get("Status") if not msg.data else None
        if code:
            status.append(code)
        else:
            buf.append(msg)
        ready.set()

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=cb)
    next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}"
    try:
        asked = 0
        while True:
            if not buf:
                if status or asked == 0:
                    if status and status[-1] not in ("404", "408"):
                        raise RuntimeError(f"replay of {stream}: the server answered {status[-1]}")
                    if status and status[-1] == "404":
                        return  # nothing (more) up to now
                    status.clear()
                    asked = batch
                    await nc.publish(
                        next_subject, json.dumps({"batch": batch, "no_wait": True}).encode(), reply=inbox
                    )
                ready.clear()
                try:
                    await asyncio.wait_for(ready.wait(), timeout=timeout)
                except TimeoutError:
                    ci = await js.consumer_info(stream, name)
                    if not ci.num_pending:
                        return
                    asked = 0  # ask again
                continue
            msg = buf.popleft()
            asked -= 1
            md = msg.metadata
            if md.sequence.stream > last:
                return
            yield msg
            if md.sequence.stream >= last or md.num_pending == 0:
                return
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await js.delete_consumer(stream, name)


# -- service entry point ------------------------------------------------------------------------


def run_service(
    name: str,
    main: Callable[[asyncio.Event], Awaitable[None]],
    *,
    log_level: str | None = None,
) -> Any:
    """Run a service: `serve(name, main)` on a fresh event loop, or return it to be awaited.

    Called from a plain `def main()` (no running loop) it blocks until the service has stopped,
    as `asyncio.run(serve(...))` would. Called inside a running loop it returns the `serve(...)`
    coroutine, so `await run_service(name, main)` works too.
    """
    coro = serve(name, main, log_level=log_level)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return None
    return coro


async def serve(
    name: str,
    main: Callable[[asyncio.Event], Awaitable[None]],
    *,
    log_level: str | None = None,
) -> None:
    """Configure logging and tracing, run `main(stop)` until it returns; SIGTERM/SIGINT set `stop`.

    A second signal cancels `main`. The tracer provider is flushed and shut down on the way out.
    Meanwhile what the service holds is kept out of the cyclic collector's passes (`heap.keep`).
    """
    tuning = Tuning.from_env()
    logs.configure_logging(name, log_level or tuning.log_level)
    provider = telemetry.setup_tracing(name)
    profiler = _start_profile(tuning.profile_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(main(stop))
    keeper = asyncio.ensure_future(heap.keep(stop))

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            log.warning("service.forced_stop", signal=sig.name)
            task.cancel()
        else:
            log.info("service.stopping", signal=sig.name)
            stop.set()

    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    log.info("service.started", pid=os.getpid())
    metrics.start_server(name, log)  # Prometheus text on $GPUORCH_METRICS_PORT (docs/operations.md)
    try:
        await task
    except asyncio.CancelledError:
        if not stop.is_set():
            raise
        log.info("service.cancelled")
    except Exception:
        log.exception("service.crashed")
        raise
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        for sig in installed:
            loop.remove_signal_handler(sig)
        _write_profile(profiler, tuning.profile_dir, name)
        telemetry.shutdown_tracing(provider)
        log.info("service.stopped")


def _start_profile(directory: str) -> cProfile.Profile | None:
    """`GPUORCH_PROFILE=<dir>`: profile this service's event-loop thread (cProfile) until it stops."""
    if not directory:
        return None
    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def _write_profile(profiler: cProfile.Profile | None, directory: str, name: str) -> None:
    """`<dir>/<service>-<pid>.prof` (read with `python -m pstats`, or gpuorch.dev.bench.throughput)."""
    if profiler is None:
        return
    profiler.disable()
    path = Path(directory) / f"{name}-{os.getpid()}.prof"
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(str(path))
        log.info("service.profile_written", path=str(path))
