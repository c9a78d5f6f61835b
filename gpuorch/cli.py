"""`gpuorch`: start the embedded system, submit work, follow it, and ask why.

  gpuorch up [--clusters FILE] [--state DIR]   start NATS, local clusters and the four services, supervised
  gpuorch down                                 stop the supervisor, then everything `up` started
  gpuorch status                               processes, pids, restarts
  gpuorch restart SERVICE                      restart one service (router|dispatcher|fencer|inventory)
  gpuorch submit FILE [--wait] [--key K]       submit a workload (YAML or JSON)
  gpuorch get ID | list | events [ID] [--follow] | clusters | explain ID | cancel ID
  gpuorch queues [--policy FILE]               per queue and owner: limits, budgets, running, held (why), fair share, oldest waiting
  gpuorch result ID [--get KEY]                a workload's result: its manifest, or one object's bytes
  gpuorch report [--since 2h] [--cluster C] [--plot DIR]   per destination: delays, GPU-hours per result, cleanup
  gpuorch web [--host 127.0.0.1] [--port 8765] [--base-path /gpuorch]   read-only web view, live from the event stream
  gpuorch demo                                 the seed's scenario, end to end, then stop
  gpuorch fault CLUSTER partition|heal|...     inject a fault into a local cluster
  gpuorch simulate --trace FILE [--clusters FILE] [--policy NAME] [--seed S] [--plot DIR]
                                               replay a job trace over simulated clusters (docs/simulation.md)
  gpuorch simulate --trace FILE --what-if "east-h100:+16 nodes" [--days N]
                                               the same jobs on a changed fleet too: the difference per policy

Every read command takes `-o json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import msgspec

from gpuorch import extras
from gpuorch.client import Client
from gpuorch.config import SettingError, Settings, Tuning
from gpuorch.projection import Projection, WorkloadView
from gpuorch_proto import ContractError, load_workload_yaml, type_tag, workload_id_for
from gpuorch_proto.units import format_duration

DEFAULT_STATE = Settings.default_state_dir()
DEFAULT_CLUSTERS = Path(__file__).resolve().parent.parent / "deploy" / "local" / "clusters.yaml"
SERVICE_NAMES = ("router", "dispatcher", "fencer", "inventory")  # what `gpuorch restart` takes


def service_name(text: str) -> str:
    """A service of the embedded system, or one of its replicas (`router-1`: `gpuorch up --replicas`)."""
    base, dash, n = text.partition("-")
    if base in SERVICE_NAMES and (not dash or n.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(SERVICE_NAMES)}, or a replica such as router-1")


def _jsonable(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in asdict(obj).items()}
    if isinstance(obj, msgspec.Struct):
        return msgspec.to_builtins(obj)
    if isinstance(obj, Mapping):  # (a compact view's `times` and `attempts` too: gpuorch.projection)
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    return msgspec.to_builtins(obj)


def settings_for(state: Path) -> Settings:
    """The running system's settings (from `<state>/system.json`), else the environment."""
    f = state / "system.json"
    if f.exists():
        doc = json.loads(f.read_text())
        creds = Settings.from_env().nats_creds or Path(doc["state_dir"]) / "auth" / "creds" / "client.nk"
        return Settings(nats_url=doc["nats_url"], prefix=doc["prefix"], kubeconfig=Path(doc["kubeconfig"]),
                        registry=Path(doc["clusters_file"]), state_dir=Path(doc["state_dir"]),
                        nats_creds=Path(creds),  # the CLI is the embedded system's `client` identity
                        store_env=Settings.from_env().store_env)  # its own store credentials
    return Settings.from_env()


def view_row(v: WorkloadView) -> dict[str, Any]:
    a = v.latest_attempt
    return {
        "id": v.workload_id,
        "status": v.status,
        "cluster": a.cluster if a else (v.decision.cluster if v.decision else None),
        "attempts": len(v.attempts),
        "epoch": v.epoch,
        "promoted": v.promoted_attempt,
        "result": v.result_path,
        "reason": v.reason,
    }


