"""A real Prometheus scraping a real agent, stream worker and scheduler: every panel query returns
data and a fault's alert fires (Debian package `prometheus`; skipped where it is not installed).
Then, per metrics schema and coexistence mode, every query of NVIDIA's dcgm-exporter dashboard and
of ours that reads the agent returns data for each simulated GPU architecture (Hopper, Ampere,
Turing, Ada), except what the architecture cannot give.

The scheduler runs as ``gpuaware scheduler`` against the real kube-apiserver (nodes named as the
simulated agent's, so live GPU state applies), with two tenants' queues, pods it places, and pods
nobody can place (so queue gauges have series); it and the agent act as their shipped ServiceAccounts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
import urllib.error
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuaware.agent.collectors.sim import MODELS, SimCluster, load_scenario
from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentCollector, AgentStats, serve
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract import topics
from gpuaware.contract.dcgm import translate
from gpuaware.contract.events import GpuInfo, GpuSample, TelemetryBatch, encode
from gpuaware.dashboards.build import rules_path
from gpuaware.dashboards.definitions import DASHBOARDS, VARIANTS, variant
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.local.processes import ChildProcess, free_port
from gpuaware.local.prometheus import LocalPrometheus, available
from gpuaware.local.stream_workers import StreamWorkerProcess, worker_env
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.scheduler.kube.objects import HEALTH_TAINT_KEY
from tests.real_kube import Kube
from tests.support import missing_part, produce
from tests.system import nvidia_dashboard as nvidia

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(autouse=True)
def _prometheus() -> None:
    if not available():
        missing_part("Debian package prometheus not installed")

SCENARIO = """name: live
seed: 4
nodes: 2
gpus_per_node: 6
models: [H100, A100]
workloads: [training-compute, idle-holding, inference-bursty, trace, training-memory, trace]
faults:
  - {kind: ecc_dbe, node: 0, gpu: 3, at_s: 30}
  - {kind: xid, node: 0, gpu: 4, at_s: 5, xid: 79}
  - {kind: power_cap, node: 0, gpu: 0, at_s: 2, cap_w: 300}
  - {kind: dead, node: 0, gpu: 5, at_s: 7}
"""


# The double-bit error comes late enough for Prometheus to have scraped its counter at 0 first
# (increase() sees nothing in a series born at 1): a loaded machine takes over 10 s to start the agent.


def _history(node: str) -> list[tuple[str, bytes, bytes]]:
    """20 minutes of telemetry ending now, so forecasts (and their errors) exist from the start."""
    now = int(time.time() * 1000)
    out = []
    for seq in range(1, 121):
        batch = TelemetryBatch(node, seq, now - 20 * 60_000 + seq * 10_000,
                               [GpuInfo(f"GPU-{node}-0", 0, "NVIDIA A100-SXM4-80GB", 81920)],
                               [GpuSample(0, seq, 0, 40 + seq % 20, 20, 20_000, 2500, 60)])
        out.append((topics.TELEMETRY, node.encode(), encode(batch)))
    out.append((topics.TELEMETRY, node.encode(), b"\xa7garbage"))  # one DLQ entry
    return out


def _query(prometheus: LocalPrometheus, expr: str, defined: set[str] = frozenset()) -> list:
    """``expr`` as Grafana sends it with every variable at "All" (``.*``): only the variables its dashboard
    defines; any other ``$name`` fails the test (Grafana would send it as it stands and show an empty panel)."""
    for variable in sorted(defined, key=len, reverse=True):
        expr = expr.replace(f"${variable}", ".*")
    undefined = [m for m in re.findall(r"\$\{?(\w+)", expr) if m not in ("__range",)]
    assert not undefined, f"undefined dashboard variables {undefined} in {expr}"
    return prometheus.query(expr.replace("$__range", "10m"))


def _variables_without_values(prometheus: LocalPrometheus) -> list[str]:
    """Each dashboard variable's label_values(metric, label), as Grafana fills the dropdown: one value at least."""
    empty = []
    for uid, d in DASHBOARDS.items():
        for v in d.variables:
            metric, label = re.fullmatch(r"label_values\((.+), (\w+)\)", v.query).groups()
            rows = _query(prometheus, f"group by ({label}) ({metric})", d.variable_names())
            if not [r for r in rows if r["metric"].get(label)]:
                empty.append(f"{uid} ${v.name}")
    return empty


