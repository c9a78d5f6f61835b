"""Structured logs: one JSON object per line on stderr.

Every line carries `timestamp`, `level`, `service`, `event` (a constant name such as
`msg.processed`) and whatever the shell bound with structlog contextvars for the message being
handled (subject, stream sequence, delivery count, event id, trace id). Standard-library log
records (nats-py logs through `logging`) are rendered the same way.

Every line about a workload carries `workload_id`, `trace_id` and, when it is about one attempt,
`attempt_id`: the shell binds them per message, and `_workload_ids` fills them in on lines logged
outside a message (a watch loop's `workload=...`, `attempt=...`) from the workload's trace id
the shell last saw (`remember_trace`).
"""

from __future__ import annotations

import logging
import sys
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from gpuorch_proto import k8s

# Constant event names used by the runtime shell (services add their own, e.g. "workload.routed").
MSG_PROCESSED = "msg.processed"
MSG_REJECTED = "msg.rejected"
MSG_RETRY = "msg.retry"
MSG_DEAD_LETTERED = "msg.dead_lettered"
MSG_DUPLICATE = "msg.duplicate_publish"

#: Is the debug level on (`configure_logging`)? The shell asks before a line per message: a
#: filtered-out `log.debug` still binds a logger through structlog's proxy (about 1.5 % of a
#: service's time in a burst).
debugging = False


_TRACES: OrderedDict[str, str] = OrderedDict()
_TRACES_MAX = 20000


def remember_trace(workload_id: str, trace_id: str | None) -> None:
    """The trace of `workload_id` (the first one seen: one workload is one trace)."""
    if not trace_id or workload_id in _TRACES:
        return
    _TRACES[workload_id] = trace_id
    if len(_TRACES) > _TRACES_MAX:
        _TRACES.popitem(last=False)


# The keys the shell binds for the message in hand: one dict in one context variable (set once
# per message and reset after it), not one structlog context variable per key (two `set`s per key
# per message). Services' own `structlog.contextvars` bindings are merged as before.
_MESSAGE: ContextVar[dict[str, Any] | None] = ContextVar("gpuorch_message", default=None)


@contextmanager
def message_context(**keys: Any) -> Iterator[dict[str, Any]]:
    """Bind `keys` to every line logged while the message is handled; unbound on exit. The dict
    it yields may be updated in place (what the message turns out to be about)."""
    bound = dict(keys)
    token = _MESSAGE.set(bound)
    try:
        yield bound
    finally:
        _MESSAGE.reset(token)


def bind_message(**keys: Any) -> None:
    """Add `keys` to the current message's context (nothing outside a message)."""
    bound = _MESSAGE.get()
    if bound is not None:
        bound.update(keys)


def merge_message(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    bound = _MESSAGE.get()
    return {**bound, **event_dict} if bound else event_dict


def _workload_ids(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    att = event_dict.get("attempt_id") or event_dict.get("attempt") or event_dict.get("job")
    if isinstance(att, str) and att and (parsed := k8s.parse_attempt_id(att)) is not None:
        event_dict.setdefault("attempt_id", att)  # an attempt (its Job has the attempt's name)
        if not event_dict.get("workload_id") and not event_dict.get("workload"):
            event_dict["workload_id"] = parsed[0]
    wid = event_dict.get("workload_id") or event_dict.get("workload")
    if isinstance(wid, str) and wid:
        event_dict["workload_id"] = wid
        if not event_dict.get("trace_id") and wid in _TRACES:
            event_dict["trace_id"] = _TRACES[wid]
    return event_dict


def _add_service(service: str) -> Processor:
    def processor(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        event_dict.setdefault("service", service)
        return event_dict

    return processor


def configure_logging(service: str, level: str | int = "INFO", stream: TextIO | None = None) -> None:
    """JSON lines to `stream` (stderr by default) for structlog and the stdlib `logging`."""
    numeric = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    global debugging
    debugging = numeric <= logging.DEBUG
    out = stream if stream is not None else sys.stderr
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        merge_message,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_service(service),
        _workload_ids,
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_gpuorch", False):
            root.removeHandler(old)
    handler._gpuorch = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(numeric)


def get_logger(name: str | None = None, **initial: Any) -> Any:
    return structlog.get_logger(name, **initial)
