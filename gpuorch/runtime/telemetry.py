"""OpenTelemetry tracing over NATS: W3C trace context in message headers.

A workload is one trace: the submit's `traceparent` header is extracted by the consumer, the
consumer's "<subject> process" span is the parent of every "<subject> publish" span it causes,
and so on through every service.

`setup_tracing(service)` installs a TracerProvider. With `GPUORCH_TRACE_FILE=/path` every
finished span is appended as one JSON line to that file (several processes may share it), which
is how the end-to-end tests assert on whole traces. The standard OpenTelemetry variables select
an OTLP exporter for a collector (`OTEL_TRACES_EXPORTER=otlp`, or any
`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`; the official HTTP/protobuf exporter, which reads the
rest of `OTEL_EXPORTER_OTLP_*` itself; spans are batched per `OTEL_BSP_*`).

Besides the messaging spans, each phase of a workload's life is a span of its own: the
handler that decides it runs inside `phase_span` ("routing", "dispatch", "fence", "promotion",
"cancel"), and the dispatcher records every attempt as a span "attempt <id>" with one child per
phase of its timeline (`gpuorch.observe.spans`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gpuorch.config import Tuning

__all__ = [
    "TRACE_FILE_ENV",
    "JsonlSpanExporter",
    "SpanKind",
    "extract",
    "inject",
    "read_trace_file",
    "setup_tracing",
    "shutdown_tracing",
    "span_context",
    "start_process_span",
    "start_publish_span",
    "trace_id_hex",
    "tracer",
]

TRACE_FILE_ENV = "GPUORCH_TRACE_FILE"
INSTRUMENTATION = "gpuorch.runtime"

_propagator = TraceContextTextMapPropagator()
_ids = RandomIdGenerator()
_provider: TracerProvider | None = None
_tracer: tuple[TracerProvider, Tracer] | None = (
    None  # the tracer of the provider in use (get_tracer costs ~0.2 ms)
)
_global_set = False
_service = ""  # the service that set up tracing in this process

#: (service, type of the input) -> the phase of a workload's life its handler decides
PHASES: dict[tuple[str, str], str] = {
    ("router", "submit"): "routing",
    ("router", "route-requested"): "routing",
    ("dispatcher", "routed"): "dispatch",
    ("dispatcher", "cancel"): "cancel",
    ("fencer", "fence-requested"): "fence",
    ("fencer", "promote-requested"): "promotion",
}


class JsonlSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to `path` (O_APPEND, one write per span)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()

    @staticmethod
    def to_dict(span: ReadableSpan) -> dict[str, Any]:
        ctx = span.get_span_context()
        parent = span.parent
        service = span.resource.attributes.get("service.name") if span.resource else None
        return {
            "trace_id": f"{ctx.trace_id:032x}" if ctx else None,
            "span_id": f"{ctx.span_id:016x}" if ctx else None,
            "parent_span_id": f"{parent.span_id:016x}" if parent else None,
            "name": span.name,
            "kind": span.kind.name,
            "service": service,
            "start_ns": span.start_time,
            "end_ns": span.end_time,
            "status": span.status.status_code.name,
            "attributes": {k: _jsonable(v) for k, v in (span.attributes or {}).items()},
        }

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            with self._lock:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    for span in spans:
                        line = json.dumps(self.to_dict(span), separators=(",", ":")) + "\n"
                        os.write(fd, line.encode())
                finally:
                    os.close(fd)
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def read_trace_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Spans written by JsonlSpanExporter (skips a torn last line)."""
    out: list[dict[str, Any]] = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return out


