"""deploy/ as a kustomize base with overlays, rendered by the real `kubectl kustomize`.

Every object of every kustomization passes `kubernetes-validate --strict` against kubectl's own
Kubernetes version; the overlays differ where they are meant to (NATS servers and routes,
replicas, GPUORCH_REPLICAS, PodDisruptionBudgets) and nowhere else by copy; every variable the
manifests give gpuorch's containers is one `gpuorch.config` reads, with a value it accepts; the
replica ids the StatefulSets give are ones the NATS permission model grants. The production
NATS config is started as three real nats-server processes, which must form one cluster on
which the topology Job's code creates replicated streams.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from nats.js.errors import NotFoundError

from gpuorch.config import SettingError, Settings
from gpuorch.runtime import bus
from gpuorch.runtime.natsembed import find_nats_server
from gpuorch.security import generate
from gpuorch.security.model import DEFAULT_DISPATCHER_IDS, durables, events_durable
from gpuorch_dispatcher.core import CACHE_CLAIM
from gpuorch_proto import Names
from gpuorch_proto.storage import SECRET_KEYS
from tests.support.kustomize import (
    KUSTOMIZATIONS,
    container_env,
    find,
    gpuorch_containers,
    kubectl_version,
    one,
    pod_spec,
    render,
    workloads,
)
from tests.support.wait import assert_eventually

SERVICES = ("gpuorch-router", "gpuorch-dispatcher", "gpuorch-fencer", "gpuorch-inventory")

# -- every object is valid, strictly --------------------------------------------------------------


def strict_errors(objects: list[dict[str, Any]], version: str) -> list[str]:
    """`kubernetes-validate --strict` on each object: unknown fields, wrong types, missing ones."""
    errors = []
    for o in objects:
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
            errors.append(f"{o.get('kind')}/{o.get('metadata', {}).get('name')}: {exc}")
    return errors


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_rendered_object_passes_kubernetes_validate_strict(name: str) -> None:
    objects = render(name)
    assert objects, f"{name} rendered nothing"
    assert not strict_errors(objects, kubectl_version()), "\n".join(strict_errors(objects, kubectl_version()))


def test_strict_validation_rejects_a_misspelt_field() -> None:
    """The check above can fail: a field name with a typo in a rendered object is refused."""
    objects = render("production")
    sts = one(objects, "StatefulSet", "gpuorch-router")
    pod_spec(sts)["containers"][0]["volumeMount"] = pod_spec(sts)["containers"][0].pop("volumeMounts")
    assert any("volumeMount" in e for e in strict_errors([sts], kubectl_version()))


# -- the overlays differ as intended --------------------------------------------------------------

REPLICAS = {
    "single": {"nats": 1, "gpuorch-router": 1, "gpuorch-dispatcher": 1, "gpuorch-fencer": 1, "gpuorch-inventory": 1},
    # docs/operations.md, Scaling: router, dispatcher, fencer any number; inventory one per set of clusters
    "production": {"nats": 3, "gpuorch-router": 2, "gpuorch-dispatcher": 2, "gpuorch-fencer": 2, "gpuorch-inventory": 1},
}


def replicas(objects: list[dict[str, Any]]) -> dict[str, int]:
    return {w["metadata"]["name"]: w["spec"]["replicas"] for w in workloads(objects) if w["kind"] != "Job"}


def stream_replicas(objects: list[dict[str, Any]]) -> set[int]:
    """GPUORCH_REPLICAS as each gpuorch container's settings parse it (the topology Job's decides)."""
    return {Settings.from_env(container_env(objects, c)).tuning.replicas for _w, c in gpuorch_containers(objects)}


NATS_ROUTE = re.compile(r"nats://([A-Za-z0-9.-]+):(\d+)")


def nats_config(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The files of the nats-server config the `nats` StatefulSet mounts (its generated ConfigMap)."""
    sts = one(objects, "StatefulSet", "nats")
    config = next(v for v in pod_spec(sts)["volumes"] if v["name"] == "config")
    (cm,) = [s["configMap"]["name"] for s in config["projected"]["sources"] if "configMap" in s]
    data: dict[str, str] = one(objects, "ConfigMap", cm)["data"]
    return data


