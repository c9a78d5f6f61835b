"""One NATS server for a whole test session, under the production permission model.

Every test has its own subject prefix (`Names("t<hex>")`), and the permissions of the services
name their streams, buckets and durables exactly, so the session server trusts a set of
identities per prefix: `TestAuth.register(names)` generates the admin, the four services and the
clients of that prefix (`gpuorch.security.generate`), adds them to the server's config and
reloads it (SIGHUP). The session's own admin (`admin_creds`) creates each test's topology, as
the admin identity does at start-up in production.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuorch_proto import Names

from .bundle import ACCOUNT, Bundle, generate, server_config
from .model import permissions


class TestAuth:
    __test__ = False  # not a pytest class

    def __init__(self, root: Path, *, reload: Callable[[], None] | None = None) -> None:
        self.root = root
        self.base = generate(root / "session", Names("gpuorch"))
        self._reload = reload
        self._bundles: dict[str, tuple[Bundle, tuple[str, ...]]] = {}
        self._lock = threading.Lock()
        self.write_config()

    @property
    def config(self) -> Path:
        return self.root / "nats-server.conf"

    @property
    def admin_creds(self) -> Path:
        return self.base.creds("admin")

    def set_reload(self, reload: Callable[[], None]) -> None:
        self._reload = reload

    def register(
        self,
        names: Names,
        *,
        clusters: Sequence[str] = (),
        clients: Mapping[str, Sequence[str]] | None = None,
    ) -> Bundle:
        """The identities of `names`' prefix, trusted by the server once this returns."""
        with self._lock:
            bundle = generate(self.root / names.prefix, names, clients=clients, clusters=clusters)
            self._bundles[names.prefix] = (bundle, tuple(clusters))
            self.write_config()
            if self._reload is not None:
                self._reload()
            return bundle

    def write_config(self, **config: Any) -> None:
        config.setdefault("server_name", "gpuorch-test")  # in the file: a reload must not change it
        conf = server_config(self.base.names, self.base.identities, **config)
        users = conf["accounts"][ACCOUNT]["users"]
        for bundle, clusters in self._bundles.values():
            for ident in bundle.identities.values():
                perms = permissions(ident["role"], bundle.names, ident["public_key"], clusters=clusters)
                users.append({"nkey": ident["public_key"], "permissions": perms.as_dict()})
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text(json.dumps(conf, indent=1))
        tmp.chmod(0o600)
        tmp.replace(self.config)