def setup_tracing(service_name: str, exporter: SpanExporter | None = None) -> TracerProvider:
    """Install a TracerProvider for `service_name`.

    `exporter` (e.g. an InMemorySpanExporter in tests) is attached with a SimpleSpanProcessor;
    `$GPUORCH_TRACE_FILE` adds a JsonlSpanExporter. The provider becomes the one this module's
    helpers use; it is also made the OpenTelemetry global the first time (the global can be set
    only once per process, so later calls, as in tests, only switch this module's provider).
    """
    global _provider, _global_set, _service
    _service = service_name
    trace_file = Tuning.from_env().trace_file
    otlp = otlp_wanted(os.environ)
    # Where spans go somewhere, every span is recorded, whatever the parent's sampled flag says
    # (a client that exports nothing must not switch the services' spans off). Where they go
    # nowhere, none is recorded: the spans are non-recording, their ids are still made and
    # propagated (trace ids on log lines, `traceparent` on messages), at a fraction of the cost.
    exporting = exporter is not None or bool(trace_file) or otlp
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        sampler=ALWAYS_ON if exporting else ALWAYS_OFF,
    )
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if trace_file:
        provider.add_span_processor(SimpleSpanProcessor(JsonlSpanExporter(trace_file)))
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _provider = provider
    if not _global_set:
        trace.set_tracer_provider(provider)
        _global_set = True
    return provider


def otlp_wanted(env: Mapping[str, str]) -> bool:
    """Do the standard OTEL_* variables ask for an OTLP trace exporter?"""
    chosen = [x.strip() for x in env.get("OTEL_TRACES_EXPORTER", "").split(",") if x.strip()]
    if "none" in chosen or (os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true"):
        return False
    if "otlp" in chosen:
        return True
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


@contextlib.contextmanager
def phase_span(input_type: str, context: Context | None, service: str | None = None) -> Iterator[Span | None]:
    """An INTERNAL span named for the phase this service's handler of `input_type` decides
    (`PHASES`), child of `context`; nothing for inputs that decide no phase."""
    phase = PHASES.get((service or _service, input_type))
    if phase is None:
        yield None
        return
    span = _start(phase, context, SpanKind.INTERNAL, {"gpuorch.phase": phase})
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield span
    finally:
        span.end()


def shutdown_tracing(provider: TracerProvider) -> None:
    """Flush and shut down `provider`; this module's helpers stop using it."""
    global _provider
    provider.force_flush()
    provider.shutdown()
    if _provider is provider:
        _provider = None


def _start(name: str, context: Context | None, kind: SpanKind, attributes: Any) -> Span:
    """`tracer().start_span`, or, where spans go nowhere (our providers' ALWAYS_OFF sampler),
    the non-recording span the SDK would make, without its sampler and attribute machinery
    (about a third of the shell's span cost per message): the parent's trace id (a new random
    one for a root), a new span id, the parent's trace state, not sampled."""
    t = tracer()
    if _tracer is None or getattr(_tracer[0], "sampler", None) is not ALWAYS_OFF:
        return t.start_span(name, context=context, kind=kind, attributes=attributes() if callable(attributes) else attributes)
    parent = trace.get_current_span(context).get_span_context()
    if parent.is_valid:
        trace_id, random_id, state = parent.trace_id, parent.trace_flags.random_trace_id, parent.trace_state
    else:
        trace_id, random_id, state = _ids.generate_trace_id(), _ids.is_trace_id_random(), None
    flags = TraceFlags(TraceFlags.RANDOM_TRACE_ID if random_id else TraceFlags.DEFAULT)
    return NonRecordingSpan(SpanContext(trace_id, _ids.generate_span_id(), is_remote=False, trace_flags=flags, trace_state=state))


def tracer() -> Tracer:
    """The tracer for runtime spans: the provider from the latest `setup_tracing`, else the
    global SDK provider, else a private SDK provider without exporters, so that trace ids are
    always created and propagated (and bound to log lines) even where nobody set up tracing."""
    global _provider, _tracer
    provider = _provider
    if provider is None:
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            provider = current
        else:
            # nobody set up tracing: no exporter, so spans that record nothing (ids still made)
            provider = _provider = TracerProvider(
                resource=Resource.create({"service.name": "gpuorch"}), sampler=ALWAYS_OFF
            )
    if _tracer is None or _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer(INSTRUMENTATION))
    return _tracer[1]


