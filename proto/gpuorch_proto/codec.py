"""Encoders and decoders, built once. JSON or msgpack on the wire; YAML for people."""

from __future__ import annotations

import difflib
import hashlib
import re
from typing import Any, Literal, TypeVar

import msgspec
import msgspec.inspect
import yaml

from .events import MESSAGE_REF_PREFIX, Base, Cancel, Event, FieldError, Submit
from .inventory import ClusterSnapshot
from .nesting import depth_error, yaml_depth_error
from .policy import AdmissionPolicy, PolicyError
from .state import AdmissionLease, FenceRecord, InstanceLease, OwnerRecord
from .subjects import valid_token
from .validate import validate_policy, validate_workload
from .workload import SCHEMA_VERSION, Workload

T = TypeVar("T")
Format = Literal["json", "msgpack"]

_json_enc = msgspec.json.Encoder()
_mp_enc = msgspec.msgpack.Encoder()
_json_event = msgspec.json.Decoder(Event)
_mp_event = msgspec.msgpack.Decoder(Event)
_json_snapshot = msgspec.json.Decoder(ClusterSnapshot)
_json_fence = msgspec.json.Decoder(FenceRecord)
_json_owner = msgspec.json.Decoder(OwnerRecord)
_json_instance = msgspec.json.Decoder(InstanceLease)
_json_admission = msgspec.json.Decoder(AdmissionLease)
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
    """msgpack if the Content-Type says so; without one, if the body does not start like JSON.

    A JSON text starts with an ASCII character (`{`, `[`, `"`, a digit, `t`/`f`/`n`, whitespace);
    a msgpack event is a map, whose first byte is 0x80-0x8f, 0xde or 0xdf. So a body is read as
    msgpack only when its first byte is not ASCII: a JSON array (or string, number) is decoded as
    JSON and rejected as such, never misread as msgpack.
    """
    if content_type:
        return "msgpack" in content_type.lower()
    return bool(data) and data[0] >= 0x80


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def _not_an_object(data: bytes, msgpack: bool) -> ContractError | None:
    """The body is not an object/map: say what it is (msgspec only says "got `int`"), or that it
    is not JSON / msgpack at all (garbage whose first byte happens to be a msgpack scalar)."""
    try:
        obj = msgspec.msgpack.decode(data) if msgpack else msgspec.json.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        fmt = "msgpack" if msgpack else "JSON"
        return ContractError("undecodable message", [FieldError(path="$", message=f"not {fmt}: {exc}")])
    if isinstance(obj, dict):
        return None
    what = "null" if obj is None else _JSON_KINDS.get(type(obj), type(obj).__name__)
    fmt = "msgpack map" if msgpack else "JSON object"
    return ContractError(
        "invalid message",
        [FieldError(path="$", message=f"expected an object (a {fmt} with a `type` field), got {what}")],
    )


def _unknown_version(data: bytes, msgpack: bool) -> FieldError | None:
    try:
        obj = msgspec.msgpack.decode(data) if msgpack else msgspec.json.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    version = obj.get("schema_version", SCHEMA_VERSION) if isinstance(obj, dict) else SCHEMA_VERSION
    if version == SCHEMA_VERSION and type(version) is int:
        return None
    return FieldError(
        path="schema_version",
        message=f"schema_version {version!r} not supported; this build reads {SCHEMA_VERSION}",
    )


def check_envelope(evt: Base) -> list[FieldError]:
    """Rules of the envelope beyond types: a known `schema_version`, usable ids on commands."""
    errors: list[FieldError] = []
    if evt.schema_version != SCHEMA_VERSION:
        errors.append(
            FieldError(
                path="schema_version",
                message=f"schema_version {evt.schema_version} not supported; this build reads {SCHEMA_VERSION}",
            )
        )
    if isinstance(evt, Submit) and evt.workload_id:
        if not valid_token(evt.workload_id):
            errors.append(
                FieldError(
                    path="workload_id", message=f"{evt.workload_id[:80]!r} is not a workload id ([a-z0-9-])"
                )
            )
        elif evt.workload_id.startswith(MESSAGE_REF_PREFIX):
            errors.append(
                FieldError(
                    path="workload_id",
                    message=f"{evt.workload_id!r}: the prefix {MESSAGE_REF_PREFIX!r} is reserved for records of messages",
                )
            )
    if isinstance(evt, Cancel) and not valid_token(evt.workload_id):
        errors.append(
            FieldError(
                path="workload_id", message=f"{evt.workload_id[:80]!r} is not a workload id ([a-z0-9-])"
            )
        )
    return errors


