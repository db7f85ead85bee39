"""Every dashboard query, and every rule expression, names only metrics the components export."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry

from gpuaware.agent.collectors.sim import SimCluster, load_scenario
from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentCollector, AgentStats, render
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract.dcgm import DRIVER_LABELS, LEGACY, RENAMED, exported_names, family_name
from gpuaware.contract.events import JobRuntime, ModelDemand
from gpuaware.dashboards.build import rules_for
from gpuaware.dashboards.definitions import DASHBOARDS, VARIANTS, variant
from gpuaware.scheduler.core.runtime import RuntimeEstimate
from gpuaware.scheduler.metrics import QueueSnapshot, SchedulerCollector, SchedulerStats
from gpuaware.scheduler.runtimes import RuntimeTable
from gpuaware.stream.gpu_state import GpuTracker
from gpuaware.stream.metrics import StreamCollector, StreamStats
from tests.support import prometheus_rules

METRIC = re.compile(r"\b(DCGM_FI_[A-Z_]+|gpuaware_[a-z_]+|gpuaware:[a-z_:0-9]+|up)\b(?!\s*[=!]~?\s*\")")


def _exported_names(schema: str = "dcgm-legacy", prefixed: bool = False) -> set[str]:
    """Every sample name the agent, a stream worker and the scheduler expose, from their real collectors."""
    scenario = load_scenario("xid")
    clock = [0.0]
    cluster = SimCluster(scenario, clock=lambda: clock[0], epoch=0.0)
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    for s in range(0, 460):  # past the scenario's XID 79 at 450 s
        clock[0] = float(s)
        core.tick(float(s))
    registry = CollectorRegistry()
    registry.register(AgentCollector([core], AgentStats(), schema=schema, prefixed=prefixed))
    stats = StreamStats()
    stats.records["gpu.telemetry.v1"] += 1
    stats.dlq["gpu.telemetry.v1"] += 1
    stats.published["gpu.state.v1"] += 1
    stats.observe_latency(0.3)
    stats.demand = [ModelDemand("H100", 300, 1.0, 0.5, 1.5, 8.0)]
    tracker = GpuTracker("GPU-x")
    tracker._models()
    for v in range(30):
        tracker._learn_minute(float(v), 100.0)
    registry.register(StreamCollector(stats, lambda: [tracker], lambda: {("gpu.telemetry.v1", 0): 3}))
    sched = SchedulerStats(leader=True)  # only the leader exports the queue snapshot
    sched.decisions[("PLACE", "fits")] += 1
    sched.api_errors[("bind", 409)] += 1
    sched.extender_requests[("filter", 200)] += 1
    sched.waited("vision", 2, 3.0)
    sched.mtbi.observe(86400.0)
    sched.mttr.observe(900.0)
    sched.lemon_nodes.add("n7")
    sched.pod_decided("vision/train-0", "PLACE", "fits", "n1", 1.0)
    sched.runtimes = RuntimeTable()
    sched.runtimes.learn(JobRuntime("*", 1_000, 5, 6.0, 1.0))
    for i in range(3):  # completions scored against the estimates their pods were placed with
        sched.forecasts.placed(f"ns/p{i}", RuntimeEstimate(6.0 + i, 0.5, level="shape"))
        sched.forecasts.completed(f"ns/p{i}", 400.0 * (i + 1))
    snapshot = QueueSnapshot(pending={("vision", "high"): 1}, oldest_wait_s={("vision", "high"): 5.0},
                             gpus_used={"vision": 2.0}, gpus_quota={"vision": 1.0}, gpus_borrowed={"vision": 1.0},
                             jain=0.9, allocated_busy_ratio=0.5)
    registry.register(SchedulerCollector(sched, lambda: snapshot))
    text = render(registry).decode()
    # Sample names as Prometheus stores them (the Python parser would append _total to DCGM's counters).
    return set(re.findall(r"^([A-Za-z_:][A-Za-z0-9_:]*)[{ ]", text, re.M))


def test_every_query_names_only_metrics_that_are_exported() -> None:
    exported = _exported_names() | {r["record"] for r in prometheus_rules() if "record" in r} | {"up"}
    queries = [(uid, q) for uid, d in DASHBOARDS.items() for q in d.queries()]
    queries += [(r.get("alert") or r["record"], r["expr"]) for r in prometheus_rules()]
    assert len(queries) > 40
    missing = sorted({(where, name) for where, q in queries for name in METRIC.findall(q) if name not in exported})
    assert not missing, missing


@pytest.mark.parametrize("folder", [f for f in VARIANTS if f])
def test_each_schema_and_prefix_variant_queries_only_what_that_agent_exports(folder: str) -> None:
    schema, prefixed = VARIANTS[folder]
    rules = [r for g in rules_for(folder)["groups"] for r in g["rules"]]
    exported = _exported_names(schema, prefixed) | {r["record"] for r in rules if "record" in r} | {"up"}
    queries = [(uid, q) for uid, d in DASHBOARDS.items() for q in variant(d, schema, prefixed).queries()]
    queries += [(r.get("alert") or r["record"], r["expr"]) for r in rules]
    missing = sorted({(where, name) for where, q in queries for name in METRIC.findall(q) if name not in exported})
    assert not missing, missing
    if prefixed:  # beside dcgm-exporter, nothing of ours is summed with its DCGM_* families
        assert not [q for _, q in queries if "DCGM_FI_DEV" in q or "DCGM_FI_PROF" in q]
    if schema != "dcgm-legacy":
        assert not [q for _, q in queries if "Hostname" in q]


@pytest.mark.parametrize("folder", list(VARIANTS))
def test_each_variant_asks_only_for_dcgm_names_its_schema_has(folder: str) -> None:
    """Against the contract's table alone: a panel or rule asking for a DCGM name the schema lacks fails here."""
    schema, prefixed = VARIANTS[folder]
    dcgm = re.compile(r"\b(?:DCGM_FI_[A-Z0-9_]+|gpuaware_dcgm_[a-z0-9_]+)\b")
    rules = [r["expr"] for g in rules_for(folder)["groups"] for r in g["rules"]] if folder else \
        [r["expr"] for r in prometheus_rules()]
    queries = [q for d in DASHBOARDS.values() for q in variant(d, schema, prefixed).queries()] + rules
    asked = {n for q in queries for n in dcgm.findall(q)} - DRIVER_LABELS  # labels, not families
    assert asked and asked <= exported_names(schema, prefixed), sorted(asked - exported_names(schema, prefixed))
    pcie = {n for n in asked if "pcie_tx" in n.lower()}
    assert pcie == {family_name("DCGM_FI_PROF_PCIE_TX_BYTES", prefixed, schema)}
    # Every renamed family the definitions use is asked for under its new name, never its old one.
    legacy = {n for d in DASHBOARDS.values() for q in d.queries() for n in dcgm.findall(q)}
    legacy |= {n for r in prometheus_rules() for n in dcgm.findall(r["expr"])}
    renamed = {n for n in RENAMED.get(schema, {}) if n in legacy}
    assert {family_name(n, prefixed, schema) for n in renamed} <= asked
    assert not {family_name(n, prefixed, LEGACY) for n in renamed} & asked
    assert schema == LEGACY or {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
                                "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"} <= renamed
    # The check has teeth: the legacy queries, unrendered, ask 4.9 and 4.10 for names they do not have.
    assert schema == LEGACY or legacy - exported_names(schema, prefixed)


