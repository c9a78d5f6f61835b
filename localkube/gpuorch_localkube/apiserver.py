"""The HTTP front of a local cluster: the Kubernetes API subset gpuorch uses, over HTTP/1.1.

Served by `httpserver.HTTPServer`: one asyncio loop in one thread per cluster, requests answered
in its callbacks (the store lock is taken per operation, as before). Watches and followed logs
are sent with chunked transfer encoding, one JSON event per line.

Watches are not threads: each is a `_Watch` registered with the `APIServer`. A store commit
(any thread, lock held) only schedules one fan-out on the loop, if none is pending; the fan-out
reads the events committed since the last one and hands each watch the ones it matches. An
event's object is serialised once (`store.Event.data`), whatever the number of watchers, and the
same bytes answer the create and later lists (`store.Store.encoded`).

A partition closes the listening socket and every open connection (clients see connection
refused / reset: a urllib3 error, never an HTTP status); heal listens again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec
import yaml

from . import dcgm, openapi, protobuf
from .errors import EVENTS, JOBS, NAMESPACES, NODES, PODS, SECRETS, ApiError, Resource
from .httpserver import Exchange, HTTPServer, LoopThread, Stream
from .kubelet import log_path
from .selectors import LabelSelector, parse_field_selector, parse_label_selector
from .tables import table, wants_table
from .version import version_info

if TYPE_CHECKING:
    from .core import ClusterCore
    from .store import Event

__all__ = ["APIServer"]

log = logging.getLogger("gpuorch_localkube.api")
_encoder = msgspec.json.Encoder()
DEFAULT_WATCH_SECONDS = 1800
#: A watcher that has this many bytes written and not yet read is cut (as an API server drops a
#: watcher that cannot keep up); it lists again and resumes.
MAX_WATCH_BACKLOG = 64 * 1024 * 1024

_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def parse_bool(value: str | None, name: str) -> bool:
    """Go's strconv.ParseBool, as the API server parses boolean query parameters."""
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ApiError.bad_request(f"invalid boolean value for {name}: {value!r}")


def parse_int(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError as e:
        raise ApiError.bad_request(f"invalid integer value for {name}: {value!r}") from e


_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

# bodies the server decodes (anything else is 415, as an API server answers a type it has no codec for)
_JSON_TYPES = ("application/json", "application/strategic-merge-patch+json", "application/merge-patch+json",
               "application/json-patch+json")
_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
_ACCEPTED = "application/json, application/yaml"


def _first(v: Any) -> str:
    """DeleteOptions.dryRun is a list of strings."""
    if isinstance(v, list):
        return str(v[0]) if v else ""
    return "" if v is None else str(v)


def parse_dry_run(value: str | None) -> bool:
    """`dryRun=All` -> True; unset -> False; any other value is refused before anything is written."""
    if value is None or value == "":
        return False
    if value == "All":
        return True
    raise ApiError.bad_request(f'Invalid dryRun value: "{value}": supported values: "All"')


def _discovery(group: str, port: int) -> dict[str, Any] | None:
    if group == "api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{port}"}],
        }
    if group == "apis":
        gv = {"groupVersion": "batch/v1", "version": "v1"}
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [{"name": "batch", "versions": [gv], "preferredVersion": gv}]}
    if group == "apis/batch":
        gv = {"groupVersion": "batch/v1", "version": "v1"}
        return {"kind": "APIGroup", "apiVersion": "v1", "name": "batch", "versions": [gv], "preferredVersion": gv}
    if group == "api/v1":
        return {
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": [
                {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": _VERBS, "shortNames": ["po"],
                 "categories": ["all"]},
                {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
                {"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
                {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node",
                 "verbs": ["get", "list", "patch", "update", "watch"], "shortNames": ["no"]},
                {"name": "nodes/status", "singularName": "", "namespaced": False, "kind": "Node", "verbs": ["get"]},
                {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
                 "verbs": ["create", "get", "list"], "shortNames": ["ns"]},
                {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event",
                 "verbs": ["get", "list", "watch"], "shortNames": ["ev"]},
                {"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret",
                 "verbs": ["create", "delete", "get", "list", "watch"]},
            ],
        }
    if group == "apis/batch/v1":
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": "batch/v1",
            "resources": [
                {"name": "jobs", "singularName": "job", "namespaced": True, "kind": "Job", "verbs": _VERBS, "categories": ["all"]},
                {"name": "jobs/status", "singularName": "", "namespaced": True, "kind": "Job", "verbs": ["get"]},
            ],
        }
    return None


