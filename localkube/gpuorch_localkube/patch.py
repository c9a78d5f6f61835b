"""PATCH bodies: JSON merge patch, strategic merge patch (the subset of merge keys gpuorch meets), JSON patch."""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError

__all__ = ["apply_patch", "json_patch", "merge_patch", "strategic_merge_patch"]

_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "taints": "key",
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = target if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    out = target if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            out[k] = strategic_merge_patch(out.get(k), v)
        elif isinstance(v, list) and k in _MERGE_KEYS and isinstance(out.get(k), list):
            key = _MERGE_KEYS[k]
            merged = list(out[k])
            for item in v:
                if isinstance(item, dict) and key in item:
                    pos = next((i for i, e in enumerate(merged) if isinstance(e, dict) and e.get(key) == item[key]), None)
                    if item.get("$patch") == "delete":
                        if pos is not None:
                            merged.pop(pos)
                    elif pos is None:
                        merged.append({a: b for a, b in item.items() if not a.startswith("$")})
                    else:
                        merged[pos] = strategic_merge_patch(copy.deepcopy(merged[pos]), item)
                else:
                    merged.append(copy.deepcopy(item))
            out[k] = merged
        else:
            out[k] = copy.deepcopy(v)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str]) -> tuple[Any, str]:
    cur = doc
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    return cur, parts[-1]


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902: add, remove, replace, test, move, copy."""
    if not isinstance(ops, list):
        raise ApiError.bad_request("a JSON patch must be a list of operations")
    for op in ops:
        try:
            kind, parts = op["op"], _pointer(op["path"])
            if not parts:
                if kind in ("add", "replace"):
                    doc = copy.deepcopy(op["value"])
                    continue
                raise ApiError(422, "Invalid", f"unsupported operation on the root: {kind}")
            parent, last = _resolve(doc, parts)
            if kind in ("add", "replace", "copy", "move"):
                if kind == "copy" or kind == "move":
                    src_parent, src_last = _resolve(doc, _pointer(op["from"]))
                    value = src_parent[int(src_last)] if isinstance(src_parent, list) else src_parent[src_last]
                    value = copy.deepcopy(value)
                    if kind == "move":
                        if isinstance(src_parent, list):
                            src_parent.pop(int(src_last))
                        else:
                            del src_parent[src_last]
                        parent, last = _resolve(doc, parts)
                else:
                    value = copy.deepcopy(op["value"])
                if isinstance(parent, list):
                    if last == "-":
                        parent.append(value)
                    elif kind == "replace":
                        parent[int(last)] = value
                    else:
                        parent.insert(int(last), value)
                else:
                    if kind == "replace" and last not in parent:
                        raise KeyError(last)
                    parent[last] = value
            elif kind == "remove":
                if isinstance(parent, list):
                    parent.pop(int(last))
                else:
                    del parent[last]
            elif kind == "test":
                have = parent[int(last)] if isinstance(parent, list) else parent[last]
                if have != op.get("value"):
                    raise ApiError(422, "Invalid", f"test operation failed at {op['path']}")
            else:
                raise ApiError(422, "Invalid", f"unsupported JSON patch operation {kind!r}")
        except ApiError:
            raise
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise ApiError(422, "Invalid", f"the JSON patch could not be applied: {op!r}: {e!r}") from e
    return doc


def apply_patch(obj: dict[str, Any], content_type: str, patch: Any) -> dict[str, Any]:
    ct = content_type.split(";")[0].strip().lower()
    target = copy.deepcopy(obj)
    if ct == "application/json-patch+json":
        out = json_patch(target, patch)
    elif ct == "application/merge-patch+json":
        out = merge_patch(target, patch)
    elif ct in ("application/strategic-merge-patch+json", "application/json", ""):
        out = strategic_merge_patch(target, patch)
    else:
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - accepted media types include: "
                       "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json "
                       f"(localkube does not serve {ct})")
    if not isinstance(out, dict):
        raise ApiError(422, "Invalid", "the patched object is not an object")
    return out
