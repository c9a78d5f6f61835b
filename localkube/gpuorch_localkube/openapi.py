"""`/openapi/v2` and `/openapi/v3` for the kinds localkube serves.

The definitions are Kubernetes' own (from the API server's published schema of the release in
`version.KUBE_VERSION`), trimmed to what Pods, Nodes, Jobs, Namespaces, Events, Status and
DeleteOptions reach, and kept in `openapi-definitions.json` beside this file (swagger 2.0 form).
`python -m gpuorch_localkube.openapi` regenerates that file from the `kubernetes-validate` wheel
(a dev dependency) when the served version changes.

kubectl reads `/openapi/v2` as protobuf (gnostic's `openapi.v2.Document`) for client-side
validation, and `/openapi/v3` as JSON for `explain` and `apply`. The protobuf encoder below writes
the subset of that message the documents use; the field numbers are gnostic's `OpenAPIv2.proto`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any

from .errors import EVENTS, JOBS, NAMESPACES, NODES, PODS, Resource
from .version import KUBE_VERSION

__all__ = ["V2_PROTOBUF", "v2_document", "v2_protobuf", "v3_document", "v3_index"]

V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
DATA = Path(__file__).with_name("openapi-definitions.json")
META = "io.k8s.apimachinery.pkg.apis.meta.v1"

DEFINITION = {
    "pods": "io.k8s.api.core.v1.Pod",
    "nodes": "io.k8s.api.core.v1.Node",
    "jobs": "io.k8s.api.batch.v1.Job",
    "namespaces": "io.k8s.api.core.v1.Namespace",
    "events": "io.k8s.api.core.v1.Event",
}
ROOTS = [*DEFINITION.values(), *(v + "List" for v in DEFINITION.values()),
         f"{META}.Status", f"{META}.DeleteOptions", f"{META}.Patch", f"{META}.WatchEvent"]

# what each resource serves: (collection ops, item ops); ops are x-kubernetes-action names
_SERVED: list[tuple[Resource, tuple[str, ...], tuple[str, ...]]] = [
    (PODS, ("list", "post", "deletecollection"), ("get", "put", "patch", "delete")),
    (NODES, ("list",), ("get", "put", "patch")),
    (NAMESPACES, ("list", "post"), ("get",)),
    (EVENTS, ("list",), ("get",)),
    (JOBS, ("list", "post", "deletecollection"), ("get", "put", "patch", "delete")),
]
_METHOD = {"list": "get", "get": "get", "post": "post", "put": "put", "patch": "patch",
           "delete": "delete", "deletecollection": "delete"}
_WRITE = ("post", "put", "patch", "delete", "deletecollection")


# -- regeneration (dev only) ---------------------------------------------------------------------


def _to_swagger(s: Any) -> Any:
    """The kubernetes-validate JSON Schema form back to swagger 2.0 (single types, #/definitions)."""
    if isinstance(s, list):
        return [_to_swagger(x) for x in s]
    if not isinstance(s, dict):
        return s
    if "oneOf" in s:  # Quantity (string|number), IntOrString (string|integer)
        kinds = {t for alt in s["oneOf"] for t in ([alt["type"]] if isinstance(alt.get("type"), str) else alt.get("type", []))}
        out = {k: v for k, v in s.items() if k != "oneOf"}
        out["type"] = "string"
        out["format"] = "int-or-string" if "integer" in kinds else "quantity"
        return out
    out = {}
    for k, v in s.items():
        if k == "type" and isinstance(v, list):
            types = [t for t in v if t != "null"]
            out[k] = types[0] if types else "object"
        elif k == "$ref":
            out[k] = v.replace("#/$defs/", "#/definitions/")
        elif k == "properties" and isinstance(v, dict) and "x-kubernetes-group-version-kind" in s:
            # kubernetes-validate pins apiVersion/kind with an enum; the API server's schema does not
            out[k] = {p: _to_swagger({kk: vv for kk, vv in ps.items() if not (p in ("apiVersion", "kind") and kk == "enum")})
                      for p, ps in v.items()}
        elif k == "enum" and isinstance(v, list):
            out[k] = [x for x in v if x is not None]
        elif k == "properties" and isinstance(v, dict):
            out[k] = {p: _to_swagger(ps) for p, ps in v.items()}
        else:
            out[k] = _to_swagger(v)
    return out


def regenerate(version: str) -> dict[str, Any]:
    import kubernetes_validate  # dev dependency

    src = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}-local" / "_definitions.json"
    defs = json.loads(src.read_text())["$defs"]
    keep: dict[str, Any] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep[name] = _to_swagger(defs[name])
        refs: list[str] = []

        def collect(x: Any, refs: list[str] = refs) -> None:
            if isinstance(x, dict):
                for k, v in x.items():
                    if k == "$ref" and isinstance(v, str):
                        refs.append(v.rsplit("/", 1)[1])
                    else:
                        collect(v)
            elif isinstance(x, list):
                for v in x:
                    collect(v)

        collect(keep[name])
        todo.extend(refs)
    return {"version": version, "definitions": dict(sorted(keep.items()))}