def test_every_variable_a_dashboard_uses_it_defines() -> None:
    """An undefined `$node` is sent to Prometheus as it stands: the panel is empty, with no error."""
    undefined = {uid: sorted(d.variable_references() - d.variable_names()) for uid, d in DASHBOARDS.items()}
    assert not any(undefined.values()), undefined
    assert all("cluster" in d.variable_names() for d in DASHBOARDS.values())


def test_fleet_and_health_panels_drill_down_to_the_gpu_dashboard() -> None:
    gpu = DASHBOARDS["gpuaware-gpu"]
    assert {"cluster", "node", "gpu"} <= gpu.variable_names()
    for uid in ("gpuaware-fleet", "gpuaware-health"):
        for panel in DASHBOARDS[uid].panels:
            assert [k.url for k in panel.links if k.url.startswith("/d/gpuaware-gpu/")], (uid, panel.title)
            if all("{{gpu}}" in t.legend for t in panel.targets):  # a series of one GPU opens that GPU
                assert "var-gpu=${__field.labels.gpu}" in panel.links[0].url, (uid, panel.title)


def test_table_panels_are_one_row_per_series() -> None:
    tables = [p for d in DASHBOARDS.values() for p in d.to_json()["panels"] if p["type"] == "table"]
    assert tables
    for panel in tables:
        assert all(t["instant"] and t["format"] == "table" and not t["range"] for t in panel["targets"]), panel["title"]