def _cluster(kube: Kube, unique: str) -> None:
    kube.create("nodes", make_node(f"live-{unique}-000", gpus=6))
    # Node 000's XID 79 asks for a reboot, which drains the whole node and taints it NoSchedule: the tenants'
    # pods need a healthy node with live state to run on for the allocation and fairness gauges to have series.
    kube.create("nodes", make_node(f"live-{unique}-001", gpus=6))
    kube.create("nodes", make_node(f"spare-{unique}", gpus=8, product="NVIDIA-A100-SXM4-80GB"))
    for tenant, weight, quota in (("vision", 2, 4), ("speech", 1, 2)):
        kube.create("gpuqueues", {"metadata": {"name": tenant}, "spec": {
            "tenant": tenant, "namespaces": [tenant], "weight": weight, "quota": [{"model": "*", "gpus": quota}]}},
            group="gpuaware.io", version="v1alpha1")
    # Nobody has a B200: these wait, so the queue gauges have series.
    kube.create("pods", make_pod("waiting", namespace="speech", gpus=1, annotations={"gpuaware.io/gpu-models": "B200"},
                                 priority=200_000))
    kube.create("pods", make_pod("waiting", namespace="vision", gpus=1, annotations={"gpuaware.io/gpu-models": "B200"}))


def _drained(kube: Kube, unique: str) -> bool:
    """Whether node 000's XID 79 has drained it (the health taint): pods created after that run on the healthy
    nodes, where they stay, instead of racing the drain and being evicted from node 000."""
    node = next(n for n in kube.objects("nodes") if n["metadata"]["name"] == f"live-{unique}-000")
    return any(t.get("key") == HEALTH_TAINT_KEY for t in node["spec"].get("taints") or [])


def _running_work(kube: Kube) -> None:
    """The tenants' pods, for the allocation and fairness gauges, and jobs that declare their durations and
    complete (``_complete``): the runtime table learns them."""
    for i in range(4):
        kube.create("pods", make_pod(f"train-{i}", namespace="vision", gpus=1))
    kube.create("pods", make_pod("asr", namespace="speech", gpus=0, annotations={"gpuaware.io/gpu-milli": "500"}))
    _jobs(kube, JOBS)


# name -> (owner, declared seconds or None, minutes it runs). The first three declare their durations (exact
# estimates, not judged); once the table has learned them, the same owners' next jobs (``LATER``) are placed with
# forecasts, one per owner, and judged: the forecast quality panels have data.
JOBS = {"job-a": ("a", "500", 10), "job-b": ("b", "1500", 20), "job-c": ("c", "1700", 30)}
LATER = {"job-a2": ("a", None, 10), "job-b2": ("b", None, 20), "job-c2": ("c", None, 30)}
LEARNED_KEYS = 11  # 3 owners, tenant, 2 shapes, *, and the declared ratios of 3 owners and the tenant


def _jobs(kube: Kube, jobs: dict) -> None:
    for name, (owner, declared, _) in jobs.items():
        annotations = {"gpuaware.io/job": owner} | ({"gpuaware.io/duration-s": declared} if declared else {})
        kube.create("pods", make_pod(name, namespace="jobs", annotations=annotations))


def _complete(kube: Kube) -> None:
    """Each job kwok runs ends Succeeded after its minutes, as its kubelet would write it."""
    for pod in kube.objects("pods"):
        name = pod["metadata"]["name"]
        if name in JOBS | LATER and (pod.get("status") or {}).get("phase") == "Running":
            minutes = (JOBS | LATER)[name][2]
            kube.end_pod(name, "Succeeded", "2027-01-15T08:00:00Z", f"2027-01-15T08:{minutes}:00Z", "jobs")