def view_detail(v: WorkloadView) -> dict[str, Any]:
    d = view_row(v)
    d["owner"] = v.workload.metadata.owner if v.workload else None
    d["attempt_list"] = [
        {"id": a.attempt_id, "cluster": a.cluster, "epoch": a.epoch, "status": a.status, "mode": a.mode,
         "mode_reason": a.mode_reason, "fenced": a.fenced, "cancel_confirmed": a.cancel_confirmed,
         "promoted": a.promoted, "promotion_rejected": a.promotion_rejected, "output": a.output_path,
         "times": a.times, "reason": a.reason}
        for a in sorted(v.attempts.values(), key=lambda a: a.number)
    ]
    d["times"] = v.times
    d["decision"] = msgspec.to_builtins(v.decision) if v.decision else None
    return d


def print_table(rows: list[dict[str, Any]], cols: list[str]) -> None:
    widths = {c: max([len(c), *(len(str(r.get(c, "") if r.get(c) is not None else "-")) for r in rows)]) for c in cols}
    widths = {c: min(w, 70) for c, w in widths.items()}
    print("  ".join(c.upper().ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r.get(c) if r.get(c) is not None else "-")[: widths[c]].ljust(widths[c]) for c in cols))


async def cmd_submit(ns: argparse.Namespace, s: Settings) -> int:
    try:
        text = Path(ns.file).read_text()
        wl = load_workload_yaml(text)
    except ContractError as exc:
        print(f"{ns.file}: {exc.reason}", file=sys.stderr)
        for e in exc.errors:
            print(f"  {e.path}: {e.message}", file=sys.stderr)
        print("fix the fields above (proto/schemas/workload.schema.json lists every rule), then submit again", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"gpuorch submit: cannot read {ns.file}: {exc.strerror}", file=sys.stderr)
        return 2
    if ns.dry_run:
        return await _submit_dry_run(ns, s, wl)
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        wid = await c.submit(wl, ns.key)
        if not ns.wait:
            print(json.dumps({"id": wid}) if ns.output == "json" else wid)
            return 0
        v = await _wait_with_progress(c, wid, ns.timeout, ns.output != "json")
        if ns.output == "json":
            print(json.dumps(_jsonable(view_detail(v)), indent=2))
        else:
            print(f"{wid}: {v.status} — {v.reason}")
        return 0 if v.status == "completed" else 1


async def _wait_with_progress(c: Client, wid: str, timeout: float, show: bool) -> Any:
    """Follow until terminal; on a terminal, one line per status change on stderr while waiting."""
    from gpuorch.projection import Projection

    p = Projection()
    last = ""

    async def run() -> Any:
        nonlocal last
        async for seq, e in c.follow(wid):
            v = p.apply(e, seq)
            if v is None:
                continue
            line = f"{v.status}: {v.reason}" if v.reason else v.status
            if show and line != last and not v.terminal:
                print(f"  {wid} {line}", file=sys.stderr, flush=True)
                last = line
            if v.terminal:
                return v
        raise RuntimeError("event stream ended")

    try:
        return await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        print(f"gpuorch: {wid} not finished after {timeout:g}s (last: {last or 'no event'}); "
              f"it keeps going: `gpuorch events {wid} --follow`, or `gpuorch cancel {wid}`", file=sys.stderr)
        raise SystemExit(1) from None