# -- documents -----------------------------------------------------------------------------------


@functools.cache
def _definitions() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DATA.read_text())["definitions"]
    return data


def _gvk(res: Resource) -> dict[str, str]:
    return {"group": res.group, "kind": res.kind, "version": "v1"}


def _prefix(res: Resource) -> str:
    return f"/apis/{res.group}/v1" if res.group else "/api/v1"


def _op_id(action: str, res: Resource, namespaced_path: bool) -> str:
    group = "BatchV1" if res.group else "CoreV1"
    verb = {"list": "list", "post": "create", "get": "read", "put": "replace", "patch": "patch",
            "delete": "delete", "deletecollection": "deletecollection"}[action]
    scope = "Namespaced" if namespaced_path else ""
    kind = res.kind if action != "list" or namespaced_path or not res.namespaced else f"{res.kind}ForAllNamespaces"
    return f"{verb}{group}{scope}{kind}"


def _params(action: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if action in ("list", "deletecollection"):
        out += [{"name": n, "in": "query", "type": t, "uniqueItems": True, "description": d} for n, t, d in (
            ("labelSelector", "string", "A selector to restrict the list of returned objects by their labels."),
            ("fieldSelector", "string", "A selector to restrict the list of returned objects by their fields."),
            ("limit", "integer", "The maximum number of responses to return for a list call."),
            ("continue", "string", "The continue option should be set when retrieving more results from the server."),
            ("resourceVersion", "string", "Where to start a watch; lists always serve the latest state."),
            ("timeoutSeconds", "integer", "Timeout for the list/watch call."),
        )]
        if action == "list":
            out.append({"name": "watch", "in": "query", "type": "boolean", "uniqueItems": True,
                        "description": "Watch for changes to the described resources."})
    if action in _WRITE:
        out.append({"name": "dryRun", "in": "query", "type": "string", "uniqueItems": True,
                    "description": "When present, indicates that modifications should not be persisted. "
                                   "The only valid value is All."})
    if action in ("post", "put", "patch"):
        out.append({"name": "fieldManager", "in": "query", "type": "string", "uniqueItems": True,
                    "description": "A name associated with the actor or entity that is making these changes."})
    if action in ("delete", "deletecollection"):
        out += [{"name": n, "in": "query", "type": t, "uniqueItems": True, "description": d} for n, t, d in (
            ("gracePeriodSeconds", "integer", "The duration in seconds before the object should be deleted."),
            ("propagationPolicy", "string", "Orphan, Background or Foreground garbage collection."),
        )]
    return out


def _ref(name: str, v3: bool) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}" if v3 else f"#/definitions/{name}"}


