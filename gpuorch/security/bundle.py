"""Identities on disk: one nkey per identity, the nats-server config that trusts them.

`generate(out, names, ...)` writes (files 0600, directories 0700):

    out/nats-server.conf      accounts, users (public nkeys) and their permissions (model.py)
    out/identities.json       identity -> role, public key, owners it may submit as (no secret)
    out/creds/<identity>.nk   the identity's nkey seed: the only secret, one file per identity

It is idempotent: an existing seed is kept, so `gpuorch up` after `gpuorch down` (and a
restarted nats-server) trusts the same identities; `rotate=[...]` replaces the seeds of those
identities (see docs/security.md, "Rotating credentials"). `python -m gpuorch.security` is the
command for production (`--listen`, `--store-dir`, `--tls-*`, `--client NAME=OWNER,...`).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nkeys

from gpuorch.config import load_registry
from gpuorch_proto import Names

from .model import DEFAULT_DISPATCHER_IDS, ROLES, SERVICES, Role, permissions

ACCOUNT = "GPUORCH"
MAX_PAYLOAD = 1024 * 1024  # bytes: the server refuses larger messages (streams cap the same)
CONFIG_NAME = "nats-server.conf"
IDENTITIES_NAME = "identities.json"
ANY_OWNER = "*"


@dataclass(frozen=True)
class Tls:
    cert_file: str
    key_file: str
    ca_file: str | None = None
    verify: bool = False  # require client certificates too


@dataclass
class Bundle:
    dir: Path
    names: Names
    identities: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {role, public_key, owners}

    @property
    def config(self) -> Path:
        return self.dir / CONFIG_NAME

    def creds(self, identity: str) -> Path:
        return self.dir / "creds" / f"{identity}.nk"

    def public_key(self, identity: str) -> str:
        return str(self.identities[identity]["public_key"])


def new_seed() -> str:
    return str(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER).decode())


def public_key_of(seed: str) -> str:
    kp = nkeys.from_seed(bytearray(seed.strip().encode()))
    try:
        return str(kp.public_key.decode())
    finally:
        kp.wipe()


def read_seed(path: str | os.PathLike[str]) -> str:
    return Path(path).read_text().strip()


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def server_config(
    names: Names,
    identities: Mapping[str, Mapping[str, Any]],
    *,
    clusters: Sequence[str] = (),
    dispatcher_ids: Sequence[str] = DEFAULT_DISPATCHER_IDS,
    listen: str | None = None,
    store_dir: str | None = None,
    server_name: str | None = None,
    tls: Tls | None = None,
    max_payload: int = MAX_PAYLOAD,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The nats-server configuration (its format reads JSON) that trusts exactly `identities`.
    No `no_auth_user`: a connection without a known nkey is refused."""
    users = []
    for ident in identities.values():
        perms = permissions(ident["role"], names, ident["public_key"], clusters=clusters, dispatcher_ids=dispatcher_ids)
        users.append({"nkey": ident["public_key"], "permissions": perms.as_dict()})
    conf: dict[str, Any] = {
        "max_payload": max_payload,
        "jetstream": {"enabled": True, **({"store_dir": store_dir} if store_dir else {})},
        "accounts": {ACCOUNT: {"jetstream": "enabled", "users": users}},
        "authorization": {"timeout": 2},
    }
    if listen:
        conf["listen"] = listen
    if server_name:
        conf["server_name"] = server_name
    if tls is not None:
        block: dict[str, Any] = {"cert_file": tls.cert_file, "key_file": tls.key_file, "timeout": 2}
        if tls.ca_file:
            block["ca_file"] = tls.ca_file
        if tls.verify:
            block["verify"] = True
        conf["tls"] = block
    conf.update(extra or {})
    return conf


