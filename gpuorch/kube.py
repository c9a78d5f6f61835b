"""Kubernetes clients, one per kubeconfig context, configured the way the notes demand.

`ApiException` means the server answered (404, 409, 410...); a `urllib3` HTTPError
means it did not: that is the line between `gone` and `lost` (see unreachable()).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import urllib3
import yaml
from kubernetes import client, config

from gpuorch.observe import metrics

CONNECT_TIMEOUT = 2.0
READ_TIMEOUT = 5.0
TIMEOUT = (CONNECT_TIMEOUT, READ_TIMEOUT)


def request_kind(method: str, url: str) -> tuple[str, str]:
    """(verb, resource) of one API call: ("list", "pods"), ("watch", "jobs"), ("create", "jobs")..."""
    parts = urlsplit(url)
    segs = [s for s in parts.path.split("/") if s]
    if segs[:1] in (["version"], ["healthz"], ["readyz"], ["livez"]):  # non-resource URLs
        return method.lower() if method.upper() != "GET" else "get", segs[0]
    if segs[:2] == ["api", "v1"]:
        segs = segs[2:]
    elif segs[:1] == ["apis"] and len(segs) >= 3:
        segs = segs[3:]
    watching = bool(segs) and segs[0] == "watch"
    if watching:
        segs = segs[1:]
    if len(segs) >= 3 and segs[0] == "namespaces":
        segs = segs[2:]
    resource = segs[0] if segs else "other"
    named = len(segs) >= 2
    watching = watching or parse_qs(parts.query).get("watch", [""])[0].lower() == "true"
    method = method.upper()
    if method == "GET":
        verb = "get" if named else ("watch" if watching else "list")
    else:
        verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(
            method, method.lower()
        )
    return verb, resource


@dataclass
class ClusterClient:
    name: str
    api: client.ApiClient
    core: client.CoreV1Api
    batch: client.BatchV1Api
    #: API calls made through this client, by (verb, resource): see `count_calls`
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    _calls_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, verb: str, resource: str) -> None:
        with self._calls_lock:
            self.calls[(verb, resource)] += 1

    def calls_now(self) -> Counter[tuple[str, str]]:
        with self._calls_lock:
            return Counter(self.calls)

    def probe(self, timeout: float) -> None:
        """One liveness probe: ``GET /version`` (what ``kubectl version`` asks; every identity may,
        it reads no object), connect and read within `timeout`. Raises when unanswered."""
        client.VersionApi(self.api).get_code(_request_timeout=(timeout, timeout))

    def sanitize(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]

    def create_job(self, namespace: str, manifest: dict[str, Any], timeout: Any = None) -> bytes:
        """POST a Job (a plain manifest) and return the raw response body; raises `ApiException`
        on a refusal, as `create_namespaced_job` does. The client's own request path (its
        serialisation, auth and `call_api`, so counted like any call) without its pydantic
        validation of the body into a `V1Job` and without a model of the response: 100 µs of
        client CPU per create instead of 360 (614 with the model). The manifests are checked
        against the Job schema by the dispatcher's tests (`build_job`)."""
        request = self.batch._create_namespaced_job_serialize(  # the generated method's own first step
            namespace=namespace, body=manifest, pretty=None, dry_run=None, field_manager=None,
            field_validation=None, _request_auth=None, _content_type=None, _headers=None, _host_index=0,
        )  # fmt: skip
        resp = self.api.call_api(*request, _request_timeout=timeout)
        data = bytes(resp.read())  # type: ignore[no-untyped-call]
        if not 200 <= resp.status <= 299:
            raise client.ApiException.from_response(
                http_resp=resp, body=data.decode(errors="replace"), data=None
            )
        return data


def contexts(kubeconfig: Path) -> list[str]:
    doc = yaml.safe_load(kubeconfig.read_text()) or {}
    return [c["name"] for c in doc.get("contexts") or []]


def make_client(kubeconfig: Path, context: str) -> ClusterClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), context=context, client_configuration=cfg)  # type: ignore[no-untyped-call]
    # urllib3's default Retry(3) multiplies read timeouts on GETs: no read retries.
    cfg.retries = urllib3.Retry(total=1, connect=1, read=0, status=0, backoff_factor=0.1)
    cfg.connection_pool_maxsize = 32  # calls in flight per cluster (the dispatcher pipelines creates)
    api = client.ApiClient(cfg)
    cc = ClusterClient(name=context, api=api, core=client.CoreV1Api(api), batch=client.BatchV1Api(api))
    count_calls(cc)
    metrics.cluster_seen(context)
    return cc


def count_calls(cc: ClusterClient) -> None:
    """Count every API call of `cc` (in `cc.calls` and the `gpuorch_kube_requests` metric):
    wraps the client's `ApiClient.call_api`, through which every generated method goes."""
    inner = cc.api.call_api

    def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        verb, resource = request_kind(method, url)
        cc.count(verb, resource)
        metrics.KUBE_REQUESTS.labels(cc.name, verb, resource).inc()
        return inner(method, url, *args, **kwargs)

    cc.api.call_api = call_api  # type: ignore[method-assign]


def make_clients(kubeconfig: Path) -> dict[str, ClusterClient]:
    return {name: make_client(kubeconfig, name) for name in contexts(kubeconfig)}


def unreachable(exc: BaseException) -> bool:
    """True when the cluster did not answer (network), False when it answered with an error."""
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError, TimeoutError))