def _paths(v3: bool, only: str | None = None) -> dict[str, Any]:
    """Every path served: per resource, its collection(s) and item, with their operations."""
    paths: dict[str, Any] = {}
    for res, coll_ops, item_ops in _SERVED:
        base = _prefix(res)
        if only is not None and base.lstrip("/") != only:
            continue
        model = DEFINITION[res.plural]
        shapes: list[tuple[str, tuple[str, ...], bool]] = []
        if res.namespaced:
            shapes.append((f"{base}/namespaces/{{namespace}}/{res.plural}", coll_ops, True))
            shapes.append((f"{base}/namespaces/{{namespace}}/{res.plural}/{{name}}", item_ops, True))
            shapes.append((f"{base}/{res.plural}", ("list",), False))
        elif res is NAMESPACES:
            shapes.append((f"{base}/{res.plural}", coll_ops, False))
            shapes.append((f"{base}/{res.plural}/{{name}}", item_ops, False))
        else:
            shapes.append((f"{base}/{res.plural}", coll_ops, False))
            shapes.append((f"{base}/{res.plural}/{{name}}", item_ops, False))
        for path, ops, namespaced_path in shapes:
            item: dict[str, Any] = {}
            for action in ops:
                out_model = model + "List" if action == "list" else (f"{META}.Status" if "delete" in action else model)
                op: dict[str, Any] = {
                    "description": f"{action} {res.kind}",
                    "operationId": _op_id(action, res, namespaced_path),
                    "tags": [("batch_v1" if res.group else "core_v1")],
                    "x-kubernetes-action": action,
                    "x-kubernetes-group-version-kind": _gvk(res),
                }
                params = _params(action)
                if v3:
                    op["parameters"] = [{"name": p["name"], "in": p["in"], "description": p["description"],
                                         "schema": {"type": p["type"], "uniqueItems": True}} for p in params]
                    if action in ("post", "put", "patch"):
                        body = _ref(f"{META}.Patch" if action == "patch" else model, True)
                        types = (["application/json-patch+json", "application/merge-patch+json",
                                  "application/strategic-merge-patch+json"] if action == "patch" else ["*/*"])
                        op["requestBody"] = {"content": {t: {"schema": body} for t in types}, "required": True}
                    op["responses"] = {"200": {"description": "OK", "content": {
                        "application/json": {"schema": _ref(out_model, True)}}}}
                else:
                    if action in ("post", "put", "patch"):
                        params.append({"name": "body", "in": "body", "required": True,
                                       "schema": _ref(f"{META}.Patch" if action == "patch" else model, False)})
                    op["parameters"] = params
                    op["consumes"] = ["*/*"] if action != "patch" else [
                        "application/json-patch+json", "application/merge-patch+json", "application/strategic-merge-patch+json"]
                    op["produces"] = ["application/json", "application/yaml"]
                    op["responses"] = {"200": {"description": "OK", "schema": _ref(out_model, False)}}
                item[_METHOD[action]] = op
            path_params = [("namespace", "object name and auth scope, such as for teams and projects")] if namespaced_path else []
            if path.endswith("{name}"):
                path_params.append(("name", f"name of the {res.kind}"))
            if path_params:
                item["parameters"] = [
                    ({"name": n, "in": "path", "required": True, "description": d, "schema": {"type": "string", "uniqueItems": True}}
                     if v3 else {"name": n, "in": "path", "required": True, "type": "string", "uniqueItems": True, "description": d})
                    for n, d in path_params
                ]
            paths[path] = item
    return paths


def _info() -> dict[str, str]:
    return {"title": "Kubernetes", "version": KUBE_VERSION[2]}


@functools.cache
def v2_document() -> dict[str, Any]:
    return {"swagger": "2.0", "info": _info(), "paths": _paths(False), "definitions": _definitions()}


def _v3_schema(s: Any) -> Any:
    if isinstance(s, list):
        return [_v3_schema(x) for x in s]
    if not isinstance(s, dict):
        return s
    out: dict[str, Any] = {}
    for k, v in s.items():
        if k == "$ref":
            # OpenAPI 3.0 ignores siblings of $ref; the API server wraps it in allOf to keep them
            out["allOf"] = [{"$ref": v.replace("#/definitions/", "#/components/schemas/")}]
        elif k == "properties":
            out[k] = {p: _v3_schema(ps) for p, ps in v.items()}
        else:
            out[k] = _v3_schema(v)
    return out


V3_GROUPS = ("api/v1", "apis/batch/v1")
# the API server's v3 form of the two types that are strings or numbers
_V3_SPECIAL: dict[str, Any] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "description": "Quantity is a fixed-point representation of a number (e.g. 1, 500m, 80Gi).",
        "oneOf": [{"type": "string"}, {"type": "number"}]},
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "description": "IntOrString is a type that can hold an int32 or a string.",
        "format": "int-or-string", "type": "string", "x-kubernetes-int-or-string": True},
}