async def _submit_dry_run(ns: argparse.Namespace, s: Settings, wl: Any) -> int:
    """The routing decision the router would make now, by its own path (`gpuorch_router.dryrun`:
    the log folded as the router folds it, snapshots taken as it takes them, `core.decide`);
    nothing is published."""
    from gpuorch.config import load_registry
    from gpuorch.follow import Follower
    from gpuorch_router.dryrun import dry_run, trusted_snapshots
    from gpuorch_router.explain import render_explain

    try:
        registry = load_registry(s.registry) if s.registry else None  # the router's own (GPUORCH_REGISTRY)
    except (OSError, ValueError) as exc:
        print(f"gpuorch submit --dry-run: cluster registry {s.registry}: {exc}", file=sys.stderr)
        return 2
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        messages = await c.snapshot_messages()
        events = await c.events() if messages else []
    snaps = trusted_snapshots(messages, s.names, registry.clusters if registry else None)
    if not snaps:
        why = (f"none of the {len(messages)} cluster snapshots is of a cluster in the registry {s.registry}" if messages
               else "no capacity snapshot yet (is the inventory service running? `gpuorch status`)")
        print(f"gpuorch submit --dry-run: {why}", file=sys.stderr)
        return 1
    wid = workload_id_for(ns.key or "dry-run", wl.metadata.name)
    r = dry_run(wl, wid, events, snaps, time.time(), projection=Follower.of(s.tuning).projection,
                time_scale=registry.time_scale if registry else 1.0)
    decision = r.decision
    if ns.output == "json":
        print(json.dumps({"dry_run": True, "workload_id": wid, "attempt": r.attempt, "note": r.note,
                          "decision": msgspec.to_builtins(decision) if decision else None}, indent=2))
    else:
        print(f"dry run: nothing submitted ({len(snaps)} cluster snapshots)\n{r.note}\n")
        if decision is not None:
            print(render_explain(decision))
    if r.refused:
        print(f"gpuorch submit --dry-run: {r.note}", file=sys.stderr)
        return 2
    return 0 if decision is None or decision.outcome != "rejected" else 1


async def cmd_get(ns: argparse.Namespace, s: Settings) -> int:
    from gpuorch.observe import commands, timeline

    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        events = await c.events(ns.id)
    v = Projection.of(events).get(ns.id)
    if v is None:
        print(f"no workload {ns.id!r}", file=sys.stderr)
        return 1
    d = view_detail(v)
    tl = commands.timeline_of(v, events)
    d["timeline"] = timeline.as_dict(tl)
    graph = await _pipeline_graph(s, v) if v.children else None
    if graph is not None:
        d["pipeline"] = {"stages": {st.name: {"workload": st.workload_id, "status": st.status, "depends_on": list(st.depends_on),
                                              "reason": st.reason, "gpus": st.gpus, "result": st.result_path, "version": st.attempt_id}
                                    for st in graph.stages.values()}}  # fmt: skip
    if v.pipeline:
        d["pipeline_of"], d["stage"], d["parameters"] = v.pipeline, v.stage, v.parameters
        d["inputs"] = [msgspec.to_builtins(i) for i in v.stage_inputs]
    if ns.output == "json":
        print(json.dumps(_jsonable(d), indent=2))
        return 0
    for k in ("id", "status", "reason", "owner", "cluster", "epoch", "promoted", "result"):
        print(f"{k:>9}: {d[k] if d[k] is not None else '-'}")
    if graph is not None:
        from gpuorch_router.pipeline import render_graph

        print(render_graph(graph))
        return 0
    if v.pipeline:
        print(f"{'pipeline':>9}: {v.pipeline} (stage {v.stage})")
        for i in v.stage_inputs:
            print(f"{'input':>9}: {i.stage} = {i.result_path} (version {i.attempt_id})")
    print("attempts:")
    print_table(d["attempt_list"], ["id", "cluster", "epoch", "status", "mode", "fenced", "cancel_confirmed", "promoted"])
    print(timeline.render(tl, commands.time_scale(s)))
    return 0


async def cmd_result(ns: argparse.Namespace, s: Settings) -> int:
    """A workload's result, resolved through its manifest in the object store (issue 28): the
    attempt and epoch that published it, its objects with sizes and checksums; `--get KEY`
    streams one object's bytes to stdout."""
    from gpuorch.config import load_registry
    from gpuorch.stores import stores_of

    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        events = await c.events(ns.id)
    v = Projection.of(events).get(ns.id)
    if v is None:
        print(f"no workload {ns.id!r}", file=sys.stderr)
        return 1
    stores = stores_of(s, load_registry(s.registry) if s.registry else None)
    return await show_result(stores, v, ns.get, ns.output)


