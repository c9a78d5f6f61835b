"""Encoders and decoders, built once. JSON or msgpack on the wire; YAML for people."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal, TypeVar

import msgspec
import yaml

from .events import Base, Event, FieldError
from .inventory import ClusterSnapshot
from .state import FenceRecord, OwnerLease
from .validate import validate_workload
from .workload import Workload

T = TypeVar("T")
Format = Literal["json", "msgpack"]

_json_enc = msgspec.json.Encoder()
_mp_enc = msgspec.msgpack.Encoder()
_json_event = msgspec.json.Decoder(Event)
_mp_event = msgspec.msgpack.Decoder(Event)
_json_snapshot = msgspec.json.Decoder(ClusterSnapshot)
_json_fence = msgspec.json.Decoder(FenceRecord)
_json_owner = msgspec.json.Decoder(OwnerLease)
_json_workload = msgspec.json.Decoder(Workload)

_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")


class ContractError(ValueError):
    """Input that breaks the contract; `errors` name each field path and rule."""

    def __init__(self, reason: str, errors: list[FieldError]) -> None:
        self.reason = reason
        self.errors = errors
        detail = "; ".join(f"{e.path}: {e.message}" for e in errors)
        super().__init__(f"{reason}: {detail}" if detail else reason)


def _field_error(exc: msgspec.ValidationError | msgspec.DecodeError, strip: str = "") -> FieldError:
    text = str(exc)
    m = _PATH.search(text)
    if not m:
        return FieldError(path="$", message=text)
    path = m.group("path").lstrip(".")
    if strip and path.startswith(strip):
        path = path[len(strip) :]
    return FieldError(path=path or "$", message=text[: m.start()])


def encode(msg: Any, fmt: Format = "json") -> bytes:
    return _json_enc.encode(msg) if fmt == "json" else _mp_enc.encode(msg)


def is_msgpack(data: bytes, content_type: str | None = None) -> bool:
    if content_type:
        return "msgpack" in content_type
    return bool(data) and data[:1] not in (b"{", b" ", b"\n", b"\t", b"\r")


def decode_event(data: bytes, content_type: str | None = None) -> Event:
    """Decode any command or event; raises ContractError with the field path on failure."""
    try:
        if is_msgpack(data, content_type):
            evt: Event = _mp_event.decode(data)
        else:
            evt = _json_event.decode(data)
    except msgspec.ValidationError as exc:
        err = _field_error(exc, strip="workload.")
        raise ContractError("invalid message", [err]) from exc
    except msgspec.DecodeError as exc:
        raise ContractError("undecodable message", [FieldError(path="$", message=str(exc))]) from exc
    if isinstance(evt, Base) and getattr(evt, "workload", None) is not None:
        errors = validate_workload(evt.workload)  # type: ignore[attr-defined, union-attr, unused-ignore]
        if errors:
            raise ContractError("invalid workload", errors)
    return evt


def decode_snapshot(data: bytes) -> ClusterSnapshot:
    return _json_snapshot.decode(data)


def decode_fence(data: bytes) -> FenceRecord:
    return _json_fence.decode(data)


def decode_owner(data: bytes) -> OwnerLease:
    return _json_owner.decode(data)


def workload_from_obj(obj: Any) -> Workload:
    """Convert a parsed YAML/JSON document into a valid Workload, or raise ContractError."""
    if not isinstance(obj, dict):
        raise ContractError("invalid workload", [FieldError(path="$", message="expected a mapping")])
    try:
        wl = msgspec.convert(obj, Workload)
    except msgspec.ValidationError as exc:
        raise ContractError("invalid workload", [_field_error(exc)]) from exc
    errors = validate_workload(wl)
    if errors:
        raise ContractError("invalid workload", errors)
    return wl


def load_workload_yaml(text: str) -> Workload:
    """The user-facing format: YAML loaded into the same Structs, errors naming field and rule."""
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ContractError("invalid YAML", [FieldError(path="$", message=str(exc))]) from exc
    return workload_from_obj(obj)


def workload_to_builtins(wl: Workload) -> Any:
    return msgspec.to_builtins(wl)


def slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return s[:30].strip("-") or "wl"


def workload_id_for(idempotency_key: str, name: str = "wl") -> str:
    """Deterministic workload id: a re-sent submit (same key) names the same workload."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:10]
    return f"{slug(name)}-{digest}"
