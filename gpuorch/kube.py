"""Kubernetes clients, one per kubeconfig context, configured the way the notes demand.

`ApiException` means the server answered (404, 409, 410...); a `urllib3` HTTPError
means it did not: that is the line between `gone` and `lost` (see unreachable()).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config

CONNECT_TIMEOUT = 2.0
READ_TIMEOUT = 5.0
TIMEOUT = (CONNECT_TIMEOUT, READ_TIMEOUT)


@dataclass
class ClusterClient:
    name: str
    api: client.ApiClient
    core: client.CoreV1Api
    batch: client.BatchV1Api

    def sanitize(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]


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
    return ClusterClient(name=context, api=api, core=client.CoreV1Api(api), batch=client.BatchV1Api(api))


def make_clients(kubeconfig: Path) -> dict[str, ClusterClient]:
    return {name: make_client(kubeconfig, name) for name in contexts(kubeconfig)}


def unreachable(exc: BaseException) -> bool:
    """True when the cluster did not answer (network), False when it answered with an error."""
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError, TimeoutError))
