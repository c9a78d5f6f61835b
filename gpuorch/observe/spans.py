"""Each attempt as a span of its workload's trace, with one child span per phase.

The dispatcher (the owner of attempts) calls `record_attempt` for every event it applies; when
an attempt has ended (`succeeded`, `failed`, `lost`, or confirmed gone before any of those) it
records the span "attempt <id>" from the Job's creation to that end, and inside it one span per
gap of the attempt's timeline (`admission`, `staging`, `startup`, `run`), with the times of the
events: the phases appear in a trace viewer exactly as `gpuorch get` names them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from gpuorch.projection import WorkloadView
from gpuorch.runtime import telemetry
from gpuorch_proto import Event
from gpuorch_proto import events as ev

from .timeline import attempt_timeline

ENDS = (ev.Succeeded, ev.Failed, ev.Lost, ev.CancelConfirmed, ev.OrphanDeleted)
_recorded: OrderedDict[str, None] = OrderedDict()


def _ns(t: float) -> int:
    return int(t * 1e9)


def record_attempt(view: WorkloadView, e: Event, context: Context | None) -> bool:
    """Record the span of the attempt `e` ended, once per process; True when it did."""
    if not isinstance(e, ENDS) or e.attempt_id in _recorded:
        return False
    a = view.attempts.get(e.attempt_id)
    if a is None or "created" not in a.times or e.at < a.times["created"]:
        return False
    _recorded[e.attempt_id] = None
    if len(_recorded) > 20000:
        _recorded.popitem(last=False)
    tl = attempt_timeline(view, a, None, None)
    attrs: dict[str, Any] = {
        "gpuorch.workload_id": view.workload_id, "gpuorch.attempt_id": a.attempt_id, "gpuorch.cluster": a.cluster,
        "gpuorch.attempt.number": a.number, "gpuorch.attempt.end": type(e).__struct_config__.tag or "",
        "gpuorch.phase": "attempt",
    }  # fmt: skip
    tracer = telemetry.tracer()
    span = tracer.start_span(f"attempt {a.attempt_id}", context=context, kind=SpanKind.INTERNAL,
                             start_time=_ns(a.times["created"]), attributes=attrs)  # fmt: skip
    inside = trace.set_span_in_context(span, context)
    for g in tl.gaps:
        if g.end > e.at:
            break
        child = tracer.start_span(g.name, context=inside, kind=SpanKind.INTERNAL, start_time=_ns(g.start),
                                  attributes={"gpuorch.phase": g.name, "gpuorch.attempt_id": a.attempt_id})  # fmt: skip
        child.end(end_time=_ns(g.end))
    span.end(end_time=_ns(e.at))
    return True