def test_every_panel_returns_data_and_a_fault_alert_fires(kafka_settings: KafkaSettings, tmp_path: Path,
                                                          unique: str, kube: Kube) -> None:
    (tmp_path / "live.yaml").write_text(SCENARIO.replace("name: live", f"name: live-{unique}")
                                        + f"node_prefix: live-{unique}\n")
    asyncio.run(produce(kafka_settings, _history(f"hist-{unique}")))
    _cluster(kube, unique)
    agent_port = free_port()
    agent = ChildProcess("agent", [sys.executable, "-m", "gpuaware", "--log-level", "warning", "agent",
                                   "--collector", "sim", "--scenario", str(tmp_path / "live.yaml"),
                                   "--spool-dir", str(tmp_path / "spool"), "--metrics-port", str(agent_port),
                                   ],
                         tmp_path / "agent.log", {**worker_env(kafka_settings), "GPUAWARE_AGENT__CORDON_POLL_S": "1",
                                                  "KUBECONFIG": str(kube.accounts["gpuaware-agent"])})
    stream = StreamWorkerProcess(kafka_settings, f"live-{unique}", tmp_path, "stream", node_identity="off",
                                 cluster_forecast_interval_s=2, node_state_interval_s=1)
    scheduler_port = free_port()
    scheduler = ChildProcess("scheduler", [sys.executable, "-m", "gpuaware", "--log-level", "warning", "scheduler",
                                           "--metrics-port", str(scheduler_port), "--extender-port", "0"],
                             tmp_path / "scheduler.log",
                             {**worker_env(kafka_settings), "KUBECONFIG": str(kube.accounts["gpuaware-scheduler"])})
    prometheus = LocalPrometheus(tmp_path / "prometheus",
                                 {"gpuaware-agent": [agent_port], "gpuaware-stream": [stream.metrics_port],
                                  "gpuaware-scheduler": [scheduler_port]})
    children = (agent, stream, scheduler, prometheus)
    for child in children:
        child.start()
    try:
        queries = [(uid, q) for uid, d in DASHBOARDS.items() for q in d.queries()]
        defined = {uid: d.variable_names() for uid, d in DASHBOARDS.items()}
        # Alone this takes ~30 s; in the full suite the worker first reads every earlier test's telemetry.
        deadline = time.monotonic() + 240
        empty, working, later = queries, False, False
        while time.monotonic() < deadline:
            for child in children:
                assert child.running(), f"{child.name} exited:\n{child.log_tail()}"
            if not working and _drained(kube, unique):
                _running_work(kube)
                working = True
            _complete(kube)
            with contextlib.suppress(OSError):
                if not later and prometheus.query(f"gpuaware_scheduler_runtime_keys >= {LEARNED_KEYS}"):
                    _jobs(kube, LATER)
                    later = True
            try:  # a panel of recent events (the last minute's) shows data while they are recent: once is enough
                empty = [(uid, q) for uid, q in empty if (uid, q) not in queries or not _query(prometheus, q,
                                                                                                defined[uid])]
                if not [e for e in empty if e[1] != "no values"]:
                    empty = [(v, "no values") for v in _variables_without_values(prometheus)]
            except OSError:
                pass  # Prometheus still starting
            if not empty:
                break
            time.sleep(3)  # the poll interval (one scrape)
        assert not empty, f"{len(empty)} of {len(queries)} panel queries returned no data: {empty}"
        firing: set[str] = set()
        while time.monotonic() < deadline and not {"GpuDoubleBitEcc", "GpuLost"} <= firing:
            firing = {a["labels"]["alertname"] for a in prometheus.alerts() if a["state"] == "firing"}
            time.sleep(1)
        assert {"GpuDoubleBitEcc", "GpuLost"} <= firing, firing
        # The agent's failing GPUs reached the scheduler through the stream: cordoned, nothing left on them.
        live_node = f"live-{unique}-000"

        def cordoned() -> set[int]:
            (node,) = [n for n in kube.objects("nodes") if n["metadata"]["name"] == live_node]
            raw = (node["metadata"].get("annotations") or {}).get("gpuaware.io/cordoned-gpus", "")
            return {int(g) for g in raw.split(",") if g}

        deadline = max(deadline, time.monotonic() + 60)
        while time.monotonic() < deadline and not {3, 4, 5} <= cordoned():
            time.sleep(1)
        assert {3, 4, 5} <= cordoned()

        def on_failed() -> list[str]:  # pods still on a cordoned GPU (they are migrated off)
            return [p["metadata"]["name"] for p in kube.objects("pods") if p["spec"].get("nodeName") == live_node
                    and {g["index"] for g in json.loads(p["metadata"]["annotations"]["gpuaware.io/gpus"])}
                    & cordoned()]

        deadline = max(deadline, time.monotonic() + 30)
        while time.monotonic() < deadline and on_failed():
            time.sleep(0.5)
        assert not on_failed()
        pods = kube.objects("pods")
        # The agent read the cordons from its node and honours them (sampled at the floor, shown on /metrics).

        def agent_cordoned() -> set[int]:
            rows = prometheus.query(f'gpuaware_gpu_cordoned{{Hostname="{live_node}"}} == 1')
            return {int(r["metric"]["gpu"]) for r in rows}

        deadline = max(deadline, time.monotonic() + 30)
        while time.monotonic() < deadline and agent_cordoned() != cordoned():
            time.sleep(1)
        assert agent_cordoned() == cordoned()
        assert not [p for p in pods if p["metadata"]["name"] == "waiting" and p["spec"].get("nodeName")]
    finally:
        for child in (prometheus, scheduler, stream, agent):
            child.stop()