async def show_result(stores: Any, v: WorkloadView, get: str | None, output: str) -> int:
    """`gpuorch result` once the workload's view is read: its manifest (or one object) through its store."""
    from gpuorch.objectstore import StoreUnavailable
    from gpuorch_fencer.publish import ResultError, copy_object_to, resolve_result

    if not v.result_path:
        print(f"workload {v.workload_id} has no result yet (status {v.status}{': ' + v.reason if v.reason else ''})", file=sys.stderr)
        return 1
    try:
        m = await resolve_result(stores, v.result_path)
        if get is not None:
            out = sys.stdout.buffer
            await copy_object_to(stores, m, get, out)
            out.flush()
            return 0
    except (ResultError, StoreUnavailable) as exc:
        print(f"gpuorch result {v.workload_id}: {exc}", file=sys.stderr)
        return 1
    objects_url = stores[m.store].url_of(m.prefix)
    if output == "json":
        print(json.dumps({"result": v.result_path, "objects_url": objects_url, **msgspec.to_builtins(m)}, indent=2))
        return 0
    print(f"{'workload':>9}: {m.workload_id}")
    print(f"{'result':>9}: {v.result_path}")
    print(f"{'attempt':>9}: {m.attempt_id} (epoch {m.epoch})")
    print(f"{'objects':>9}: {objects_url}/ ({len(m.objects)}, {m.total_bytes} bytes)")
    print_table([{"key": o.key, "bytes": o.size, "sha256": o.sha256} for o in m.objects], ["key", "bytes", "sha256"])
    return 0


async def _pipeline_graph(s: Settings, v: WorkloadView) -> Any:
    """The pipeline's state (`gpuorch_router.pipeline.PipelineState`) from its own events and
    its children's, folded in stream order."""
    from gpuorch_router.pipeline import PipelineState

    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        every = await c.pipeline_events(v.workload_id)
    return PipelineState.of(v.workload_id, (e for _, e in every))


async def cmd_logs(ns: argparse.Namespace, s: Settings) -> int:
    """An attempt's output, from its cluster's Kubernetes API (gpuorch.observe.logs)."""
    from gpuorch.kube import make_client
    from gpuorch.observe.logs import show_logs

    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        events = await c.events(ns.id)
    v = Projection.of(events).get(ns.id)
    if v is None:
        print(f"no workload {ns.id!r}", file=sys.stderr)
        return 1
    if s.kubeconfig is None:
        print("no kubeconfig (GPUORCH_KUBECONFIG): the clusters' APIs are where the logs are", file=sys.stderr)
        return 1
    kubeconfig = s.kubeconfig
    return await asyncio.to_thread(
        show_logs, v, lambda name: make_client(kubeconfig, name), sys.stdout.buffer,
        attempt=ns.attempt, worker=ns.worker, container=ns.container, since=ns.since, follow=ns.follow,
    )  # fmt: skip


async def cmd_list(ns: argparse.Namespace, s: Settings) -> int:
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        p = await c.projection()
    rows = [view_row(v) for v in p.workloads.values()]
    if ns.output == "json":
        print(json.dumps(_jsonable(rows), indent=2))
    else:
        print_table(rows, ["id", "status", "cluster", "attempts", "promoted", "reason"])
    return 0


def _event_line(seq: int, e: Any) -> str:
    t = time.strftime("%H:%M:%S", time.localtime(e.at)) if e.at else "--:--:--"
    extra = {k: v for k, v in msgspec.to_builtins(e).items() if k not in ("schema_version", "event_id", "workload_id", "at", "type", "workload", "decision")}
    if getattr(e, "decision", None) is not None:
        extra["summary"] = e.decision.summary
    return f"{seq:>6} {t} {e.workload_id:<24} {type_tag(e):<20} {json.dumps(extra)[:160]}"


async def cmd_events(ns: argparse.Namespace, s: Settings) -> int:
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        if ns.follow:
            async for seq, e in c.follow(ns.id):
                print(json.dumps({"seq": seq, **msgspec.to_builtins(e)}) if ns.output == "json" else _event_line(seq, e), flush=True)
        for seq, e in await c.events(ns.id):
            print(json.dumps({"seq": seq, **msgspec.to_builtins(e)}) if ns.output == "json" else _event_line(seq, e))
    return 0