class _Abort(Exception):
    """Drop the connection without an answer (partition or shutdown)."""


class _Handler:
    """One request: decoded, routed, answered (or turned into a watch or a followed log)."""

    def __init__(self, api: APIServer, x: Exchange):
        self.api = api
        self.x = x
        self.command = x.request.method
        self.path = x.request.target
        self.headers = x.request.headers  # lower-case names
        self.body_owned = False  # the body was decoded from JSON here: nobody else holds it

    # -- plumbing --------------------------------------------------------------------------------

    def _send(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send_bytes(code, _encoder.encode(obj), "application/json", headers)

    def _send_bytes(self, code: int, data: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.x.respond(code, data, ctype, headers)

    def _send_stored(self, code: int, res: Resource, obj: dict[str, Any], keep: bool = False) -> None:
        """A stored object: its version's JSON, encoded once for the answer and every watcher
        (`keep`: the answer to the write that committed it, the watchers' bytes too)."""
        self._send_bytes(code, self.api.core.store.encoded(res.plural, obj, keep), "application/json")

    def _send_list(self, res: Resource, listed: dict[str, Any], q: dict[str, str]) -> None:
        if wants_table(self.headers.get("accept")):
            return self._send_obj(200, res, listed, q)
        store = self.api.core.store
        raw = [msgspec.Raw(store.encoded(res.plural, o)) for o in listed["items"]]
        return self._send(200, {**listed, "items": raw})

    def _body(self) -> Any:
        raw = self.x.request.body
        if not raw:
            return None
        ctype = (self.headers.get("content-type") or "application/json").split(";")[0].strip().lower()
        if ctype in _YAML_TYPES:
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as e:
                raise ApiError.bad_request(f"the body of the request could not be decoded as YAML: {e}") from e
        if ctype == "application/vnd.kubernetes.protobuf" and self.command == "DELETE":
            try:
                return protobuf.decode_delete_options(raw)
            except protobuf.ProtobufError:
                pass
        if ctype not in _JSON_TYPES and ctype != "application/apply-patch+yaml":
            raise ApiError.unsupported_media_type(ctype, _ACCEPTED)
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            raise ApiError.bad_request(f"the body of the request could not be decoded as JSON: {e}") from e
        self.body_owned = True
        return body

    def _send_obj(self, code: int, res: Resource, obj: dict[str, Any], q: dict[str, str],
                  headers: dict[str, str] | None = None) -> None:
        """An object or a list, as a Table when the client asked for one (kubectl get)."""
        if wants_table(self.headers.get("accept")) and res.plural in ("pods", "nodes", "jobs", "namespaces", "events"):
            items = obj["items"] if "items" in obj else [obj]
            meta = obj["metadata"] if "items" in obj else {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            return self._send(code, table(res.plural, items, meta, q.get("includeObject")), headers)
        return self._send(code, obj, headers)

    def dispatch(self) -> None:
        method = self.command
        try:
            if not self.api.serving:
                raise _Abort()
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            parts = [unquote(p) for p in url.path.split("/") if p]
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
            self._route(method, parts, query, body)
        except _Abort:
            self.x.abort()
        except ApiError as e:
            if not self.x.answered:
                self._send(e.code, e.status())
            elif self.x.stream_obj is not None and not self.x.stream_obj.closed:
                self.x.abort()
        except Exception as e:  # pragma: no cover - a bug: answer like an API server does
            log.exception("internal error serving %s %s", method, self.path)
            if not self.x.answered:
                self._send(500, ApiError(500, "InternalError", f"Internal error occurred: {e!r}").status())
            elif self.x.stream_obj is not None and not self.x.stream_obj.closed:
                self.x.abort()  # a stream that broke half-way: the client sees the connection end
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s", method, self.path)

    # -- routing ---------------------------------------------------------------------------------

    def _route(self, method: str, parts: list[str], q: dict[str, str], body: Any) -> None:
        core = self.api.core
        if method == "GET":
            if parts == ["version"]:
                return self._send(200, version_info())
            if parts in (["healthz"], ["readyz"], ["livez"]):
                return self._send_bytes(200, b"ok", "text/plain; charset=utf-8")
            disc = _discovery("/".join(parts), self.api.port)
            if disc is not None:
                return self._send(200, disc)
            if parts == ["openapi", "v2"]:
                if openapi.V2_PROTOBUF in (self.headers.get("accept") or ""):
                    # the @ of the requested type is no valid media type: the API server answers with a dot
                    return self._send_bytes(200, openapi.v2_protobuf(), openapi.V2_PROTOBUF.replace("@", "."))
                return self._send(200, openapi.v2_document())
            if parts == ["openapi", "v3"]:
                return self._send(200, openapi.v3_index())
            if parts[:2] == ["openapi", "v3"] and "/".join(parts[2:]) in openapi.V3_GROUPS:
                return self._send_bytes(200, openapi.v3_document("/".join(parts[2:])), "application/json")
        if method == "GET" and len(parts) >= 7 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "services" \
                and parts[6] == "proxy":
            return self._service_proxy(parts[3], parts[5], "/".join(parts[7:]))
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif parts[:3] == ["apis", "batch", "v1"]:
            group, rest = "batch", parts[3:]
        else:
            raise ApiError.path_not_found()
        watch = False
        if rest and rest[0] == "watch":
            watch, rest = True, rest[1:]
        ns: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise ApiError.path_not_found()
        plural, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
        res = {"pods": PODS, "nodes": NODES, "namespaces": NAMESPACES, "jobs": JOBS, "events": EVENTS, "secrets": SECRETS}.get(plural)
        if res is None or res.group != group or (ns is not None and not res.namespaced):
            raise ApiError.path_not_found()
        dry = parse_dry_run(q.get("dryRun"))
        if res is NAMESPACES:
            return self._namespaces(method, name, sub, body, q)
        if (res is EVENTS and method != "GET") or (res is SECRETS and method in ("PATCH", "PUT")):
            raise ApiError.method_not_allowed()
        watch = watch or parse_bool(q.get("watch"), "watch")
        if name is None:
            if method == "GET":
                if watch:
                    return self._watch(res, ns, q)
                return self._send_list(res, core.list(res, ns, q.get("labelSelector"), q.get("fieldSelector"),
                                                      parse_int(q.get("limit"), "limit"), q.get("continue")), q)
            if method == "POST" and ns is not None and res is SECRETS:
                return self._send(201, core.create_secret(ns, body, dry))
            if method == "POST" and ns is not None and res in (PODS, JOBS):
                obj = core.create_job(ns, body, dry, self.body_owned) if res is JOBS else core.create_pod(ns, body, dry)
                return self._send_stored(201, res, obj, keep=not dry)
            if method == "DELETE" and ns is not None and res in (PODS, JOBS):
                return self._delete_collection(res, ns, q, body)
            raise ApiError.method_not_allowed()
        if sub not in (None, "status", "log") or (sub == "log" and res is not PODS):
            raise ApiError.path_not_found()
        key_ns = ns or ""
        if res.namespaced and ns is None:
            raise ApiError.path_not_found()
        if method == "GET":
            if sub == "log":
                return self._log(key_ns, name, q)
            obj = core.get(res, key_ns, name)
            if wants_table(self.headers.get("accept")):
                return self._send_obj(200, res, obj, q)
            return self._send_stored(200, res, obj)
        if sub is not None:
            raise ApiError.method_not_allowed()
        if method == "DELETE":
            return self._delete(res, key_ns, name, q, body)
        if method == "PATCH":
            ctype = self.headers.get("content-type") or "application/strategic-merge-patch+json"
            return self._send(200, core.patch(res, key_ns, name, ctype, body, dry_run=dry))
        if method == "PUT":
            return self._send(200, core.replace(res, key_ns, name, body, dry_run=dry))
        raise ApiError.method_not_allowed()

    def _service_proxy(self, namespace: str, service: str, path: str) -> None:
        """`GET .../namespaces/<ns>/services/<svc>/proxy/<path>`: only the cluster's dcgm-exporter
        (gpuorch_localkube.dcgm) is a Service here; anything else is not found, as on a cluster
        without it."""
        core = self.api.core
        cfg = core.config.dcgm_exporter
        if cfg is None or not cfg.proxies(namespace, service):
            name = next((p for p in service.split(":") if p not in ("http", "https")), service)
            raise ApiError(404, "NotFound", f'services "{name}" not found', {"name": name, "kind": "services"})
        if path != "metrics":
            raise ApiError(404, "NotFound", f"404 page not found: /{path}")

        def current() -> list[dcgm.Device]:
            with core.store.lock:
                return dcgm.devices(core.store.values("nodes"), core.store.values("pods"), core.state_dir)

        body = self.api.exporter.scrape(current, time.time())
        return self._send_bytes(200, body, "text/plain; version=0.0.4; charset=utf-8")

    def _namespaces(self, method: str, name: str | None, sub: str | None, body: Any, q: dict[str, str]) -> None:
        core = self.api.core
        if sub is not None:
            raise ApiError.path_not_found()
        if method == "GET" and name is None:
            return self._send_obj(200, NAMESPACES, core.list_namespaces(), q)
        if method == "GET":
            return self._send_obj(200, NAMESPACES, core.namespace_object(name or ""), q)
        if method == "POST" and name is None:
            return self._send(201, core.create_namespace(body, dry_run=parse_dry_run(q.get("dryRun"))))
        raise ApiError.method_not_allowed()

    # -- deletes ---------------------------------------------------------------------------------

    def _delete_options(self, q: dict[str, str], body: Any) -> dict[str, Any]:
        opts: dict[str, Any] = dict(body) if isinstance(body, dict) else {}
        if q.get("propagationPolicy"):
            opts["propagationPolicy"] = q["propagationPolicy"]
        if q.get("gracePeriodSeconds"):
            opts["gracePeriodSeconds"] = parse_int(q["gracePeriodSeconds"], "gracePeriodSeconds")
        if q.get("orphanDependents"):
            opts["orphanDependents"] = parse_bool(q["orphanDependents"], "orphanDependents")
        g = opts.get("gracePeriodSeconds")
        if g is not None and (isinstance(g, bool) or not isinstance(g, int)):
            raise ApiError.bad_request("gracePeriodSeconds must be an integer")
        return opts

    def _delete(self, res: Resource, ns: str, name: str, q: dict[str, str], body: Any) -> None:
        core = self.api.core
        opts = self._delete_options(q, body)
        if parse_dry_run(q.get("dryRun") or _first(opts.get("dryRun"))):
            return self._send(200, core.get(res, ns, name))
        if res is PODS:
            return self._send(200, core.delete_pod(ns, name, opts.get("gracePeriodSeconds"), opts.get("preconditions")))
        if res is SECRETS:
            return self._send(200, core.delete_secret(ns, name, opts.get("preconditions")))
        if res is JOBS:
            out, warnings = core.delete_job(ns, name, opts.get("propagationPolicy"), opts.get("preconditions"), opts.get("orphanDependents"))
            return self._send(200, out, {"Warning": warnings[0]} if warnings else None)
        raise ApiError.method_not_allowed()

    def _delete_collection(self, res: Resource, ns: str, q: dict[str, str], body: Any) -> None:
        core = self.api.core
        opts = self._delete_options(q, body)
        listed = core.list(res, ns, q.get("labelSelector"), q.get("fieldSelector"))
        if parse_dry_run(q.get("dryRun") or _first(opts.get("dryRun"))):
            return self._send(200, listed)
        items = listed["items"]
        for o in items:
            name = o["metadata"]["name"]
            with contextlib.suppress(ApiError):
                if res is PODS:
                    core.delete_pod(ns, name, opts.get("gracePeriodSeconds"))
                else:
                    core.delete_job(ns, name, opts.get("propagationPolicy"), None, opts.get("orphanDependents"))
        return self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})

    # -- watch -----------------------------------------------------------------------------------


    # -- watch -----------------------------------------------------------------------------------

    def _watch(self, res: Resource, ns: str | None, q: dict[str, str]) -> None:
        api = self.api
        store = api.core.store
        lsel = parse_label_selector(q.get("labelSelector"))
        fsel = parse_field_selector(res.plural, q.get("fieldSelector"))
        timeout = parse_int(q.get("timeoutSeconds"), "timeoutSeconds")
        seconds = timeout if timeout is not None and timeout > 0 else DEFAULT_WATCH_SECONDS
        rv_param = q.get("resourceVersion")
        since = None if rv_param in (None, "", "0") else (parse_int(rv_param, "resourceVersion") or 0)
        table_of = q.get("includeObject") if wants_table(self.headers.get("accept")) else False
        w = _Watch(res.plural, ns, lsel, fsel, table_of)
        if table_of is False:  # watches with the same filter share their lines
            w.key = (res.plural, ns, q.get("labelSelector") or "", q.get("fieldSelector") or "")
        if table_of is False and parse_bool(q.get("allowWatchBookmarks"), "allowWatchBookmarks"):
            w.bookmark = b'{"type":"BOOKMARK","object":{"kind":"%s","apiVersion":"%s","metadata":{"resourceVersion":"%%d"}}}\n' % (
                res.kind.encode(), res.api_version.encode())
        stream = self.x.stream("application/json")
        with store.lock:  # the first events and the registration, with no commit in between
            if since is None:
                initial = [w.line("ADDED", o, store.encoded(res.plural, o)) for o in store.list(res.plural, ns) if w.matches(o)]
            else:
                try:
                    events = store.events_after(since)
                except ApiError as e:
                    stream.write(_encoder.encode({"type": "ERROR", "object": e.status()}) + b"\n")
                    stream.end()
                    return
                initial = [line for line in (w.event_line(ev) for ev in events) if line is not None]
                for ev in events:
                    if ev.rv <= api._seen:  # the fan-out is past it: keep no bytes for it
                        ev.sent()
            w.last = store.rv
            w.stream = stream
            api._watch_started(w, seconds)
        if initial:
            stream.write(b"".join(initial))

    # -- logs ------------------------------------------------------------------------------------

    def _log(self, ns: str, name: str, q: dict[str, str]) -> None:
        core = self.api.core
        pod = core.get(PODS, ns, name)
        spec = pod["spec"]
        mains = [c["name"] for c in spec.get("containers") or []]
        inits = [c["name"] for c in spec.get("initContainers") or []]
        container = q.get("container")
        if not container:
            if len(mains) != 1:
                raise ApiError.bad_request(
                    f"a container name must be specified for pod {name}, choose one of: [{' '.join(mains)}]"
                    + (f" or one of the init containers: [{' '.join(inits)}]" if inits else "")
                )
            container = mains[0]
        if container not in mains + inits:
            raise ApiError.bad_request(f"container {container} is not valid for pod {name}")
        path = log_path(core, pod, container)
        if not path.exists():
            st = pod.get("status") or {}
            reason = "ContainerCreating"
            for cs in (st.get("containerStatuses") or []) + (st.get("initContainerStatuses") or []):
                if cs.get("name") == container:
                    reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason") or reason
            raise ApiError.bad_request(f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        data = path.read_bytes()
        tail = parse_int(q.get("tailLines"), "tailLines")
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail:]) if tail > 0 else b""
        limit = parse_int(q.get("limitBytes"), "limitBytes")
        if limit is not None and limit > 0:
            data = data[:limit]
        if not parse_bool(q.get("follow"), "follow"):
            return self._send_bytes(200, data, "text/plain")
        uid = pod["metadata"]["uid"]
        stream = self.x.stream("text/plain")
        stream.write(data)
        task = asyncio.get_running_loop().create_task(self._follow(stream, path, path.stat().st_size, uid, container))

        def cancel() -> None:  # the client went away (this also keeps a reference to the task)
            task.cancel()

        stream.on_close.append(cancel)

    async def _follow(self, stream: Stream, path: Any, offset: int, uid: str, container: str) -> None:
        """Send what the container writes to its log, until it stops (then end the response)."""
        store = self.api.core.store
        kubelet = self.api.core.kubelet
        try:
            while not stream.closed:
                with path.open("rb") as f:
                    f.seek(offset)
                    more = f.read()
                offset += len(more)
                stream.write(more)
                with store.lock:
                    running = container in kubelet.pod_pids(uid)
                if not running and not more:
                    break
                await asyncio.sleep(0.1)
        except OSError:
            self.x.abort()
            return
        stream.end()