def decode_event(data: bytes, content_type: str | None = None) -> Event:
    """Decode any command or event; raises ContractError with the field path on failure.

    Beyond the types: a `schema_version` this build does not read is refused (EVOLUTION.md rule
    6: a breaking change is a new version, never read as v1), and so are command ids that could
    not name a workload. A body nested deeper than `nesting.MAX_DEPTH` is refused before any
    decoder sees it, naming the path where the limit is crossed.
    """
    msgpack = is_msgpack(data, content_type)
    deep = depth_error(data, msgpack=msgpack)  # before any decoder recurses into it
    if deep is not None:
        raise ContractError("too deeply nested", [deep])
    try:
        if msgpack:
            evt: Event = _mp_event.decode(data)
        else:
            evt = _json_event.decode(data)
    except msgspec.ValidationError as exc:
        shape = _not_an_object(data, msgpack)
        if shape is not None:
            raise shape from exc
        version = _unknown_version(data, msgpack)
        if version is not None:  # another version's message: its shape is not ours to judge
            raise ContractError("invalid message", [version]) from exc
        err = _field_error(exc, strip="workload.")
        raise ContractError("invalid message", [err]) from exc
    except msgspec.DecodeError as exc:
        raise ContractError("undecodable message", [FieldError(path="$", message=str(exc))]) from exc
    envelope = check_envelope(evt)
    if envelope:
        raise ContractError("invalid message", envelope)
    if isinstance(evt, Submit):  # a workload document someone wrote: strict, unknown fields included
        raw = _raw_workload(data, msgpack)
        extra = unknown_fields(raw) if raw is not None else []
        if extra:
            raise ContractError("invalid workload", extra)
    if isinstance(evt, Base) and getattr(evt, "workload", None) is not None:
        errors = validate_workload(evt.workload)  # type: ignore[attr-defined, union-attr, unused-ignore]
        if errors:
            raise ContractError("invalid workload", errors)
    return evt


def _raw_workload(data: bytes, msgpack: bool) -> Any:
    try:
        obj = msgspec.msgpack.decode(data) if msgpack else msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    return obj.get("workload") if isinstance(obj, dict) else None


def decode_snapshot(data: bytes) -> ClusterSnapshot:
    return _json_snapshot.decode(data)


def decode_fence(data: bytes) -> FenceRecord:
    return _json_fence.decode(data)


def decode_owner(data: bytes) -> OwnerRecord:
    """A workload's ownership record (key = workload id in the owners bucket)."""
    return _json_owner.decode(data)


def decode_instance_lease(data: bytes) -> InstanceLease:
    """A dispatcher instance's lease (key `instance.<id>` in the owners bucket)."""
    return _json_instance.decode(data)


def decode_admission_lease(data: bytes) -> AdmissionLease:
    """The admission leader's lease (key `leader` in the admission bucket)."""
    return _json_admission.decode(data)


_WORKLOAD_INFO = msgspec.inspect.type_info(Workload)


# What the walk of a document checks, built once per type from msgspec's type info: a Struct's
# fields by encoded name ("s", {name: spec}), a list's items ("l", spec), a union's members
# ("u", [specs]); None where no field can be named (scalars, free-form maps).
_Spec = tuple[str, Any] | None
_SPECS: dict[type, _Spec] = {}


def _spec(info: Any) -> _Spec:
    if isinstance(info, msgspec.inspect.StructType):
        if info.cls in _SPECS:
            return _SPECS[info.cls]
        fields: dict[str, _Spec] = {}
        spec = _SPECS[info.cls] = ("s", fields)  # (in place before its fields: a type may contain itself)
        for f in info.fields:
            fields[f.encode_name] = _spec(f.type)
        return spec
    if isinstance(info, msgspec.inspect.ListType):
        item = _spec(info.item_type)
        return ("l", item) if item is not None else None
    if isinstance(info, msgspec.inspect.UnionType):
        members = [m for m in (_spec(t) for t in info.types) if m is not None]
        return ("u", members) if members else None
    return None


def unknown_fields(obj: Any, info: Any = _WORKLOAD_INFO, at: str = "") -> list[FieldError]:
    """Fields a document names that the contract does not have (a typo is an error, not a no-op):
    `spec.resouces: unknown field; did you mean spec.resources?`. Strict for what people write
    (workload documents, YAML or JSON); events between services are read leniently
    (proto/EVOLUTION.md)."""
    out: list[FieldError] = []
    _unknown(obj, _spec(info), at, out)
    return out


