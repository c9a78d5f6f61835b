"""The event log's byte limit never drops what state still needs: a full log refuses new events."""

from __future__ import annotations

import nats.js.errors
import pytest
from nats.js import JetStreamContext

from gpuorch.runtime import bus
from gpuorch.runtime.shell import Publisher
from gpuorch_proto import Names, encode
from tests.snapshot.histories import MAKERS


async def test_a_full_event_log_refuses_new_events_and_keeps_the_old(
    js: JetStreamContext, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUORCH_EVT_MAX_BYTES", str(64 * 1024))
    await bus.ensure_topology(js, names)  # the admin applies the new limit to the existing stream
    pub = Publisher(js, names, timeout=2.0)
    await pub.publish([MAKERS["submitted"]("w0-a", 0, 1, 1.0)])
    with pytest.raises(nats.js.errors.APIError, match=r"(?i)maximum bytes"):
        for i in range(1, 200):  # ~1 KiB each: the limit is reached well before the end
            e = MAKERS["submitted"](f"w{i}-a", 0, 1, 1.0)
            await js.publish(pub.subject_for(e), encode(e), timeout=2.0)
    with pytest.raises((nats.js.errors.APIError, TimeoutError)):  # a service's publish fails: its input is retried
        await pub.publish([MAKERS["submitted"]("late-a", 0, 1, 1.0)])
    info = await js.stream_info(names.stream_evt)
    assert info.state.first_seq == 1, "nothing old was dropped to make room"
    msg = await js.get_msg(names.stream_evt, 1)
    assert msg.subject == names.evt("w0-a", "submitted")