async def cmd_clusters(ns: argparse.Namespace, s: Settings) -> int:
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        snaps = await c.snapshots()
    if ns.output == "json":
        print(json.dumps({k: msgspec.to_builtins(v) for k, v in snaps.items()}, indent=2))
        return 0
    now = time.time()
    rows = []
    for name, sn in sorted(snaps.items()):
        models = sorted({f"{n.gpu_product}({n.gpu_memory_mib // 1024}G)" for n in sn.nodes if n.gpu_product})
        rows.append({
            "cluster": name, "reachable": sn.reachable, "age": f"{sn.age(now):.1f}s", "nodes": len(sn.nodes),
            "gpus_free": sum(n.gpus_free for n in sn.nodes), "gpus": sum(n.gpus_allocatable for n in sn.nodes),
            "models": ",".join(models), "queue_wait": format_duration(max([q.estimated_wait_seconds for q in sn.queues] or [0])),
            "stores": ",".join(sn.registry.artifact_stores), "cached": ",".join(sn.registry.datasets_cached),
        })
    print_table(rows, ["cluster", "reachable", "age", "nodes", "gpus_free", "gpus", "models", "queue_wait", "stores", "cached"])
    return 0


async def cmd_explain(ns: argparse.Namespace, s: Settings) -> int:
    from gpuorch.observe.commands import explain_activity

    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        v = await c.view(ns.id)
        activity = await explain_activity(s, c, v) if v is not None else ([], [])  # docs/activity.md
    if v is None:
        print(f"no workload {ns.id!r}", file=sys.stderr)
        return 1
    code = await _explain_routing(ns, s, v, activity[1])
    if ns.output != "json" and activity[0]:
        print("\n" + "\n".join(activity[0]))
    return code


async def _explain_routing(ns: argparse.Namespace, s: Settings, v: WorkloadView, activity: list[dict[str, Any]]) -> int:
    from gpuorch_router.explain import render_explain, render_waits

    if v.decision is None:
        if ns.output == "json":
            held = msgspec.to_builtins(v.held) if v.held is not None and v.status == "held" else None
            print(json.dumps({"status": v.status, "reason": v.reason, "held": held, "decision": None, "activity": activity}, indent=2))
            return 0
        if v.children:  # a pipeline is never routed itself: why each stage is where it is
            from gpuorch_router.pipeline import render_graph

            print(f"{ns.id}: {v.status} — {v.reason}")
            print(render_graph(await _pipeline_graph(s, v)))
            return 0
        print(f"{ns.id}: {v.status} — {v.reason} (no routing decision yet)")
        if v.held is not None and v.status == "held":  # concurrency limits, not capacity (docs/pipelines.md)
            for h in v.held.holds:
                print(f"  {h.scope} {h.name or ''}: {h.kind} {h.used:g} of {h.limit:g}" + (f", needs {h.needs:g}" if h.needs else ""))
        return 0
    if ns.output == "json":
        print(json.dumps({"status": v.status, "reason": v.reason, "decision": msgspec.to_builtins(v.decision), "activity": activity}, indent=2))
        return 0
    print(f"{ns.id}: {v.status} — {v.reason}\n")
    print(render_explain(v.decision))
    if v.preemption is not None and not v.terminal:  # who it waits for (gpuorch_router.preempt)
        print("\n" + "\n".join(render_waits(v.preemption)))
    return 0


async def cmd_report(ns: argparse.Namespace, s: Settings) -> int:
    from gpuorch.observe.commands import run_report

    return await run_report(ns, s)


async def cmd_queues(ns: argparse.Namespace, s: Settings) -> int:
    from gpuorch.observe.queues import run_queues

    return await run_queues(ns, s)


async def cmd_cancel(ns: argparse.Namespace, s: Settings) -> int:
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        await c.cancel(ns.id, ns.reason)
        if not ns.wait:
            print(f"cancel requested for {ns.id}")
            return 0
        v = await c.wait(ns.id, timeout=ns.timeout)
        print(f"{ns.id}: {v.status} — {v.reason}")
        return 0 if v.status in ("cancelled", "completed", "failed", "rejected") else 1