def generate(
    out: str | os.PathLike[str],
    names: Names,
    *,
    clients: Mapping[str, Sequence[str]] | None = None,
    clusters: Sequence[str] = (),
    dispatcher_ids: Sequence[str] = DEFAULT_DISPATCHER_IDS,
    rotate: Sequence[str] = (),
    **config: Any,
) -> Bundle:
    """Write the identities, their seeds and the server config into `out` (see the module doc).

    `clients`: client identity -> owners it may submit as (`*`: any). Default: one `client`
    that may submit as any owner (the embedded system's CLI)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(out, 0o700)
    bundle = Bundle(out, names)
    wanted: dict[str, tuple[Role, list[str]]] = {"admin": ("admin", []), **{s: (s, []) for s in SERVICES}}
    for client, owners in (clients if clients is not None else {"client": [ANY_OWNER]}).items():
        if client in wanted:
            raise ValueError(f"client identity {client!r} has the name of a built-in identity")
        if not client.replace("-", "").isalnum():
            raise ValueError(f"client identity {client!r}: use letters, digits and '-'")
        wanted[client] = ("client", list(owners))
    for name, (role, owners) in wanted.items():
        assert role in ROLES
        path = bundle.creds(name)
        if name in rotate or not path.exists():
            _write_private(path, new_seed() + "\n")
        bundle.identities[name] = {"role": role, "public_key": public_key_of(read_seed(path)), "owners": owners}
    conf = server_config(names, bundle.identities, clusters=clusters, dispatcher_ids=dispatcher_ids, **config)
    text = json.dumps(conf, indent=2)
    server_name = conf.get("server_name")
    if isinstance(server_name, str) and server_name.startswith("$"):  # an environment variable: expanded unquoted
        text = text.replace(json.dumps(server_name), server_name)
    _write_private(bundle.config, text + "\n")
    _write_private(out / IDENTITIES_NAME, json.dumps({"prefix": names.prefix, "identities": bundle.identities}, indent=2) + "\n")
    return bundle


def load_identities(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """identities.json (or the directory holding it): identity -> {role, public_key, owners}."""
    p = Path(path)
    if p.is_dir():
        p = p / IDENTITIES_NAME
    doc = json.loads(p.read_text())
    return dict(doc["identities"])


# -- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gpuorch.security",
        description="Generate the NATS server config and one nkey seed per identity (admin, the four "
        "services, clients) for gpuorch's permission model; idempotent, --rotate replaces seeds.",
    )
    ap.add_argument("--out", required=True, type=Path, help="output directory (0700)")
    ap.add_argument("--prefix", default="gpuorch")
    ap.add_argument("--registry", type=Path, help="cluster registry: inventory may publish snapshots of these clusters only")
    ap.add_argument("--cluster", action="append", default=[], help="a registered cluster name (repeatable)")
    ap.add_argument("--client", action="append", default=[], metavar="NAME=OWNER[,OWNER]", help="a client identity and the owners it may submit as (`*`: any)")
    ap.add_argument("--dispatcher-ids", default=",".join(DEFAULT_DISPATCHER_IDS), help="dispatcher instance ids (GPUORCH_DISPATCHER_ID)")
    ap.add_argument("--rotate", action="append", default=[], help="replace this identity's seed (repeatable)")
    ap.add_argument("--listen", default="0.0.0.0:4222")
    ap.add_argument("--store-dir", default="/data/jetstream")
    ap.add_argument("--server-name", default=None)
    ap.add_argument("--server-name-env", default=None, metavar="VAR",
                    help="take the server name from this environment variable (one config for every pod of a StatefulSet)")
    ap.add_argument("--cluster-name", default=None, help="a JetStream cluster: its name (with --routes)")
    ap.add_argument("--routes", default="", help="comma-separated route URLs of the cluster's servers (nats://host:6222)")
    ap.add_argument("--tls-cert"), ap.add_argument("--tls-key"), ap.add_argument("--tls-ca")
    ap.add_argument("--tls-verify", action="store_true", help="require client certificates")
    ns = ap.parse_args(argv)
    clusters = list(ns.cluster)
    if ns.registry:
        clusters += list(load_registry(ns.registry).clusters)
    clients: dict[str, list[str]] = {}
    for spec in ns.client:
        name, _, owners = spec.partition("=")
        if not owners:
            ap.error(f"--client {spec!r}: expected NAME=OWNER[,OWNER]")
        clients[name] = [o for o in owners.split(",") if o]
    tls = None
    if ns.tls_cert or ns.tls_key:
        if not (ns.tls_cert and ns.tls_key):
            ap.error("--tls-cert and --tls-key go together")
        tls = Tls(ns.tls_cert, ns.tls_key, ns.tls_ca, ns.tls_verify)
    extra: dict[str, Any] = {}
    if ns.cluster_name:
        extra["cluster"] = {"name": ns.cluster_name, "listen": "0.0.0.0:6222",
                            "routes": [r for r in ns.routes.split(",") if r]}  # fmt: skip
    if ns.server_name_env:
        extra["server_name"] = f"${ns.server_name_env}"  # unquoted below: nats-server reads the variable
    bundle = generate(
        ns.out, Names(ns.prefix), clients=clients or None, clusters=clusters,
        dispatcher_ids=[i for i in ns.dispatcher_ids.split(",") if i], rotate=ns.rotate,
        listen=ns.listen, store_dir=ns.store_dir, server_name=ns.server_name, tls=tls, extra=extra,
    )  # fmt: skip
    print(json.dumps({"config": str(bundle.config), "identities": sorted(bundle.identities),
                      "creds": {n: str(bundle.creds(n)) for n in bundle.identities}}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