class _Watch:
    """One open watch: its filter, where it is in the history, and its response stream."""

    __slots__ = ("bookmark", "first_row", "fsel", "key", "last", "lsel", "ns", "resource", "stream", "table_of", "timer")

    def __init__(
        self, resource: str, ns: str | None, lsel: LabelSelector, fsel: Callable[[dict[str, Any]], bool], table_of: str | bool | None,
    ):
        self.resource = resource
        self.ns = ns
        self.lsel = lsel
        self.fsel = fsel
        self.table_of = table_of  # False: objects; else a Table per event with this includeObject
        self.first_row = True
        self.last = 0  # resourceVersion this watch has seen up to
        self.stream: Stream | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.bookmark: bytes | None = None  # allowWatchBookmarks: the BOOKMARK line, a %d for the version
        self.key: tuple[str, str | None, str, str] | None = None  # its filter, when its lines can be shared

    def matches(self, o: dict[str, Any] | None) -> bool:
        if o is None:
            return False
        meta = o["metadata"]
        return (self.ns is None or meta.get("namespace") == self.ns) and self.lsel.matches(meta.get("labels")) and self.fsel(o)

    def line(self, etype: str, obj: dict[str, Any], data: bytes) -> bytes:
        """One event line; `data` is `obj` as JSON."""
        if self.table_of is not False:
            include = self.table_of if isinstance(self.table_of, str) else None
            tbl = table(self.resource, [obj], {"resourceVersion": obj["metadata"].get("resourceVersion", "")},
                        include, headers=self.first_row)
            self.first_row = False
            return _encoder.encode({"type": etype, "object": tbl}) + b"\n"
        return b'{"type":"%s","object":%s}\n' % (etype.encode(), data)

    def event_line(self, ev: Event) -> bytes | None:
        """The line this watch sends for a commit, or None (another resource, or not matching)."""
        if ev.resource != self.resource:
            return None
        now_ok, was_ok = self.matches(ev.obj), self.matches(ev.prev)
        if ev.type == "ADDED":
            etype = "ADDED" if now_ok else None
        elif ev.type == "DELETED":
            etype = "DELETED" if was_ok else None
        elif now_ok:
            etype = "MODIFIED" if was_ok else "ADDED"
        else:
            etype = "DELETED" if was_ok else None
        return None if etype is None else self.line(etype, ev.obj, ev.data() if self.table_of is False else b"")


