"""Trace context crosses NATS: the consumer's span continues the producer's trace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.js import JetStreamContext
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gpuorch.runtime import telemetry
from gpuorch.runtime.shell import Publisher
from gpuorch_proto import Names, workload_id_for
from tests.runtime.helpers import Recorder, consumer_settled, running_consumer, submit_json
from tests.support.nats import count, read_all
from tests.support.wait import assert_eventually


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider: TracerProvider = telemetry.setup_tracing("test-hop", exporter=exporter)
    try:
        yield exporter
    finally:
        telemetry.shutdown_tracing(provider)


async def test_trace_id_survives_a_hop_through_nats(
    js: JetStreamContext, names: Names, spans: InMemorySpanExporter
) -> None:
    pub = Publisher(js, names)
    with telemetry.tracer().start_as_current_span("client submit") as root:
        trace_id = root.get_span_context().trace_id
        await pub.publish_raw(names.cmd_submit, submit_json(), msg_id="trace-1")
    rec = Recorder()
    wid = workload_id_for("trace-1", "train-a")
    async with running_consumer(js, names, rec):
        await assert_eventually(lambda: count(js, names.stream_evt, names.evt(wid, "submitted")))
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test")))

    by_name = {s.name: s for s in spans.get_finished_spans()}
    produced = by_name[f"{names.cmd_submit} publish"]
    processed = by_name[f"{names.cmd_submit} process"]
    output = by_name[f"{names.evt(wid, 'submitted')} publish"]
    assert (produced.kind, processed.kind, output.kind) == (
        SpanKind.PRODUCER,
        SpanKind.CONSUMER,
        SpanKind.PRODUCER,
    )
    assert {s.context.trace_id for s in (produced, processed, output)} == {trace_id}
    assert processed.parent is not None and processed.parent.span_id == produced.context.span_id
    assert output.parent is not None and output.parent.span_id == processed.context.span_id
    assert processed.attributes is not None
    assert processed.attributes["messaging.system"] == "nats"
    assert processed.attributes["messaging.destination.name"] == names.cmd_submit
    assert processed.attributes["messaging.message.id"] == "trace-1"
    assert output.attributes is not None and output.attributes["messaging.message.id"] == f"{wid}.submitted"

    # the handler saw the same trace, and the output message carries it on
    assert telemetry.trace_id_hex(rec.calls[0].context) == f"{trace_id:032x}"
    [out_msg] = await read_all(js, names.stream_evt, names.evt(wid, "submitted"))
    assert telemetry.trace_id_hex(telemetry.extract(out_msg.headers)) == f"{trace_id:032x}"


async def test_a_message_without_traceparent_starts_a_new_trace(
    js: JetStreamContext, names: Names, spans: InMemorySpanExporter
) -> None:
    await js.publish(names.cmd_submit, submit_json(), headers={"Nats-Msg-Id": "no-trace"})
    rec = Recorder()
    async with running_consumer(js, names, rec):
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, names.durable("test", "test")))
    [processed] = [s for s in spans.get_finished_spans() if s.name.endswith(" process")]
    assert processed.parent is None
    assert telemetry.trace_id_hex(rec.calls[0].context) == f"{processed.context.trace_id:032x}"


def test_inject_extract_round_trip(spans: InMemorySpanExporter) -> None:
    with telemetry.tracer().start_as_current_span("outer") as span:
        headers = telemetry.inject()
    assert headers["traceparent"].split("-")[1] == f"{span.get_span_context().trace_id:032x}"
    ctx = telemetry.extract(headers)
    assert telemetry.trace_id_hex(ctx) == f"{span.get_span_context().trace_id:032x}"
    assert telemetry.trace_id_hex(telemetry.extract({})) is None


def test_trace_file_gets_one_json_line_per_span_from_every_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(telemetry.TRACE_FILE_ENV, str(path))
    for service in ("router", "dispatcher"):
        provider = telemetry.setup_tracing(service)
        with telemetry.tracer().start_as_current_span(f"{service} work") as parent:
            span = telemetry.start_publish_span("x.evt.w.routed", "w.routed")
            span.end()
        telemetry.shutdown_tracing(provider)
    lines = telemetry.read_trace_file(path)
    assert [(s["service"], s["name"], s["kind"]) for s in lines] == [
        ("router", "x.evt.w.routed publish", "PRODUCER"),
        ("router", "router work", "INTERNAL"),
        ("dispatcher", "x.evt.w.routed publish", "PRODUCER"),
        ("dispatcher", "dispatcher work", "INTERNAL"),
    ]
    child, root = lines[2], lines[3]
    assert child["trace_id"] == root["trace_id"] == f"{parent.get_span_context().trace_id:032x}"
    assert child["parent_span_id"] == root["span_id"] and root["parent_span_id"] is None
    assert child["attributes"]["messaging.system"] == "nats"
    assert child["start_ns"] <= child["end_ns"]


@pytest.mark.parametrize("parent", ["root", "remote-parent", "remote-parent-with-state"])
def test_where_nothing_exports_a_span_is_what_the_sdk_would_make_without_its_cost(parent: str) -> None:
    """With no exporter the runtime makes its non-recording spans itself (`telemetry._start`);
    they must be the SDK's own under ALWAYS_OFF but for the random span id: same trace id (a
    fresh one for a root), flags, trace state, not remote, nothing recorded."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    provider = telemetry.setup_tracing("fast")  # nothing exports: ALWAYS_OFF
    try:
        assert provider.sampler is ALWAYS_OFF
        headers = {
            "root": {},
            "remote-parent": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
            "remote-parent-with-state": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03", "tracestate": "vendor=x"},
        }[parent]
        ctx = telemetry.extract(headers)
        ours = telemetry.start_process_span("a.evt.w.routed", "m-1", ctx, **{"messaging.nats.stream_sequence": 3})
        sdk = TracerProvider(sampler=ALWAYS_OFF).get_tracer("t").start_span("x", context=ctx, kind=SpanKind.CONSUMER)
        a, b = ours.get_span_context(), sdk.get_span_context()
        assert not ours.is_recording() and a.is_valid and a.span_id != b.span_id
        assert (a.trace_flags, a.trace_state, a.is_remote) == (b.trace_flags, b.trace_state, b.is_remote)
        if parent == "root":
            assert a.trace_id != b.trace_id, "a root gets a trace id of its own"
        else:
            assert a.trace_id == b.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
        child = telemetry.start_publish_span("a.evt.w.attempt-created", "m-2", telemetry.span_context(ours, ctx))
        assert child.get_span_context().trace_id == a.trace_id, "its children stay in the trace"
        assert telemetry.inject(telemetry.span_context(child, ctx))["traceparent"].split("-")[1] == f"{a.trace_id:032x}"
    finally:
        telemetry.shutdown_tracing(provider)


