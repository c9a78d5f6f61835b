"""core/v1 Secrets: what a Job's ``valueFrom.secretKeyRef`` reads (issue 11).

Created, read, listed, watched and deleted through the API like any object (the official client's
``create_namespaced_secret`` and the rest). `data` holds base64 values, `stringData` is merged
into it on create and never stored, as the API server does. The kubelet resolves a container's
``env[].valueFrom.secretKeyRef`` with `secret_key_value` when it starts the process: the value
goes into that process's environment and nowhere else (not into the pod object, its status or
its events).
"""

from __future__ import annotations

import base64
import binascii
import copy
import re
from typing import Any

from .errors import SECRETS, ApiError
from .objects import _base_meta, _validate_annotations, _validate_labels, _validate_name, check_type_meta

__all__ = ["SecretNotFound", "prepare_secret", "secret_key_value"]

_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
MAX_SECRET_BYTES = 1024 * 1024  # the API server's limit on one Secret's data


class SecretNotFound(LookupError):
    """The Secret or its key does not exist (the kubelet's CreateContainerConfigError message)."""


def prepare_secret(body: Any, namespace: str) -> dict[str, Any]:
    """Validate and default a Secret on create (raises ApiError 400/422)."""
    obj = check_type_meta(copy.deepcopy(body), SECRETS, namespace)
    obj["apiVersion"], obj["kind"] = "v1", "Secret"
    meta = obj["metadata"]
    causes: list[tuple[str, str, str]] = []
    name = _validate_name(meta, causes)
    _validate_labels(meta.get("labels"), "metadata.labels", causes)
    _validate_annotations(meta.get("annotations"), "metadata.annotations", causes)
    data = obj.get("data") or {}
    if not isinstance(data, dict):
        causes.append(("data", "FieldValueInvalid", "must be a map of key to base64 value"))
        data = {}
    size = 0
    for key, value in data.items():
        if not isinstance(key, str) or not _KEY.match(key):
            causes.append((f"data[{key}]", "FieldValueInvalid", "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"))
            continue
        try:
            size += len(base64.b64decode(str(value), validate=True))
        except (binascii.Error, ValueError):
            causes.append((f"data[{key}]", "FieldValueInvalid", "illegal base64 data"))
    for key, value in (obj.pop("stringData", None) or {}).items():
        if not isinstance(key, str) or not _KEY.match(key):
            causes.append((f"stringData[{key}]", "FieldValueInvalid", "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"))
            continue
        raw = str(value).encode()
        size += len(raw)
        data[key] = base64.b64encode(raw).decode()
    if size > MAX_SECRET_BYTES:
        causes.append(("data", "FieldValueTooLong", f"Too long: must have at most {MAX_SECRET_BYTES} bytes"))
    if causes:
        raise ApiError.invalid(SECRETS, name, causes)
    obj["data"] = data
    obj.setdefault("type", "Opaque")
    _base_meta(meta, namespace)
    return obj


def secret_key_value(secret: dict[str, Any] | None, namespace: str, name: str, key: str) -> str:
    """The decoded value of `key` in `secret` (the stored object, or None when it does not exist)."""
    if secret is None:
        raise SecretNotFound(f'secret "{name}" not found')
    data = secret.get("data") or {}
    if key not in data:
        raise SecretNotFound(f"couldn't find key {key} in Secret {namespace}/{name}")
    return base64.b64decode(data[key]).decode(errors="replace")
