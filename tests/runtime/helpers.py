"""Builders and a consumer runner for the runtime tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext

from gpuorch.runtime.shell import Incoming, Publisher, consume
from gpuorch_proto import Base, Names, event_id, workload_id_for
from gpuorch_proto.events import RouteRequested, Submit, Submitted
from tests.support.wait import assert_eventually

IMAGE = "registry.example/team/train@sha256:" + "a" * 64


def workload_obj(name: str = "train-a", gpus: float = 1, **resources: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpuorch/v1",
        "kind": "Workload",
        "metadata": {"name": name, "owner": "team-a"},
        "spec": {
            "image": IMAGE,
            "command": ["python", "train.py"],
            "resources": {"gpus": gpus, **resources},
        },
    }


def submit_json(name: str = "train-a", gpus: float = 1, **resources: Any) -> bytes:
    return json.dumps({"type": "submit", "workload": workload_obj(name, gpus, **resources)}).encode()


def outputs_for_submit(inc: Incoming) -> list[Base]:
    """What a router-like handler emits for a submit: two events with deterministic ids."""
    e = inc.event
    assert isinstance(e, Submit)
    key = e.idempotency_key or inc.msg_id or f"seq-{inc.stream_seq}"
    wid = e.workload_id or workload_id_for(key, e.workload.metadata.name)
    return [
        Submitted(
            event_id=event_id(wid, "submitted"),
            workload_id=wid,
            at=1.0,
            workload=e.workload,
            idempotency_key=key,
            source_sequence=inc.stream_seq,
        ),
        RouteRequested(
            event_id=event_id(wid, "route-requested", 1), workload_id=wid, at=1.0, attempt_number=1
        ),
    ]


@dataclass
class Recorder:
    """A handler that records every call and delegates to `behave` (default: outputs_for_submit)."""

    behave: Callable[[Incoming], Awaitable[Sequence[Base]] | Sequence[Base]] | None = None
    calls: list[Incoming] = field(default_factory=list)

    async def __call__(self, inc: Incoming) -> Sequence[Base]:
        self.calls.append(inc)
        if self.behave is None:
            return outputs_for_submit(inc)
        out = self.behave(inc)
        if asyncio.iscoroutine(out) or isinstance(out, asyncio.Future):
            return await out
        return out  # type: ignore[return-value]

    def deliveries(self) -> list[int]:
        return [c.delivered for c in self.calls]


@contextlib.asynccontextmanager
async def running_consumer(
    js: JetStreamContext,
    names: Names,
    handler: Callable[[Incoming], Awaitable[Sequence[Base]]],
    *,
    durable: str = "test",
    stream: str | None = None,
    filter_subject: str | None = None,
    publisher: Publisher | None = None,
    **options: Any,
) -> AsyncIterator[asyncio.Task[None]]:
    """`consume` in a background task; at exit sets stop and waits for it (re-raising its error)."""
    stop = asyncio.Event()
    options.setdefault("fetch_timeout", 0.5)
    options.setdefault("backoff", lambda n: 0.05)
    task = asyncio.create_task(
        consume(
            js,
            stream=stream or names.stream_cmd,
            durable=names.durable("test", durable),
            filter_subject=filter_subject or names.cmd_submit,
            handler=handler,
            publisher=publisher or Publisher(js, names),
            names=names,
            stop=stop,
            **options,
        )
    )
    try:
        await assert_eventually(
            lambda: (
                task.done() or consumer_exists(js, stream or names.stream_cmd, names.durable("test", durable))
            )
        )
        yield task
    finally:
        stop.set()
        if not task.done():
            await asyncio.wait_for(task, timeout=10)
        elif not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def consumer_settled(js: JetStreamContext, stream: str, durable: str) -> bool:
    """Nothing pending and nothing awaiting an ack on the durable consumer."""
    try:
        info = await js.consumer_info(stream, durable)
    except nats.js.errors.NotFoundError:
        return False
    return info.num_pending == 0 and info.num_ack_pending == 0


async def consumer_exists(js: JetStreamContext, stream: str, durable: str) -> bool:
    try:
        await js.consumer_info(stream, durable)
    except nats.js.errors.NotFoundError:
        return False
    return True