FIELD_LABEL = re.compile(r"\$\{__field\.labels\.(\w+)\}")
LINK = re.compile(r"/d/(?P<uid>[\w-]+)/(?P=uid)\?(?P<query>.+)")
GRAFANA_PARAMS = {"${__url_time_range}", "${__all_variables}"}


def _keeps(expr: str, label: str) -> bool:
    """Whether the series ``expr`` returns carry ``label``: every aggregation in it keeps it by name (an
    expression without aggregation keeps every label of its selector)."""
    kept = re.findall(r"\b(?:sum|avg|min|max|count|group|topk|bottomk)\s+by\s*\(([^)]*)\)", expr)
    return all(label in {x.strip() for x in by.split(",")} for by in kept)


@pytest.mark.parametrize("folder", list(VARIANTS))
def test_every_data_link_resolves_to_a_dashboard_its_variables_and_labels_of_the_series(folder: str) -> None:
    """A link to a dashboard that does not exist, a ``var-x`` it does not define, or a label the clicked
    series does not carry (``sum by (Hostname, gpu)`` has no ``cluster``) opens an empty view."""
    schema, prefixed = VARIANTS[folder]
    wrong, checked = [], 0
    for uid, dashboard in DASHBOARDS.items():
        for panel in variant(dashboard, schema, prefixed).panels:
            for link in panel.links:
                checked += 1
                where = (uid, panel.title, link.url)
                m = LINK.fullmatch(link.url)
                if not m or m["uid"] not in DASHBOARDS:
                    wrong.append((*where, "no such dashboard"))
                    continue
                target = DASHBOARDS[m["uid"]].variable_names()
                for param in m["query"].split("&"):
                    name, _, value = param.partition("=")
                    if param in GRAFANA_PARAMS:
                        continue
                    if not name.startswith("var-") or name[4:] not in target or not value:
                        wrong.append((*where, f"{param}: not a variable of {m['uid']}"))
                for label in FIELD_LABEL.findall(link.url + link.title):
                    wrong += [(*where, f"{t.expr} has no {label}") for t in panel.targets if not _keeps(t.expr, label)]
    assert checked > 20 and not wrong, wrong


def test_per_pod_series_link_to_the_schedulers_decisions_for_that_pod() -> None:
    scheduler = DASHBOARDS["gpuaware-scheduler"]
    assert {"cluster", "namespace", "pod"} <= scheduler.variable_names()
    decisions = [p for p in scheduler.panels if any("pod_decision" in t.expr for t in p.targets)]
    assert decisions and all('pod=~"$pod"' in t.expr for p in decisions for t in p.targets)
    per_pod = [(uid, p) for uid, d in DASHBOARDS.items() for p in d.panels
               if p.targets and all("{{pod}}" in t.legend for t in p.targets)]
    assert per_pod
    for uid, panel in per_pod:
        urls = [k.url for k in panel.links if k.url.startswith("/d/gpuaware-scheduler/")]
        assert urls and "var-pod=${__field.labels.pod}" in urls[0], (uid, panel.title)
        assert "var-namespace=${__field.labels.namespace}" in urls[0], (uid, panel.title)