# Two GPUs of each architecture, one idle holding memory with an XID, one training under a power
# cap, so every conditional panel (idle GPUs, last XID, throttled, components below 100) has data
# for each; GPU 0 (Hopper) is split into MIG instances and GPU 3 (Ampere) is time-shared by 3 pods.
ARCH_SCENARIO = """name: arch
seed: 5
nodes: 1
gpus_per_node: 8
models: [H100, H100, A100, A100, T4, T4, L4, L4]
workloads: [idle-holding, training-compute]
mig: {0: [3g.40gb, 3g.40gb]}
shared: {3: 3}
faults:
""" + "".join(f"  - {{kind: xid, node: 0, gpu: {g}, at_s: 1, xid: 43}}\n  - {{kind: power_cap, node: 0, gpu: {g + 1}, "
              f"at_s: 1}}\n" for g in range(0, 8, 2))
ARCH_GPUS = {"H100": "0|1", "A100": "2|3", "T4": "4|5", "L4": "6|7"}
AGENT_METRIC = re.compile(r"\b(?:DCGM_FI_[A-Z_]+|gpuaware_dcgm_[a-z_]+|gpuaware_gpu_[a-z_]+|gpuaware_agent_[a-z_]+|"
                          r"gpuaware:(?:gpu|agent)[a-z_:0-9]*)\b")
ANY_METRIC = re.compile(r"\b(?:DCGM_FI_[A-Z_]+|gpuaware_[a-z_]+|gpuaware:[a-z_:0-9]+)\b")


def _fake_dcgm_exporter(tmp_path: Path) -> int:
    """dcgm-exporter's DCGM_* families for the same GPUs, as the GPU Operator would serve them beside us."""
    cluster = SimCluster(load_scenario(tmp_path / "arch.yaml"))
    core = AgentCore(cluster.node(0), SamplingPolicy())
    core.tick(cluster.clock())
    registry = CollectorRegistry()
    registry.register(AgentCollector([core], AgentStats()))
    port = free_port()
    serve(registry, "127.0.0.1", port)
    return port


