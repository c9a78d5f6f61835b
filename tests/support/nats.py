"""NATS helpers for tests: count and read what is in a stream, publish raw bytes."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import PubAck

from gpuorch.runtime.shell import Replayed, replay


async def subject_counts(js: JetStreamContext, stream: str, subject_filter: str) -> dict[str, int]:
    """Messages per subject in `stream` matching `subject_filter` (wildcards allowed)."""
    info = await js.stream_info(stream, subjects_filter=subject_filter)
    return dict(info.state.subjects or {})


async def count(js: JetStreamContext, stream: str, subject_filter: str) -> int:
    """How many messages in `stream` match `subject_filter`."""
    return sum((await subject_counts(js, stream, subject_filter)).values())


async def read_all(js: JetStreamContext, stream: str, subject_filter: str | None = None) -> list[Replayed]:
    """Every message (decoded, or event=None if undecodable) currently in `stream`, in order."""
    return [r async for r in replay(js, stream, subject_filter, include_undecodable=True)]


async def publish_raw(
    js: JetStreamContext,
    subject: str,
    payload: bytes,
    msg_id: str | None = None,
    headers: dict[str, str] | None = None,
) -> PubAck:
    """Publish bytes as an outside system would (no trace context unless given in headers)."""
    hdrs = dict(headers or {})
    if msg_id:
        hdrs["Nats-Msg-Id"] = msg_id
    return await js.publish(subject, payload, headers=hdrs or None)