class APIServer:
    """Serves one cluster's API on 127.0.0.1:port (port 0: pick one; kept across partition/heal)."""

    def __init__(self, core: ClusterCore, host: str = "127.0.0.1", port: int = 0, runner: LoopThread | None = None):
        self.core = core
        self.host = host
        self.port = port
        self._own_runner = runner is None
        self.runner = runner or LoopThread(f"localkube-api-{core.config.name}")  # the cluster's loop, or one of its own
        self.delay = 0.0
        self._http: HTTPServer | None = None
        self._watches: set[_Watch] = set()
        self._seen = 0  # the fan-out has handed out every event up to this resourceVersion
        self._fanout_pending = False
        core.store.add_hook(self._committed)
        # the cluster's dcgm-exporter, served at its service proxy path (gpuorch_localkube.dcgm)
        self.exporter = dcgm.Exporter(core.config.name, core.config.dcgm_exporter or dcgm.DcgmConfig())

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def serving(self) -> bool:
        return self._http is not None

    @property
    def delay(self) -> float:
        return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        self._delay = seconds
        if getattr(self, "_http", None) is not None:
            self._http.delay = seconds  # type: ignore[union-attr]

    def _handle(self, x: Exchange) -> None:
        _Handler(self, x).dispatch()

    def start(self) -> None:
        if self._http is not None:
            return
        self.runner.start()
        http = HTTPServer(self._handle, self.host, self.port, self.runner)
        http.delay = self._delay
        with self.core.store.lock:
            self._seen = self.core.store.rv
            self._fanout_pending = False
        http.start()
        self.port = http.port
        self._http = http

    def stop(self) -> None:
        """Stop answering: close the listening socket and cut every open connection."""
        http, self._http = self._http, None
        if http is None:
            return
        http.stop()
        self._watches.clear()
        if self._own_runner:
            self.runner.stop()

    # -- the watch fan-out (on the loop) ---------------------------------------------------------

    def _committed(self) -> None:
        """A commit (any thread, store lock held): schedule one fan-out if watches are open."""
        if self._watches and not self._fanout_pending:
            http = self._http
            if http is not None:
                self._fanout_pending = True
                self.runner.soon(self._fanout)  # after the callbacks of this turn of the loop: commits batch up

    def _watch_started(self, w: _Watch, seconds: float) -> None:
        """Register a watch (on the loop, store lock held, `w.last` the store's resourceVersion)."""
        assert w.stream is not None and self._http is not None
        if not self._watches:  # no fan-out was scheduled while nobody watched
            self._seen = w.last
        self._watches.add(w)
        w.stream.on_close.append(lambda: self._watch_gone(w))
        w.timer = self._http.loop.call_later(seconds, self._watch_ended, w)

    def _watch_gone(self, w: _Watch) -> None:
        self._watches.discard(w)
        if w.timer is not None:
            w.timer.cancel()

    def _watch_ended(self, w: _Watch) -> None:
        """timeoutSeconds: end the response (the client watches again from its last version).

        With allowWatchBookmarks, a BOOKMARK first, as the API server sends one before a watch
        times out: its resourceVersion is how far this watch has seen (every matching event up
        to it was sent), so the next watch resumes from there, not from the last object that
        happened to match (a quiet selector would replay the whole history on every watch).
        """
        self._watches.discard(w)
        if w.stream is not None:
            if w.bookmark is not None:
                w.stream.write(w.bookmark % w.last)
            w.stream.end()

    def flush_watches(self) -> None:
        """Send the watch events committed so far now (on the loop), if any are waiting: the end of
        a controllers' pass, so that what it wrote reaches each watcher in one write."""
        if self._fanout_pending:
            self._fanout()

    def _fanout(self) -> None:
        store = self.core.store
        with store.lock:
            if not self._fanout_pending:
                return  # sent already (flush_watches)
            self._fanout_pending = False
            seen = store.rv
            try:
                events: list[Event] | None = store.events_after(self._seen)
            except ApiError:  # the loop fell behind the history: each watch on its own
                events = None
            self._seen = seen
        if events is None:
            self._fanout_slow(seen)
        elif events:
            self._fan(events, seen)
            for ev in events:
                ev.sent()

    def _fan(self, events: list[Event], seen: int) -> None:
        """Hand every watch its lines of `events` (everything committed up to `seen`)."""
        if events:
            by_resource: dict[str, list[Event]] = {}
            for ev in events:
                by_resource.setdefault(ev.resource, []).append(ev)
            groups: dict[Any, list[_Watch]] = {}  # watches with the same filter: each line is made once
            for w in self._watches:
                groups.setdefault(w.key if w.key is not None else w, []).append(w)
            for ws in groups.values():
                evs = by_resource.get(ws[0].resource)
                if not evs:
                    for w in ws:
                        w.last = max(w.last, seen)
                    continue
                low = min(w.last for w in ws)
                lines = [(ev.rv, line) for ev in evs if ev.rv > low and (line := ws[0].event_line(ev)) is not None]
                for w in ws:
                    self._send(w, lines, seen)

    def _fanout_slow(self, seen: int) -> None:
        store = self.core.store
        for w in list(self._watches):
            with store.lock:
                try:
                    events = [ev for ev in store.events_after(w.last) if ev.rv <= seen and ev.resource == w.resource]
                except ApiError as e:
                    self._watches.discard(w)
                    if w.stream is not None:
                        w.stream.write(_encoder.encode({"type": "ERROR", "object": e.status()}) + b"\n")
                        w.stream.end()
                    continue
            self._feed(w, events, seen)

    def _feed(self, w: _Watch, events: Iterable[Event], upto: int) -> None:
        """Send `w` the lines of `events` (its resource's, up to resourceVersion `upto`) it has not seen."""
        self._send(w, [(ev.rv, line) for ev in events if ev.rv > w.last and (line := w.event_line(ev)) is not None], upto)

    def _send(self, w: _Watch, lines: list[tuple[int, bytes]], upto: int) -> None:
        """Write the lines (resourceVersion, line) that `w` has not seen; it has now seen up to `upto`."""
        stream = w.stream
        if stream is None or stream.closed:
            self._watches.discard(w)
            return
        last = w.last
        out = [line for rv, line in lines if rv > last]
        w.last = max(last, upto)
        if out:
            stream.write(b"".join(out))
            if stream.backlog() > MAX_WATCH_BACKLOG:
                log.warning("watch of %s cut: its reader is %d bytes behind", w.resource, stream.backlog())
                self._watches.discard(w)
                stream.abort()
