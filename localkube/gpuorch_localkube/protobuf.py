"""The one protobuf body localkube decodes: `DeleteOptions`, which kubectl's typed clients (drain,
delete) send as `application/vnd.kubernetes.protobuf`. Other protobuf bodies are answered 415.

Wire format: the magic `k8s\\x00`, then `runtime.Unknown{typeMeta=1{apiVersion=1, kind=2}, raw=2}`;
`DeleteOptions{gracePeriodSeconds=1, preconditions=2{uid=1, resourceVersion=2}, orphanDependents=3,
propagationPolicy=4, dryRun=5}` (apimachinery's generated.proto).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["MAGIC", "ProtobufError", "decode_delete_options", "kind_of"]

MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        b = data[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            n, pos = _varint(data, pos)
            if pos + n > len(data):
                raise ProtobufError("truncated field")
            value, pos = data[pos:pos + n], pos + n
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        yield field, wire, value


def _unknown(body: bytes) -> tuple[str, str, bytes]:
    if not body.startswith(MAGIC):
        raise ProtobufError("not a Kubernetes protobuf envelope")
    api_version = kind = ""
    raw = b""
    for f, w, v in _fields(body[len(MAGIC):]):
        if f == 1 and w == 2:
            for tf, tw, tv in _fields(v):
                if tw == 2 and tf == 1:
                    api_version = tv.decode()
                elif tw == 2 and tf == 2:
                    kind = tv.decode()
        elif f == 2 and w == 2:
            raw = v
    return api_version, kind, raw


def kind_of(body: bytes) -> str:
    try:
        return _unknown(body)[1]
    except ProtobufError:
        return ""


def decode_delete_options(body: bytes) -> dict[str, Any]:
    """DeleteOptions as the JSON body would carry them; raises ProtobufError if it is not one."""
    _api, kind, raw = _unknown(body)
    if kind != "DeleteOptions":
        raise ProtobufError(f"a {kind or 'body of unknown kind'}, not DeleteOptions")
    out: dict[str, Any] = {}
    for f, w, v in _fields(raw):
        if f == 1 and w == 0:
            out["gracePeriodSeconds"] = v - (1 << 64) if v >= 1 << 63 else v
        elif f == 2 and w == 2:
            pre: dict[str, str] = {}
            for pf, pw, pv in _fields(v):
                if pw == 2 and pf in (1, 2):
                    pre["uid" if pf == 1 else "resourceVersion"] = pv.decode()
            out["preconditions"] = pre
        elif f == 3 and w == 0:
            out["orphanDependents"] = bool(v)
        elif f == 4 and w == 2:
            out["propagationPolicy"] = v.decode()
        elif f == 5 and w == 2:
            out.setdefault("dryRun", []).append(v.decode())
    return out