def cmd_up(ns: argparse.Namespace) -> int:
    from gpuorch.supervisor import spawn_detached
    from gpuorch.system import StartError

    state: Path = ns.state
    if (state / "system.json").exists():
        print(f"already up (state {state}); run `gpuorch down` first", file=sys.stderr)
        return 1
    if not 1 <= ns.replicas <= 8:
        print(f"gpuorch up: --replicas {ns.replicas}: a whole number from 1 to 8", file=sys.stderr)
        return 2
    try:
        sys_ = spawn_detached(state.resolve(), Path(ns.clusters).resolve(), replicas=ns.replicas)
    except StartError as exc:
        print(f"gpuorch up failed: {exc}", file=sys.stderr)
        return 1
    print(f"gpuorch is up: NATS {sys_.nats_url}, kubeconfig {sys_.kubeconfig}, logs {sys_.logs}, "
          f"supervisor pid {sys_.supervisor_pid}")
    return 0


def cmd_down(ns: argparse.Namespace) -> int:
    from gpuorch.supervisor import stop_supervisor
    from gpuorch.system import System

    # the supervisor first, so that it does not restart what is being stopped; it stops the rest
    supervised = stop_supervisor(ns.state)
    if not (ns.state / "system.json").exists():
        print("stopped" if supervised else "nothing is running")
        return 0
    System.load(ns.state).stop()  # no supervisor (or it did not finish): stop what system.json lists
    print("stopped")
    return 0


def cmd_status(ns: argparse.Namespace) -> int:
    from gpuorch.supervisor import status

    if not (ns.state / "system.json").exists():
        if ns.output == "json":
            print(json.dumps({"up": False}))
        else:
            print("nothing is running")
        return 1
    st = status(ns.state)
    if ns.output == "json":
        print(json.dumps({"up": True, **st}, indent=2))
        return 0
    sup = st["supervisor"]
    print(f"supervisor: pid {sup['pid']} {'running' if sup['alive'] else 'NOT RUNNING (nothing restarts crashed processes)'}")
    rows = []
    for name, p in st["processes"].items():
        last = p["last"] or {}
        rows.append({"process": name, "pid": p["pid"], "alive": p["alive"], "restarts": p["restarts"],
                     "last_restart": last.get("at"), "last_kind": last.get("kind"),
                     "last_exit": last.get("signal") or last.get("exit_code")})
    print_table(rows, ["process", "pid", "alive", "restarts", "last_restart", "last_kind", "last_exit"])
    print(f"restarts recorded in {st['restarts_file']}")
    return 0


def cmd_restart(ns: argparse.Namespace) -> int:
    from gpuorch.supervisor import SupervisorError, request_restart

    try:
        res = request_restart(ns.state, ns.service, timeout=ns.timeout)
    except SupervisorError as exc:
        print(f"gpuorch restart {ns.service}: {exc}", file=sys.stderr)
        return 1
    if ns.output == "json":
        print(json.dumps(res))
    elif res.get("ok"):
        print(f"{ns.service} restarted: pid {res.get('old_pid')} -> {res.get('new_pid')}")
    else:
        print(f"gpuorch restart {ns.service}: {res.get('error')}", file=sys.stderr)
    return 0 if res.get("ok") else 1


FAULT_KINDS = """fault kinds:
  partition              the API stops answering (connection refused); pods keep running
  heal                   the API answers again on the same port
  lose-node NODE         delete NODE and kill its pods' processes; Jobs replace them
  add-node NODE [GROUP]  re-add a lost node, or add one shaped like node group GROUP
  capacity NODE GPUS     set NODE's allocatable nvidia.com/gpu to GPUS
  slow-api SECONDS       delay every API response by SECONDS (0 stops it)
  background YAML        replace the background load (a YAML/JSON list, see docs/local-clusters.md)

examples:
  gpuorch fault primary partition
  gpuorch fault primary lose-node primary-a100-1
  gpuorch fault spare capacity spare-a100-0 4

exit status: 0 done, 1 the cluster refused the fault, 2 the embedded system is not running (gpuorch up)"""