def _unknown(obj: Any, spec: _Spec, at: str, out: list[FieldError]) -> None:
    if spec is None:
        return
    kind, sub = spec
    if kind == "s":
        if not isinstance(obj, dict):
            return
        for k, v in obj.items():
            if k not in sub:
                close = difflib.get_close_matches(str(k), list(sub), n=1, cutoff=0.6)
                hint = f"did you mean {at + '.' if at else ''}{close[0]}?" if close else "the contract has: " + ", ".join(sorted(sub))
                out.append(FieldError(path=f"{at}.{k}" if at else str(k), message=f"unknown field; {hint}"))
            elif sub[k] is not None and isinstance(v, (dict, list)):
                _unknown(v, sub[k], f"{at}.{k}" if at else str(k), out)
    elif kind == "l":
        if isinstance(obj, list):
            for i, v in enumerate(obj):
                if isinstance(v, (dict, list)):
                    _unknown(v, sub, f"{at}[{i}]", out)
    else:
        for member in sub:
            _unknown(obj, member, at, out)


def workload_from_obj(obj: Any) -> Workload:
    """Convert a parsed YAML/JSON document into a valid Workload, or raise ContractError.

    Strict, as for anything people write: unknown fields are errors (the JSON Schema is closed too).
    """
    if not isinstance(obj, dict):
        raise ContractError("invalid workload", [FieldError(path="$", message="expected a mapping")])
    extra = unknown_fields(obj)
    if extra:
        raise ContractError("invalid workload", extra)
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
    deep = yaml_depth_error(text)  # PyYAML's composer recurses: measured on the parser's events first
    if deep is not None:
        raise ContractError("too deeply nested", [deep])
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ContractError("invalid YAML", [FieldError(path="$", message=str(exc))]) from exc
    return workload_from_obj(obj)


_POLICY_INFO = msgspec.inspect.type_info(AdmissionPolicy)


def policy_from_obj(obj: Any) -> AdmissionPolicy:
    """Decode and validate an admission policy document (a mapping; `gpuorch_proto.policy`);
    `PolicyError` names every field path.

    Strict, as for anything people write: an unknown field is an error, not a no-op.
    """
    if not isinstance(obj, dict):
        raise PolicyError([FieldError(path="$", message="expected a mapping")])
    extra = unknown_fields(obj, _POLICY_INFO)
    if extra:
        raise PolicyError(extra)
    try:
        policy = msgspec.convert(obj, AdmissionPolicy)
    except msgspec.ValidationError as exc:
        raise PolicyError([_field_error(exc)]) from exc
    errors = validate_policy(policy)
    if errors:
        raise PolicyError(errors)
    return policy


def load_policy_yaml(text: str) -> AdmissionPolicy:
    """An admission policy from its YAML (`policy_from_obj`)."""
    if (deep := yaml_depth_error(text)) is not None:  # PyYAML's composer recurses (gpuorch_proto.nesting)
        raise PolicyError([deep])
    return policy_from_obj(yaml.safe_load(text) or {})


def workload_to_builtins(wl: Workload) -> Any:
    return msgspec.to_builtins(wl)


def slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return s[:30].strip("-") or "wl"


def idempotency_key(msg_id: str | None, body_key: str | None) -> str | None:
    """A submit's idempotency key (docs/contract.md, Submit): its `Nats-Msg-Id` header, else the
    body's `idempotency_key`; None when it has neither. Both are allowed only when they are the
    same (`key_conflict`)."""
    return msg_id or body_key or None


MAX_KEY_SHOWN = 100  # characters of a key an error message repeats


def key_conflict(msg_id: str | None, body_key: str | None) -> FieldError | None:
    """Why a submit's two keys cannot both stand (None: they can): a `Nats-Msg-Id` header and a
    body `idempotency_key` that differ would name two workloads (JetStream would deduplicate by
    one, the router by the other), so the submit is refused rather than one silently winning."""
    if not msg_id or not body_key or msg_id == body_key:
        return None
    return FieldError(
        path="idempotency_key",
        message=f"the body's idempotency_key {body_key[:MAX_KEY_SHOWN]!r} differs from the Nats-Msg-Id header "
        f"{msg_id[:MAX_KEY_SHOWN]!r}: send the key in one of them, or the same key in both",
    )


def workload_id_for(idempotency_key: str, name: str = "wl") -> str:
    """Deterministic workload id: a re-sent submit (same key) names the same workload."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:10]
    return f"{slug(name)}-{digest}"