@functools.cache
def v3_document(gv: str) -> bytes:
    doc = {
        "openapi": "3.0.0",
        "info": _info(),
        "paths": _paths(True, only=gv),
        "components": {"schemas": {k: _v3_schema(_V3_SPECIAL.get(k, v)) for k, v in _definitions().items()}},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def v3_index() -> dict[str, Any]:
    return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={_hash(gv)}"} for gv in V3_GROUPS}}


@functools.cache
def _hash(gv: str) -> str:
    return hashlib.sha512(v3_document(gv)).hexdigest()[:128].upper()


# -- protobuf (gnostic openapi.v2.Document) ------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _str(field: int, s: str) -> bytes:
    return _ld(field, s.encode()) if s else b""


def _bool(field: int, v: bool) -> bytes:
    return _varint(field << 3) + b"\x01" if v else b""


def _int(field: int, v: int) -> bytes:
    return _varint(field << 3) + _varint(int(v))


def _double(field: int, v: float) -> bytes:
    return _varint(field << 3 | 1) + struct.pack("<d", float(v))


def _any(value: Any) -> bytes:
    # Any { google.protobuf.Any value = 1; string yaml = 2; }: JSON is YAML
    return _str(2, json.dumps(value, separators=(",", ":")))


def _named_any(field: int, name: str, value: Any) -> bytes:
    return _ld(field, _str(1, name) + _ld(2, _any(value)))


def _schema(s: dict[str, Any]) -> bytes:
    b = bytearray()
    b += _str(1, s.get("$ref", ""))
    b += _str(2, s.get("format", ""))
    b += _str(3, s.get("title", ""))
    b += _str(4, s.get("description", ""))
    if "default" in s:
        b += _ld(5, _any(s["default"]))
    if "maximum" in s:
        b += _double(7, s["maximum"])
    if "minimum" in s:
        b += _double(9, s["minimum"])
    for r in s.get("required") or []:
        b += _str(19, r)
    for e in s.get("enum") or []:
        b += _ld(20, _any(e))
    ap = s.get("additionalProperties")
    if isinstance(ap, dict):
        b += _ld(21, _ld(1, _schema(ap)))
    elif isinstance(ap, bool):
        b += _ld(21, _varint(2 << 3) + (b"\x01" if ap else b"\x00"))
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        b += _ld(22, b"".join(_str(1, t) for t in types))
    if isinstance(s.get("items"), dict):
        b += _ld(23, _ld(1, _schema(s["items"])))
    if isinstance(s.get("properties"), dict):
        b += _ld(25, b"".join(_ld(1, _str(1, k) + _ld(2, _schema(v))) for k, v in s["properties"].items()))
    for k, v in s.items():
        if k.startswith("x-"):
            b += _named_any(31, k, v)
    return bytes(b)


def _parameter(p: dict[str, Any]) -> bytes:
    if p["in"] == "body":
        body = _str(1, p.get("description", "")) + _str(2, p["name"]) + _str(3, "body") + _bool(4, p.get("required", False))
        body += _ld(5, _schema(p["schema"]))
        param = _ld(1, body)
    else:
        # Query/PathParameterSubSchema: required 1, in 2, description 3, name 4, then
        # query: allow_empty_value 5, type 6 ... unique_items 20; path: type 5 ... unique_items 19
        sub = _bool(1, p.get("required", False)) + _str(2, p["in"]) + _str(3, p.get("description", "")) + _str(4, p["name"])
        if p["in"] == "query":
            sub += _str(6, p.get("type", "")) + _bool(20, p.get("uniqueItems", False))
            param = _ld(2, _ld(3, sub))
        else:
            sub += _str(5, p.get("type", "")) + _bool(19, p.get("uniqueItems", False))
            param = _ld(2, _ld(4, sub))
    return _ld(1, param)  # ParametersItem.parameter


def _operation(op: dict[str, Any]) -> bytes:
    b = bytearray()
    for t in op.get("tags") or []:
        b += _str(1, t)
    b += _str(3, op.get("description", ""))
    b += _str(5, op.get("operationId", ""))
    for m in op.get("produces") or []:
        b += _str(6, m)
    for m in op.get("consumes") or []:
        b += _str(7, m)
    for p in op.get("parameters") or []:
        b += _ld(8, _parameter(p))
    responses = b"".join(
        _ld(1, _str(1, code) + _ld(2, _ld(1, _str(1, r.get("description", "")) + _ld(2, _ld(1, _schema(r["schema"]))))))
        for code, r in (op.get("responses") or {}).items()
    )
    b += _ld(9, responses)
    for k, v in op.items():
        if k.startswith("x-"):
            b += _named_any(13, k, v)
    return bytes(b)


_PATH_FIELDS = {"get": 2, "put": 3, "post": 4, "delete": 5, "patch": 8}


@functools.cache
def v2_protobuf() -> bytes:
    doc = v2_document()
    b = bytearray()
    b += _str(1, doc["swagger"])
    b += _ld(2, _str(1, doc["info"]["title"]) + _str(2, doc["info"]["version"]))
    paths = bytearray()
    for path, item in doc["paths"].items():
        pi = bytearray()
        for method, field in _PATH_FIELDS.items():
            if method in item:
                pi += _ld(field, _operation(item[method]))
        for p in item.get("parameters") or []:
            pi += _ld(9, _parameter(p))
        paths += _ld(2, _str(1, path) + _ld(2, bytes(pi)))
    b += _ld(8, bytes(paths))
    b += _ld(9, b"".join(_ld(1, _str(1, k) + _ld(2, _schema(v))) for k, v in doc["definitions"].items()))
    return bytes(b)


def _main(argv: list[str]) -> int:
    version = argv[0] if argv else KUBE_VERSION[2].lstrip("v").split("+")[0].split("-")[0]
    data = regenerate(version)
    DATA.write_text(json.dumps(data, indent=None, separators=(",", ":"), sort_keys=False) + "\n")
    print(f"wrote {DATA} ({len(data['definitions'])} definitions from Kubernetes {version})")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