def routes(objects: list[dict[str, Any]]) -> list[tuple[str, int]]:
    conf = nats_config(objects)["cluster.conf"]
    body = "\n".join(line.split("#", 1)[0] for line in conf.splitlines())
    return [(host, int(port)) for host, port in NATS_ROUTE.findall(body)]


@pytest.mark.parametrize("overlay", ["single", "production"])
def test_replica_counts_follow_the_overlay(overlay: str) -> None:
    assert replicas(render(overlay)) == REPLICAS[overlay]


def test_production_runs_a_three_server_nats_cluster_and_replicates_every_stream() -> None:
    objects = render("production")
    sts = one(objects, "StatefulSet", "nats")
    cluster_port = next(p["containerPort"] for p in pod_spec(sts)["containers"][0]["ports"] if p["name"] == "cluster")
    # one route per pod of the StatefulSet, by its stable name under the governing (headless) Service
    expected = [(f"nats-{i}.{sts['spec']['serviceName']}", cluster_port) for i in range(sts["spec"]["replicas"])]
    assert routes(objects) == expected
    headless = one(objects, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert cluster_port in {p["port"] for p in headless["spec"]["ports"]}
    assert stream_replicas(objects) == {3} == {sts["spec"]["replicas"]}


def test_single_runs_one_nats_server_without_a_cluster() -> None:
    objects = render("single")
    assert routes(objects) == []
    assert "cluster {" not in nats_config(objects)["cluster.conf"]
    assert stream_replicas(objects) == {1} == {one(objects, "StatefulSet", "nats")["spec"]["replicas"]}


def test_only_production_has_disruption_budgets_and_each_guards_a_replicated_workload() -> None:
    assert find(render("single"), "PodDisruptionBudget") == []
    objects = render("production")
    budgets = find(objects, "PodDisruptionBudget")
    assert {b["metadata"]["name"] for b in budgets} == {"nats", "gpuorch-router", "gpuorch-dispatcher", "gpuorch-fencer"}
    for b in budgets:
        selector = b["spec"]["selector"]["matchLabels"]
        guarded = [w for w in workloads(objects) if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert [w["metadata"]["name"] for w in guarded] == [b["metadata"]["name"]]
        assert b["metadata"]["namespace"] == "gpuorch-system"
        assert b["spec"]["maxUnavailable"] < guarded[0]["spec"]["replicas"], b  # a drain never takes them all


@pytest.mark.parametrize("overlay", ["single", "production"])
def test_every_container_requests_resources(overlay: str) -> None:
    for w in workloads(render(overlay)):
        for c in pod_spec(w)["containers"]:
            assert set(c["resources"]["requests"]) == {"cpu", "memory"}, (w["metadata"]["name"], c["name"])


def test_production_requests_more_than_single_for_every_long_running_container() -> None:
    def requests(objects: list[dict[str, Any]]) -> dict[str, str]:
        return {w["metadata"]["name"]: pod_spec(w)["containers"][0]["resources"]["requests"]["memory"]
                for w in workloads(objects) if w["kind"] != "Job"}  # fmt: skip

    single, production = requests(render("single")), requests(render("production"))
    assert single.keys() == production.keys()
    assert all(single[n] != production[n] for n in single), (single, production)


def test_the_overlays_share_one_base_and_copy_no_manifest() -> None:
    """Each overlay holds only its own parts: no manifest of the base repeated in it."""
    base = {p.name for p in (KUSTOMIZATIONS["single"].parent.parent / "base").glob("*.yaml")} - {"kustomization.yaml"}
    for overlay in ("single", "production"):
        mine = {p.name for p in KUSTOMIZATIONS[overlay].glob("*.yaml")} - {"kustomization.yaml"}
        assert not mine & base, (overlay, mine & base)


# -- what the manifests give gpuorch's containers is what gpuorch reads ---------------------------


class _Asked(dict[str, str]):
    """An environment that remembers every variable asked for."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env)
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.asked.add(key)
        return super().get(key, default)


def unread_variables(env: dict[str, str]) -> list[str]:
    """The variables of `env` no setting reads (a typo, or a setting that went away), by asking
    `Settings.from_env` itself; it raises SettingError on a value it cannot use. OTEL_* are
    OpenTelemetry's own (docs/operations.md, Traces)."""
    asked = _Asked(env)
    settings = Settings.from_env(asked)
    return sorted(k for k in env if k not in asked.asked and k not in settings.store_env and not k.startswith("OTEL_"))


def test_the_reader_of_variables_finds_a_misspelt_one() -> None:
    assert unread_variables({"GPUORCH_REPLICAS": "3", "GPUORCH_REPLICA": "3", "GPUORCH_STORE_PROD_REGION": "x"}) == ["GPUORCH_REPLICA"]
    with pytest.raises(SettingError, match="GPUORCH_REPLICAS='three'"):
        unread_variables({"GPUORCH_REPLICAS": "three"})


@pytest.mark.parametrize("overlay", ["single", "production"])
def test_every_variable_the_manifests_set_is_a_setting_gpuorch_reads(overlay: str) -> None:
    objects = render(overlay)
    seen = set()
    for w, c in gpuorch_containers(objects):
        env = container_env(objects, c)
        assert not unread_variables(env), (w["metadata"]["name"], unread_variables(env))
        seen.add(w["metadata"]["name"])
    assert seen == {*SERVICES, "gpuorch-topology"}


def _mount_of(container: dict[str, Any], path: str) -> dict[str, Any] | None:
    best = None
    for m in container.get("volumeMounts") or []:
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"):
            if best is None or len(m["mountPath"]) > len(best["mountPath"]):
                best = m
    return best


@pytest.mark.parametrize("overlay", ["single", "production"])
def test_every_path_a_setting_names_is_mounted_and_the_state_directory_is_writable(overlay: str) -> None:
    objects = render(overlay)
    for w, c in gpuorch_containers(objects):
        where = (w["metadata"]["name"], c["name"])
        settings = Settings.from_env(container_env(objects, c))
        volumes = {v["name"]: v for v in pod_spec(w)["volumes"]}
        for path in (settings.nats_creds, settings.nats_tls_ca, settings.kubeconfig, settings.registry, settings.identities):
            if path is None:
                continue
            mount = _mount_of(c, str(path))
            assert mount is not None, (*where, f"{path} is under no volumeMount")
            volume = volumes[mount["name"]]
            if "configMap" in volume:  # rendered: the file must be one of its keys
                key = str(path)[len(mount["mountPath"].rstrip("/")) + 1 :]
                assert key in one(objects, "ConfigMap", volume["configMap"]["name"])["data"], (*where, path)
        # each identity's seed comes from its own Secret gpuorch-nats-<identity> (docs/security.md)
        assert settings.nats_creds is not None, where
        creds = volumes[_mount_of(c, str(settings.nats_creds))["name"]]  # type: ignore[index]
        assert creds["secret"]["secretName"] == f"gpuorch-nats-{settings.nats_creds.stem}", where
        # the root filesystem is read-only: the state directory (metrics files, file:// stores) is not
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, where
        state = _mount_of(c, str(settings.state_dir))
        assert settings.state_dir.is_absolute() and state is not None and not state.get("readOnly"), (*where, settings.state_dir)
        assert "emptyDir" in volumes[state["name"]], where


@pytest.mark.parametrize("overlay", ["single", "production"])
def test_each_service_serves_metrics_on_a_named_port_its_service_exposes(overlay: str) -> None:
    objects = render(overlay)
    for name in SERVICES:
        w = next(w for w in workloads(objects) if w["metadata"]["name"] == name)
        (c,) = pod_spec(w)["containers"]
        tuning = Settings.from_env(container_env(objects, c)).tuning
        assert tuning.metrics_addr == "0.0.0.0", name  # reachable from the pod network, not loopback
        assert {"name": "metrics", "containerPort": int(tuning.metrics_port)} in c["ports"], name
        svc = one(objects, "Service", name)
        assert svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items(), name
        assert {"name": "metrics", "port": int(tuning.metrics_port), "targetPort": "metrics"} in svc["spec"]["ports"], name


@pytest.mark.parametrize("overlay", ["single", "production"])
def test_replica_ids_from_the_pod_index_are_ones_the_nats_permissions_grant(overlay: str) -> None:
    """Each replica's id is its pod index (0, 1, ...): its events durable must be in the model's
    durables, or NATS refuses it (`python -m gpuorch.security --dispatcher-ids` for more)."""
    objects = render(overlay)
    granted = {d.name for d in durables(Names("gpuorch"))}
    for role, var in (("router", "GPUORCH_INSTANCE"), ("dispatcher", "GPUORCH_DISPATCHER_ID"), ("fencer", "GPUORCH_INSTANCE")):
        sts = one(objects, "StatefulSet", f"gpuorch-{role}")
        (c,) = pod_spec(sts)["containers"]
        (var_ref,) = [e for e in c["env"] if e["name"] == var]
        assert var_ref["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']", role
        ids = [str(i) for i in range(sts["spec"]["replicas"])]
        assert set(ids) <= set(DEFAULT_DISPATCHER_IDS), (role, ids)  # the replica ids the model grants
        if role != "dispatcher":  # the dispatcher's durables are per id in the model already
            assert {events_durable(Names("gpuorch"), role, i) for i in ids} <= granted, role  # type: ignore[arg-type]


# -- the destination clusters ---------------------------------------------------------------------


def test_destination_holds_the_workload_namespace_the_roles_and_the_cache_the_dispatcher_mounts() -> None:
    objects = render("destination")
    ns = one(objects, "Namespace", "gpuorch")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pvc = one(objects, "PersistentVolumeClaim", CACHE_CLAIM)  # the claim a Job mounts by default
    assert pvc["metadata"]["namespace"] == "gpuorch" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert {r["metadata"]["name"] for r in find(objects, "Role")} == {"gpuorch-dispatcher", "gpuorch-fencer"}
    assert find(objects, "Secret") == []  # no credentials in the base every cluster applies


def test_destination_example_makes_the_store_secret_with_the_keys_gpuorch_reads() -> None:
    objects = render("destination-example")
    secret = one(objects, "Secret", "gpuorch-store-prod")  # no hash suffix: the registry names it exactly
    assert secret["metadata"]["namespace"] == "gpuorch"
    assert set(secret["data"]) == set(SECRET_KEYS["s3"])
    assert one(objects, "PersistentVolumeClaim", CACHE_CLAIM)["spec"]["storageClassName"]


# -- the production NATS config forms a real cluster ----------------------------------------------


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _rewrite(text: str, old: str, new: str) -> str:
    assert old in text, f"the rendered config no longer holds {old!r}: update this test"
    return text.replace(old, new)


def _routez(port: int) -> dict[str, Any]:
    import json

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/routez", timeout=5) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


@contextlib.contextmanager
def _nats_servers(configs: list[tuple[str, Path]]) -> Iterator[tuple[list[subprocess.Popen[bytes]], list[Path]]]:
    """One real nats-server per (pod name, config file), run as the StatefulSet runs it: the pod's
    name in POD_NAME (the config's server_name), `--config` the entry file; stopped at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    logs = [config.parent.parent / "nats-server.log" for _pod, config in configs]
    try:
        for (pod, config), log in zip(configs, logs, strict=True):
            with open(log, "wb") as out:
                procs.append(subprocess.Popen([find_nats_server(), "--config", str(config)], stdout=out,
                                              stderr=subprocess.STDOUT, cwd=config.parent.parent, env={"POD_NAME": pod}))  # fmt: skip
        yield procs, logs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def test_the_production_nats_config_forms_a_cluster_with_replicated_streams(tmp_path: Path) -> None:
    """The rendered config, with pod names as server names and the hosts moved to loopback ports,
    run as three real nats-servers: each routes to the other two, and the topology Job's own code
    with the rendered GPUORCH_REPLICAS creates streams with three replicas on them. The test
    runs without TLS (tls.conf left empty): loopback, no certificates."""
    objects = render("production")
    sts = one(objects, "StatefulSet", "nats")
    n = sts["spec"]["replicas"]
    (container,) = pod_spec(sts)["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")["mountPath"]
    entry = container["args"][container["args"].index("--config") + 1]
    assert entry.startswith(mount + "/")
    config = next(v for v in pod_spec(sts)["volumes"] if v["name"] == "config")["projected"]
    (auth_path,) = [i["path"] for s in config["sources"] if "secret" in s for i in s["secret"]["items"]]
    files = nats_config(objects)
    bundle = generate(tmp_path / "bundle", Names("gpuorch"))  # what the operator makes with gpuorch.security

    client, monitor, cluster = _free_ports(n), _free_ports(n), _free_ports(n)
    configs = []
    for i in range(n):
        d = tmp_path / f"nats-{i}"
        (d / "config" / Path(auth_path).parent).mkdir(parents=True)
        for key, text in files.items():
            if key == "nats.conf":
                text = _rewrite(text, "listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{client[i]}")
                text = _rewrite(text, "http_port: 8222", f"http_port: {monitor[i]}")
                text = _rewrite(text, "store_dir: /data", f"store_dir: {d / 'data'}")
            elif key == "tls.conf":
                text = "# no TLS in this test\n"
            elif key == "cluster.conf":
                text = _rewrite(text, "listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{cluster[i]}")
                for j in range(n):
                    text = _rewrite(text, f"nats-{j}.{sts['spec']['serviceName']}:6222", f"127.0.0.1:{cluster[j]}")
            (d / "config" / key).write_text(text)
        (d / "config" / auth_path).write_text(bundle.config.read_text())
        configs.append((f"{sts['metadata']['name']}-{i}", d / "config" / Path(entry).name))

    with _nats_servers(configs) as (procs, logs):

        def ready() -> bool:
            for p, log in zip(procs, logs, strict=True):
                assert p.poll() is None, f"nats-server exited:\n{log.read_text()[-3000:]}"
            return all("Server is ready" in log.read_text() for log in logs)

        await assert_eventually(ready, timeout=60, interval=0.1)

        def routed() -> bool:
            for i in range(n):
                peers = {r.get("remote_name") for r in _routez(monitor[i]).get("routes") or []}
                assert peers == {f"nats-{j}" for j in range(n) if j != i}, (f"nats-{i}", peers)
            return True

        await assert_eventually(routed, timeout=60, interval=0.2)

        # the topology Job's own command, with the environment the manifests give it
        (job,) = [w for w, _c in gpuorch_containers(objects) if w["metadata"]["name"] == "gpuorch-topology"]
        (topology,) = pod_spec(job)["containers"]
        env = container_env(objects, topology)
        env.pop("GPUORCH_NATS_TLS_CA")
        env |= {"GPUORCH_NATS_URL": ",".join(f"nats://127.0.0.1:{p}" for p in client),
                "GPUORCH_NATS_CREDS": str(bundle.creds("admin")), "GPUORCH_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
        settings = Settings.from_env(env)
        assert settings.tuning.replicas == n
        command = [sys.executable if topology["command"][0] == "python" else topology["command"][0], *topology["command"][1:]]

        def created() -> bool:  # until the cluster has elected its leaders (the Job retries: backoffLimit)
            out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
            return "topology ready" in out.stdout

        await assert_eventually(created, timeout=120, interval=0.5)
        nc = await bus.connect(settings.nats_url, "pytest-kustomize", creds=settings.nats_creds)
        try:
            js = nc.jetstream()
            for stream in (settings.names.stream_cmd, settings.names.stream_evt):
                try:
                    info = await js.stream_info(stream)
                except NotFoundError as exc:
                    raise AssertionError(f"no stream {stream}") from exc
                assert info.config.num_replicas == n, stream
                assert info.cluster is not None and len(info.cluster.replicas or []) == n - 1, stream
        finally:
            await nc.close()