def cmd_fault(ns: argparse.Namespace) -> int:
    import subprocess

    return subprocess.call([sys.executable, "-m", "gpuorch_localkube", "fault", "--state-dir", str(ns.state / "clusters"), ns.cluster, *ns.args])


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpuorch", description="Multi-cluster GPU orchestration.")
    ap.add_argument("--state", type=Path, default=DEFAULT_STATE, help="state directory of the embedded system")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def out(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("-o", "--output", choices=["table", "json"], default="table")
        return p

    p = sub.add_parser("up", help="start NATS, local clusters and the four services")
    p.add_argument("--clusters", default=str(DEFAULT_CLUSTERS))
    p.add_argument("--replicas", type=int, default=1, help="routers, dispatchers and fencers to run (each; default 1)")
    sub.add_parser("down", help="stop the supervisor, then everything `up` started")
    out(sub.add_parser("status", help="processes of the embedded system, their pids and restarts"))
    p = out(sub.add_parser("restart", help="restart one service of the embedded system"))
    p.add_argument("service", type=service_name, metavar="SERVICE",
                   help=f"one of {', '.join(SERVICE_NAMES)}, or a replica: router-1, dispatcher-1, ...")
    p.add_argument("--timeout", type=float, default=120)
    p = out(sub.add_parser("submit", help="submit a workload file",
                           description="Validate a workload file (YAML or JSON) and publish it on gpuorch.cmd.submit."))
    p.add_argument("file", help="the workload document (proto/schemas/workload.schema.json)")
    p.add_argument("--wait", action="store_true", help="follow it until it ends, showing each status change; exit 0 if completed")
    p.add_argument("--key", default=None, help="idempotency key, sent as Nats-Msg-Id (default: random); the same key names the same workload")
    p.add_argument("--timeout", type=float, default=600, help="seconds --wait waits (default 600)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the routing decision the router would make now, by its own path (with --key: an existing workload's pending attempt, its exclusions and checkpoint); submit nothing")
    out(sub.add_parser("get", help="one workload")).add_argument("id")
    p = out(sub.add_parser("result", help="a workload's result: the attempt that published it, its objects (or one object's bytes)"))
    p.add_argument("id")
    p.add_argument("--get", metavar="KEY", default=None, help="write this object's bytes to stdout (streamed from the store)")
    p.add_argument("--json", dest="output", action="store_const", const="json", help="the manifest as JSON (as -o json)")
    p = sub.add_parser("logs", help="an attempt's output, from its cluster's Kubernetes API")
    p.add_argument("id")
    p.add_argument("--attempt", type=int, default=None, help="attempt number (default: the latest)")
    p.add_argument("--worker", type=int, default=None, help="one worker of a gang (default: every worker)")
    p.add_argument("--container", default="main", help="main (default), agent (gpuorch's uploads), stage-0, fetch, input-0")
    p.add_argument("--since", type=int, default=None, metavar="SECONDS", help="only lines of the last SECONDS")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming until the container stops")
    out(sub.add_parser("list", help="all workloads"))
    p = out(sub.add_parser("events", help="lifecycle events"))
    p.add_argument("id", nargs="?")
    p.add_argument("--follow", "-f", action="store_true")
    out(sub.add_parser("clusters", help="capacity snapshots"))
    out(sub.add_parser("explain", help="why here, why not there, why still waiting")).add_argument("id")
    from gpuorch.observe.queues import add_queues_arguments

    add_queues_arguments(out(sub.add_parser("queues", help="per queue and owner: limits, budgets, running, held and why, fair share, oldest waiting; cluster queues")))
    p = out(sub.add_parser("cancel", help="cancel a workload in any state"))
    p.add_argument("id")
    p.add_argument("--reason", default="requested by user")
    p.add_argument("--wait", action="store_true")
    p.add_argument("--timeout", type=float, default=300)
    from gpuorch.observe.commands import add_report_arguments, add_web_arguments

    add_report_arguments(out(sub.add_parser("report", help="per destination: queue delay, staging, completion, GPU-hours per result, failures, cleanup")))
    add_web_arguments(sub.add_parser("web", help="read-only web view of workloads, timelines, clusters and the report"))
    p = sub.add_parser("demo", help="run the seed's scenario end to end, then stop")
    p.add_argument("--clusters", default=str(DEFAULT_CLUSTERS))
    p.add_argument("--keep", action="store_true", help="leave the system running")
    p = sub.add_parser("fault", help="inject a fault into a local cluster", formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Inject a fault into one local cluster of the embedded system (docs/local-clusters.md).",
                       epilog=FAULT_KINDS)
    p.add_argument("cluster", help="cluster name (gpuorch clusters lists them)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="KIND [ARGS]", help="the fault and its arguments, below")
    from gpuorch.simulate.cli import add_arguments as simulate_arguments

    simulate_arguments(sub.add_parser("simulate", help="replay a job trace over simulated clusters, compare policies"))
    out(sub.add_parser("settings", help="every tuning variable: its value in force, default and meaning"))
    return ap


def cmd_settings(ns: argparse.Namespace) -> int:
    try:
        tuning = Tuning.from_env()
    except SettingError as exc:
        print(f"gpuorch settings: {exc}", file=sys.stderr)
        return 2
    rows = [(var, str(getattr(tuning, name)), default, doc) for name, (var, default, doc) in
            zip(Tuning.__dataclass_fields__, Tuning.table(), strict=True)]
    if ns.output == "json":
        print(json.dumps([dict(zip(("variable", "value", "default", "meaning"), r, strict=True)) for r in rows], indent=2))
        return 0
    w = max(len(r[0]) for r in rows)
    for var, value, default, doc in rows:
        mark = "" if value == default else f"  (default {default})"
        print(f"{var:<{w}}  {value}{mark}\n{'':<{w}}  {doc}")
    return 0


ASYNC = {"submit": cmd_submit, "get": cmd_get, "result": cmd_result, "logs": cmd_logs, "list": cmd_list, "events": cmd_events,
         "clusters": cmd_clusters, "explain": cmd_explain, "queues": cmd_queues, "cancel": cmd_cancel, "report": cmd_report}



def needs_web_extra(ns: argparse.Namespace) -> str | None:
    """The command line, when this command needs the `web` extra (`gpuorch.extras`), else None."""
    if ns.cmd == "web":
        return "gpuorch web"
    if ns.cmd in ("report", "simulate") and ns.plot is not None:
        return f"gpuorch {ns.cmd} --plot"
    return None


def main(argv: list[str] | None = None) -> None:
    ns = build_parser().parse_args(argv)
    what = needs_web_extra(ns)
    if what is not None and (gone := extras.missing(extras.WEB)):
        print(extras.hint(what, gone), file=sys.stderr)
        raise SystemExit(2)
    if ns.cmd == "up":
        raise SystemExit(cmd_up(ns))
    if ns.cmd == "down":
        raise SystemExit(cmd_down(ns))
    if ns.cmd == "status":
        raise SystemExit(cmd_status(ns))
    if ns.cmd == "restart":
        raise SystemExit(cmd_restart(ns))
    if ns.cmd == "fault":
        raise SystemExit(cmd_fault(ns))
    if ns.cmd == "settings":
        raise SystemExit(cmd_settings(ns))
    if ns.cmd == "simulate":
        from gpuorch.simulate.cli import run as run_simulate

        raise SystemExit(run_simulate(ns))
    if ns.cmd == "web":
        from gpuorch.observe.commands import run_web

        raise SystemExit(run_web(ns, settings_for(ns.state)))
    if ns.cmd == "demo":
        from gpuorch.demo import run_demo

        raise SystemExit(run_demo(Path(ns.clusters), keep=ns.keep))
    s = settings_for(ns.state)
    try:
        raise SystemExit(asyncio.run(ASYNC[ns.cmd](ns, s)))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except OSError as exc:
        print(f"cannot reach NATS at {s.nats_url}: {exc} (is the system up? `gpuorch up`)", file=sys.stderr)
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
