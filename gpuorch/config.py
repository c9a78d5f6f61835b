"""Where a gpuorch installation finds its parts: one settings object, read from the environment.

Every service and the CLI take their settings from here, so that `gpuorch up` can
start them as independent processes with nothing but environment variables:

| variable              | meaning                                                        |
|-----------------------|----------------------------------------------------------------|
| GPUORCH_NATS_URL      | NATS server URL (default nats://127.0.0.1:4222)                |
| GPUORCH_PREFIX        | subject/stream prefix (default "gpuorch")                      |
| GPUORCH_KUBECONFIG    | kubeconfig with one context per cluster                        |
| GPUORCH_REGISTRY      | cluster registry file (deploy/local/clusters.yaml shape)       |
| GPUORCH_STATE_DIR     | local state: artifact stores, data locations (default .gpuorch)|
| GPUORCH_TRACE_FILE    | optional JSONL span file (tests, demo)                         |
| GPUORCH_NATS_CREDS    | this process's identity: nkey seed file (or JWT .creds)         |
| GPUORCH_NATS_TLS_CA / _CERT / _KEY | TLS: server CA, client certificate and key         |
| GPUORCH_IDENTITIES    | identities.json: client identity -> owners (router)            |
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from gpuorch_proto import ClusterRegistryEntry, Names


@dataclass(frozen=True)
class Settings:
    nats_url: str = "nats://127.0.0.1:4222"
    prefix: str = "gpuorch"
    kubeconfig: Path | None = None
    registry: Path | None = None
    state_dir: Path = Path(".gpuorch")
    extra: dict[str, str] = field(default_factory=dict)
    nats_creds: Path | None = None  # the identity's seed file (docs/security.md)
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    identities: Path | None = None  # identities.json (who may submit as which owner)

    async def connect(self, name: str, **options: Any) -> Any:
        """A NATS connection as this process's identity (creds, TLS from the settings)."""
        from gpuorch.runtime import bus  # local: config stays importable without nats

        tls = None
        if self.nats_tls_ca or self.nats_tls_cert:
            tls = bus.tls_context(
                str(self.nats_tls_ca) if self.nats_tls_ca else None,
                str(self.nats_tls_cert) if self.nats_tls_cert else None,
                str(self.nats_tls_key) if self.nats_tls_key else None,
            )
        return await bus.connect(self.nats_url, name, creds=self.nats_creds, tls=tls, **options)

    @property
    def names(self) -> Names:
        return Names(self.prefix)

    @property
    def stores_dir(self) -> Path:
        """Artifact stores of the embedded environment: one directory per store name."""
        return self.state_dir / "stores"

    def store_root(self, store: str) -> Path:
        return (self.stores_dir / store).resolve()

    @property
    def data_dir(self) -> Path:
        """Data locations of the embedded environment: one directory per location."""
        return self.state_dir / "data"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        kc = e.get("GPUORCH_KUBECONFIG")
        reg = e.get("GPUORCH_REGISTRY")

        def path(var: str) -> Path | None:
            v = e.get(var)
            return Path(v) if v else None

        return cls(
            nats_creds=path("GPUORCH_NATS_CREDS"),
            nats_tls_ca=path("GPUORCH_NATS_TLS_CA"),
            nats_tls_cert=path("GPUORCH_NATS_TLS_CERT"),
            nats_tls_key=path("GPUORCH_NATS_TLS_KEY"),
            identities=path("GPUORCH_IDENTITIES"),
            nats_url=e.get("GPUORCH_NATS_URL", cls.nats_url),
            prefix=e.get("GPUORCH_PREFIX", cls.prefix),
            kubeconfig=Path(kc) if kc else None,
            registry=Path(reg) if reg else None,
            state_dir=Path(e.get("GPUORCH_STATE_DIR", ".gpuorch")),
        )

    def to_env(self) -> dict[str, str]:
        env = {
            "GPUORCH_NATS_URL": self.nats_url,
            "GPUORCH_PREFIX": self.prefix,
            "GPUORCH_STATE_DIR": str(self.state_dir.resolve()),
        }
        if self.kubeconfig:
            env["GPUORCH_KUBECONFIG"] = str(self.kubeconfig.resolve())
        if self.registry:
            env["GPUORCH_REGISTRY"] = str(self.registry.resolve())
        for var, value in (
            ("GPUORCH_NATS_CREDS", self.nats_creds), ("GPUORCH_NATS_TLS_CA", self.nats_tls_ca),
            ("GPUORCH_NATS_TLS_CERT", self.nats_tls_cert), ("GPUORCH_NATS_TLS_KEY", self.nats_tls_key),
            ("GPUORCH_IDENTITIES", self.identities),
        ):  # fmt: skip
            if value:
                env[var] = str(value.resolve())
        return env


@dataclass(frozen=True)
class Registry:
    """The cluster registry: what Kubernetes does not hold, one entry per kubeconfig context."""

    clusters: dict[str, ClusterRegistryEntry]
    time_scale: float = 1.0  # simulated seconds per real second (1.0 for real clusters)


def load_registry(path: Path) -> Registry:
    """Read the registry part of a clusters file (`clusters: [{name, registry: {...}}]`)."""
    doc: Any = yaml.safe_load(path.read_text()) or {}
    entries: dict[str, ClusterRegistryEntry] = {}
    for i, c in enumerate(doc.get("clusters") or []):
        name = c.get("name")
        if not name:
            raise ValueError(f"{path}: clusters[{i}].name is missing")
        try:
            entries[name] = msgspec.convert(c.get("registry") or {}, ClusterRegistryEntry)
        except msgspec.ValidationError as exc:
            raise ValueError(f"{path}: clusters[{i}].registry: {exc}") from exc
    return Registry(clusters=entries, time_scale=float(doc.get("time_scale", 1.0)))