@pytest.mark.parametrize("folder", list(VARIANTS))
def test_every_dashboard_query_returns_data_per_architecture_schema_and_coexistence(
        kafka_settings: KafkaSettings, tmp_path: Path, unique: str, folder: str) -> None:
    schema, prefixed = VARIANTS[folder]
    (tmp_path / "arch.yaml").write_text(ARCH_SCENARIO.replace("name: arch", f"name: arch-{unique}")
                                        + f"node_prefix: arch-{unique}\n")
    agent_port = free_port()
    env = {**worker_env(kafka_settings), "GPUAWARE_AGENT__METRICS_SCHEMA": schema,
           "GPUAWARE_AGENT__DCGM_EXPORTER": "beside" if prefixed else "replace", "GPUAWARE_AGENT__CORDON_POLL_S": "0"}
    agent = ChildProcess("agent", [sys.executable, "-m", "gpuaware", "--log-level", "warning", "agent",
                                   "--collector", "sim", "--scenario", str(tmp_path / "arch.yaml"),
                                   "--spool-dir", str(tmp_path / "spool"), "--metrics-port", str(agent_port)],
                         tmp_path / "agent.log", env)
    targets = {"gpuaware-agent": [agent_port]}
    if prefixed:  # the GPU Operator's dcgm-exporter on the same node
        targets["dcgm-exporter"] = [_fake_dcgm_exporter(tmp_path)]
    prometheus = LocalPrometheus(tmp_path / "prometheus", targets, rules=rules_path(folder))

    def theirs(q: str) -> str:
        """NVIDIA's 4.8 dashboard query: as it stands beside dcgm-exporter (the fake serves 4.8 names), else
        with the agent's names for the schema (4.9.0 renames them; the 4.9.0 dashboard was not readable)."""
        return q if prefixed else translate(q, schema, False, units=False)

    ours = [(f"{uid}: {q}", q) for uid, d in DASHBOARDS.items() for q in variant(d, schema, prefixed).queries()
            if ANY_METRIC.findall(q) and all(AGENT_METRIC.fullmatch(m) for m in ANY_METRIC.findall(q))]
    # What our dashboards that read the agent define, and NVIDIA's dashboard ($instance, $gpu).
    variables = {"cluster", "node", "gpu", "model", "datasource", "instance"}
    assert len(ours) > 20
    checks: list[tuple[str, str]] = []  # (what, PromQL)
    for model, gpus in ARCH_GPUS.items():
        name = MODELS[model].name
        for what, q in ours:
            if "$model" in q:
                checks.append((f"{model} {what}", q.replace("$model", name)))
        for title, q in nvidia.PANELS.items():
            if not (title in nvidia.GPM_PANELS and not MODELS[model].gpm):
                checks.append((f"{model} NVIDIA {title}", theirs(q).replace("$gpu", gpus)))
    checks += [(what, q) for what, q in ours if "$model" not in q]
    checks += [(f"NVIDIA variable source {m}", theirs(m)) for m in nvidia.VARIABLE_SOURCES]
    children = (agent, prometheus)
    for child in children:
        child.start()
    try:
        deadline = time.monotonic() + 120
        empty = checks
        while time.monotonic() < deadline:
            for child in children:
                assert child.running(), f"{child.name} exited:\n{child.log_tail()}"
            try:
                empty = [(w, q) for w, q in empty if not _query(prometheus, q, variables)]
            except urllib.error.HTTPError as exc:  # a query Prometheus refuses: say which
                raise AssertionError(f"{exc}: {exc.read()[:300]!r}") from exc
            except OSError:
                time.sleep(1)
                continue  # Prometheus still starting
            if not empty:
                break
            time.sleep(1)
        assert not empty, (f"{len(empty)} of {len(checks)} queries returned no data ({folder or 'default'}): "
                           f"{[w for w, _ in empty][:12]}\n{agent.log_tail()}")
        # What stays empty is what the architecture cannot give (documented in docs/observability.md).
        for model, gpus in ARCH_GPUS.items():
            tensor = theirs(nvidia.PANELS["Tensor Core Utilization"]).replace("$gpu", gpus)
            assert bool(_query(prometheus, tensor, variables)) == MODELS[model].gpm, model
        # Beside dcgm-exporter nothing is counted twice: its DCGM_* are the only ones, ours are prefixed.
        by_model = variant(DASHBOARDS["gpuaware-fleet"], schema, prefixed).panels[0].targets[0].expr
        gpus_by_model = _query(prometheus, by_model, variables)
        assert sum(float(r["value"][1]) for r in gpus_by_model) == 8
        # The time-shared GPU has one series per pod, the MIG-split one a series per GPU instance.
        for expr, n in (('count(DCGM_FI_DEV_GPU_UTIL{pod_uid!=""})', 3),
                        ('count(DCGM_FI_DEV_FB_USED{GPU_I_ID!=""})', 2)):
            (row,) = _query(prometheus, translate(expr, schema, prefixed))
            assert float(row["value"][1]) == n, expr
        whole_gpus = _query(prometheus, theirs('count(DCGM_FI_DEV_GPU_TEMP) by (job)'))
        assert {r["metric"]["job"]: float(r["value"][1]) for r in whole_gpus} == (
            {"dcgm-exporter": 8} if prefixed else {"gpuaware-agent": 8})
    finally:
        for child in (prometheus, agent):
            child.stop()
