"""The HTTP front of a local cluster: the Kubernetes API subset gpuorch uses, over HTTP/1.1.

Watches and followed logs are sent with chunked transfer encoding, one JSON event per line.
A partition closes the listening socket and every open connection (clients see connection
refused / reset: a urllib3 error, never an HTTP status); heal listens again on the same port.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec
import yaml

from . import openapi, protobuf
from .errors import EVENTS, JOBS, NAMESPACES, NODES, PODS, SECRETS, ApiError, Resource
from .kubelet import log_path
from .selectors import parse_field_selector, parse_label_selector
from .tables import table, wants_table
from .version import version_info

if TYPE_CHECKING:
    from .core import ClusterCore
    from .store import Event

__all__ = ["APIServer"]

log = logging.getLogger("gpuorch_localkube.api")
_encoder = msgspec.json.Encoder()
DEFAULT_WATCH_SECONDS = 1800

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], api: APIServer):
        self.api = api
        self.closed = False
        super().__init__(addr, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "localkube"
    sys_version = ""
    timeout = 300  # idle keep-alive connections are closed after 5 minutes
    server: _Server

    def _client_gone(self) -> bool:
        """True when the peer closed its side (checked while a watch has nothing to send)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except (OSError, ValueError):
            return True

    def setup(self) -> None:
        super().setup()
        # a response is written as headers then body: without TCP_NODELAY, Nagle holds the body
        # until the client ACKs the headers, which it delays by 40 ms (every request took 40 ms)
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.api._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.api._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):  # called for every request: format only when it is logged
            log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- plumbing --------------------------------------------------------------------------------

    def _alive(self) -> bool:
        return not self.server.closed

    def _send(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = _encoder.encode(obj)
        self._send_bytes(code, data, "application/json", headers)

    def _send_bytes(self, code: int, data: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        if not self._alive():
            raise _Abort()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self, ctype: str) -> None:
        if not self._alive():
            raise _Abort()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        if not self._alive():
            raise _Abort()
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip().lower()
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
            return msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            raise ApiError.bad_request(f"the body of the request could not be decoded as JSON: {e}") from e

    def _send_obj(self, code: int, res: Resource, obj: dict[str, Any], q: dict[str, str],
                  headers: dict[str, str] | None = None) -> None:
        """An object or a list, as a Table when the client asked for one (kubectl get)."""
        if wants_table(self.headers.get("Accept")) and res.plural in ("pods", "nodes", "jobs", "namespaces", "events"):
            items = obj["items"] if "items" in obj else [obj]
            meta = obj["metadata"] if "items" in obj else {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            return self._send(code, table(res.plural, items, meta, q.get("includeObject")), headers)
        return self._send(code, obj, headers)

    def _dispatch(self, method: str) -> None:
        api = self.server.api
        try:
            if api.delay > 0:
                time.sleep(api.delay)
            if not self._alive():
                raise _Abort()
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            parts = [unquote(p) for p in url.path.split("/") if p]
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
            self._route(method, parts, query, body)
        except _Abort:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        except ApiError as e:
            with contextlib.suppress(OSError, _Abort):
                self._send(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # pragma: no cover - a bug: answer like an API server does
            log.exception("internal error serving %s %s", method, self.path)
            with contextlib.suppress(OSError, _Abort):
                self._send(500, ApiError(500, "InternalError", f"Internal error occurred: {e!r}").status())

    # -- routing ---------------------------------------------------------------------------------

    def _route(self, method: str, parts: list[str], q: dict[str, str], body: Any) -> None:
        core = self.server.api.core
        if method == "GET":
            if parts == ["version"]:
                return self._send(200, version_info())
            if parts in (["healthz"], ["readyz"], ["livez"]):
                return self._send_bytes(200, b"ok", "text/plain; charset=utf-8")
            disc = _discovery("/".join(parts), self.server.api.port)
            if disc is not None:
                return self._send(200, disc)
            if parts == ["openapi", "v2"]:
                if openapi.V2_PROTOBUF in (self.headers.get("Accept") or ""):
                    # the @ of the requested type is no valid media type: the API server answers with a dot
                    return self._send_bytes(200, openapi.v2_protobuf(), openapi.V2_PROTOBUF.replace("@", "."))
                return self._send(200, openapi.v2_document())
            if parts == ["openapi", "v3"]:
                return self._send(200, openapi.v3_index())
            if parts[:2] == ["openapi", "v3"] and "/".join(parts[2:]) in openapi.V3_GROUPS:
                return self._send_bytes(200, openapi.v3_document("/".join(parts[2:])), "application/json")
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
                return self._send_obj(200, res, core.list(res, ns, q.get("labelSelector"), q.get("fieldSelector"),
                                                          parse_int(q.get("limit"), "limit"), q.get("continue")), q)
            if method == "POST" and ns is not None and res is SECRETS:
                return self._send(201, core.create_secret(ns, body, dry))
            if method == "POST" and ns is not None and res in (PODS, JOBS):
                obj = core.create_job(ns, body, dry) if res is JOBS else core.create_pod(ns, body, dry)
                return self._send(201, obj)
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
            return self._send_obj(200, res, core.get(res, key_ns, name), q)
        if sub is not None:
            raise ApiError.method_not_allowed()
        if method == "DELETE":
            return self._delete(res, key_ns, name, q, body)
        if method == "PATCH":
            ctype = self.headers.get("Content-Type") or "application/strategic-merge-patch+json"
            return self._send(200, core.patch(res, key_ns, name, ctype, body, dry_run=dry))
        if method == "PUT":
            return self._send(200, core.replace(res, key_ns, name, body, dry_run=dry))
        raise ApiError.method_not_allowed()

    def _namespaces(self, method: str, name: str | None, sub: str | None, body: Any, q: dict[str, str]) -> None:
        core = self.server.api.core
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
        core = self.server.api.core
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
        core = self.server.api.core
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

    def _watch(self, res: Resource, ns: str | None, q: dict[str, str]) -> None:
        store = self.server.api.core.store
        lsel = parse_label_selector(q.get("labelSelector"))
        fsel = parse_field_selector(res.plural, q.get("fieldSelector"))
        timeout = parse_int(q.get("timeoutSeconds"), "timeoutSeconds")
        deadline = time.monotonic() + (timeout if timeout is not None and timeout > 0 else DEFAULT_WATCH_SECONDS)
        rv_param = q.get("resourceVersion")
        as_table = wants_table(self.headers.get("Accept"))
        first_row = [True]

        def encode_event(etype: str, obj: dict[str, Any]) -> bytes:
            if as_table:
                obj = table(res.plural, [obj], {"resourceVersion": obj["metadata"].get("resourceVersion", "")},
                            q.get("includeObject"), headers=first_row[0])
                first_row[0] = False
            return _encoder.encode({"type": etype, "object": obj}) + b"\n"

        def matches(o: dict[str, Any] | None) -> bool:
            if o is None:
                return False
            meta = o["metadata"]
            return (ns is None or meta.get("namespace") == ns) and lsel.matches(meta.get("labels")) and fsel(o)

        def transform(ev: Event) -> tuple[str, dict[str, Any]] | None:
            if ev.resource != res.plural:
                return None
            now_ok, was_ok = matches(ev.obj), matches(ev.prev)
            if ev.type == "ADDED":
                return ("ADDED", ev.obj) if now_ok else None
            if ev.type == "DELETED":
                return ("DELETED", ev.obj) if was_ok else None
            if now_ok and was_ok:
                return ("MODIFIED", ev.obj)
            if now_ok:
                return ("ADDED", ev.obj)
            if was_ok:
                return ("DELETED", ev.obj)
            return None

        pending: list[tuple[str, dict[str, Any]]] = []
        gone: ApiError | None = None
        with store.lock:
            if rv_param in (None, "", "0"):
                pending = [("ADDED", o) for o in store.list(res.plural, ns) if matches(o)]
                last = store.rv
            else:
                last_opt = parse_int(rv_param, "resourceVersion")
                last = last_opt if last_opt is not None else 0
                try:
                    store.events_after(last)
                except ApiError as e:
                    gone = e
        self._start_stream("application/json")
        try:
            if gone is not None:
                self._chunk(_encoder.encode({"type": "ERROR", "object": gone.status()}) + b"\n")
                self._end_stream()
                return
            while True:
                for etype, obj in pending:
                    self._chunk(encode_event(etype, obj))
                pending = []
                if time.monotonic() >= deadline:
                    break
                with store.cond:
                    while True:
                        if not self._alive() or store.closed:
                            raise _Abort()
                        try:
                            events = store.events_after(last)
                        except ApiError as e:
                            gone = e
                            break
                        remaining = deadline - time.monotonic()
                        if events or remaining <= 0:
                            break
                        store.cond.wait(timeout=min(remaining, 1.0))
                        if self._client_gone():
                            raise _Abort()
                if gone is not None:
                    self._chunk(_encoder.encode({"type": "ERROR", "object": gone.status()}) + b"\n")
                    break
                for ev in events:
                    last = ev.rv
                    out = transform(ev)
                    if out is not None:
                        pending.append(out)
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    # -- logs ------------------------------------------------------------------------------------

    def _log(self, ns: str, name: str, q: dict[str, str]) -> None:
        api = self.server.api
        core = api.core
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
        self._start_stream("text/plain")
        try:
            self._chunk(data)
            offset = path.stat().st_size
            while True:
                with path.open("rb") as f:
                    f.seek(offset)
                    more = f.read()
                offset += len(more)
                self._chunk(more)
                with core.store.lock:
                    running = container in core.kubelet.pod_pids(uid)
                if not running and not more:
                    break
                time.sleep(0.1)
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True


class APIServer:
    """Serves one cluster's API on 127.0.0.1:port (port 0: pick one; kept across partition/heal)."""

    def __init__(self, core: ClusterCore, host: str = "127.0.0.1", port: int = 0):
        self.core = core
        self.host = host
        self.port = port
        self.delay = 0.0
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def serving(self) -> bool:
        return self._httpd is not None

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(sock)
            else:
                self._conns.discard(sock)

    def start(self) -> None:
        with self._lock:
            if self._httpd is not None:
                return
            httpd = _Server((self.host, self.port), self)
            self.port = httpd.server_address[1]
            self._httpd = httpd
            self._thread = threading.Thread(
                target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"localkube-api-{self.core.config.name}", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop answering: close the listening socket and cut every open connection."""
        with self._lock:
            httpd, self._httpd = self._httpd, None
            thread, self._thread = self._thread, None
            conns = list(self._conns)
        if httpd is None:
            return
        httpd.closed = True
        httpd.shutdown()
        httpd.server_close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self.core.store.notify()
        if thread is not None:
            thread.join(timeout=5)