_hexes = st.text(alphabet="0123456789abcdefABCDEF-x ", min_size=0, max_size=4)


@settings(max_examples=400, deadline=None)
@given(
    version=st.sampled_from(["00", "01", "ff", "0", "zz"]),
    trace_id=st.one_of(st.sampled_from(["0" * 32, "0af7651916cd43dd8448eb211c80319c", "0AF7651916CD43DD8448EB211C80319C"]),
                       st.text(alphabet="0123456789abcdef", min_size=31, max_size=33)),
    span_id=st.one_of(st.sampled_from(["0" * 16, "b7ad6b7169203331"]), st.text(alphabet="0123456789abcdef", min_size=15, max_size=17)),
    flags=st.sampled_from(["00", "01", "03", "ff", "0g", "1"]),
    tail=_hexes,
    state=st.sampled_from([None, "vendor=x", "a=1,b=2", ""]),
    present=st.booleans(),
)  # fmt: skip
def test_the_fast_reading_of_a_traceparent_is_the_propagators(
    version: str, trace_id: str, span_id: str, flags: str, tail: str, state: str | None, present: bool
) -> None:
    """`telemetry.extract` reads the common header itself; whatever the header, it must find the
    same span context as OpenTelemetry's W3C propagator (or none where the propagator finds none)."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    headers = {"Content-Type": "application/json"}
    if present:
        headers["traceparent"] = f"{version}-{trace_id}-{span_id}-{flags}{tail}"
    if state is not None:
        headers["tracestate"] = state
    ours = trace.get_current_span(telemetry.extract(headers)).get_span_context()
    theirs = trace.get_current_span(
        telemetry._propagator.extract(carrier=dict(headers), context=otel_context.Context())
    ).get_span_context()
    assert ours == theirs
    assert (ours.is_valid, ours.is_remote, ours.trace_flags, ours.trace_state) == (
        theirs.is_valid, theirs.is_remote, theirs.trace_flags, theirs.trace_state
    )  # fmt: skip