def inject(ctx: Context | None = None) -> dict[str, str]:
    """W3C `traceparent`/`tracestate` headers for `ctx` (default: the current context)."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=ctx)
    return carrier


_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


_W3C = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def pack_traceparent(tp: str) -> bytes | str:
    """A `traceparent` as its 26 bytes when it is in the W3C form (`unpack_traceparent` gives
    back the same string), else the string itself."""
    return bytes.fromhex(tp.replace("-", "")) if _W3C.fullmatch(tp) else tp


def unpack_traceparent(kept: bytes | str) -> str:
    """The `traceparent` string of what `pack_traceparent` kept."""
    if isinstance(kept, str):
        return kept
    h = kept.hex()
    return f"{h[:2]}-{h[2:34]}-{h[34:50]}-{h[50:]}"


def carrier_of(kept: bytes | str | dict[str, str]) -> dict[str, str]:
    """The carrier of a trace context kept by a follower (`gpuorch.follow`): the dict itself, or
    a lone `traceparent` (packed or its string) as one."""
    return kept if isinstance(kept, dict) else {"traceparent": unpack_traceparent(kept)}


def extract(headers: Mapping[str, str] | None) -> Context:
    """The trace context carried in NATS headers (an empty context when there is none).

    What the W3C propagator reads, and the same answer (tests/runtime/test_tracing.py): the common
    case (a version-00 `traceparent` and no `tracestate`, what gpuorch itself sends) is read here
    with one match, in half the time; anything else goes to the propagator."""
    if headers:
        tp = headers.get("traceparent")
        if type(tp) is str and "tracestate" not in headers and (m := _TRACEPARENT.fullmatch(tp)) is not None:
            trace_id, span_id = int(m[1], 16), int(m[2], 16)
            if not (trace_id and span_id):
                return otel_context.Context()
            sc = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(m[3], 16)))
            return trace.set_span_in_context(NonRecordingSpan(sc), otel_context.Context())
    return _propagator.extract(carrier=dict(headers or {}), context=otel_context.Context())


def _messaging_attributes(subject: str, msg_id: str | None, operation: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.operation.type": operation,
    }
    if msg_id:
        attrs["messaging.message.id"] = msg_id
    return attrs


def start_publish_span(subject: str, msg_id: str | None = None, context: Context | None = None) -> Span:
    """A PRODUCER span "<subject> publish" (child of `context`); the caller ends it."""
    return _start(f"{subject} publish", context, SpanKind.PRODUCER, lambda: _messaging_attributes(subject, msg_id, "publish"))


def start_process_span(
    subject: str, msg_id: str | None = None, context: Context | None = None, **attributes: Any
) -> Span:
    """A CONSUMER span "<subject> process" (child of the producer's `context`); the caller ends it."""
    def attrs() -> dict[str, Any]:
        out = _messaging_attributes(subject, msg_id, "process")
        out.update({k: v for k, v in attributes.items() if v is not None})
        return out

    return _start(f"{subject} process", context, SpanKind.CONSUMER, attrs)


def span_context(span: Span, parent: Context | None = None) -> Context:
    """A Context in which `span` is current (for children and for `inject`)."""
    return trace.set_span_in_context(span, parent)


def trace_id_hex(span_or_ctx: Span | Context | None = None) -> str | None:
    """The 32-hex trace id of a span, a context, or the current span; None if not sampled/valid."""
    if span_or_ctx is None:
        span = trace.get_current_span()
    elif isinstance(span_or_ctx, Context):
        span = trace.get_current_span(span_or_ctx)
    else:
        span = span_or_ctx
    sc = span.get_span_context()
    return f"{sc.trace_id:032x}" if sc.is_valid else None
