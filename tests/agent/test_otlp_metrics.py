"""The agent's GPU metrics over OTLP: off by default, hw.* names, the values /metrics shows, a real collector."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pydantic import ValidationError

from gpuaware.agent import otlp_metrics
from gpuaware.agent.main import export_otlp_metrics
from gpuaware.agent.otlp_metrics import GpuMetricsOtlp
from gpuaware.agent.settings import AgentSettings, otlp_metrics_url
from gpuaware.bench.agent_series import ticked_core
from gpuaware.local.otel_collector import CollectorMissing, OtelCollector, find_collector
from tests.agent.metrics_support import families, metrics_text
from tests.support import need


def dcgm_values(core) -> dict[tuple[str, str], float]:
    """(DCGM family, GPU UUID) -> the value /metrics shows (whole GPUs, no per-pod series)."""
    out = {}
    for fam in families(metrics_text(core)).values():
        for s in fam.samples:
            if s.name.startswith("DCGM_") and "pod_uid" not in s.labels and "GPU_I_ID" not in s.labels:
                out[(fam.name, s.labels["UUID"])] = s.value  # the parser names counter samples *_total
    return out


def expected(core) -> dict[tuple[str, str, str], float]:
    """(OTLP name, hw.id, dcgm.field) -> the value the collector must get for the same tick as /metrics."""
    seen = dcgm_values(core)
    out = {}
    for t in core.tracks:
        u = t.device.uuid
        for field, (name, scale) in {
            "DCGM_FI_DEV_GPU_UTIL": ("hw.gpu.utilization", 0.01), "DCGM_FI_DEV_ENC_UTIL": ("hw.gpu.utilization", 0.01),
            "DCGM_FI_DEV_DEC_UTIL": ("hw.gpu.utilization", 0.01), "DCGM_FI_DEV_FB_USED": ("hw.gpu.memory.usage", 2**20),
            "DCGM_FI_DEV_POWER_USAGE": ("hw.power", 1.0), "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("hw.energy", 1e-3),
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("hw.errors", 1.0), "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("hw.errors", 1.0),
        }.items():
            out[(name, u, field)] = seen[(field, u)] * scale
        out[("hw.temperature", f"{u}/gpu", "DCGM_FI_DEV_GPU_TEMP")] = seen[("DCGM_FI_DEV_GPU_TEMP", u)]
        out[("hw.gpu.memory.limit", u, "DCGM_FI_DEV_FB_TOTAL")] = t.device.fb_total_mib * 2.0**20
        out[("hw.gpu.memory.utilization", u, "DCGM_FI_DEV_FB_USED")] = (seen[("DCGM_FI_DEV_FB_USED", u)]
                                                                        / t.device.fb_total_mib)
        for field in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"):
            out[(field.lower(), u, field)] = seen[(field, u)]  # the SDK lower-cases instrument names
    return out


def _value(v: dict) -> str:
    return next(iter(v.values()))


def points_from_json(bodies: list[dict]) -> tuple[list[dict], dict[tuple[str, str, str], float]]:
    """The resources and (name, hw.id, dcgm.field) -> newest value of OTLP JSON ExportMetricsServiceRequests."""
    resources, points = [], {}
    for body in bodies:
        for rm in body.get("resourceMetrics", []):
            resources.append({a["key"]: _value(a["value"]) for a in rm["resource"]["attributes"]})
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    data = m.get("gauge") or m.get("sum") or {}
                    for p in data.get("dataPoints", []):
                        attrs = {a["key"]: _value(a["value"]) for a in p.get("attributes", [])}
                        value = p["asDouble"] if "asDouble" in p else float(p["asInt"])
                        points[(m["name"], attrs["hw.id"], attrs.get("dcgm.field", ""))] = (value, attrs, m)
    return resources, points


def test_off_by_default_and_a_bad_endpoint_is_refused_with_what_to_give():
    assert AgentSettings().otlp_metrics_endpoint is None
    assert export_otlp_metrics(SimpleNamespace(cores=[]), AgentSettings()) is None
    for bad in ("otel-collector:4318", "grpc://otel-collector:4317", "http://otel-collector:port"):
        with pytest.raises(ValidationError, match="otlp_metrics_endpoint"):
            AgentSettings(otlp_metrics_endpoint=bad)
    assert otlp_metrics_url("http://c:4318") == "http://c:4318/v1/metrics"
    assert otlp_metrics_url("https://c/otlp/v1/metrics/") == "https://c/otlp/v1/metrics"
    assert AgentSettings(otlp_metrics_endpoint="http://c:4318", otlp_metrics_interval_s=5).otlp_metrics_interval_s == 5


def test_names_attributes_and_values_are_the_ones_metrics_shows():
    core, _ = ticked_core({"gpus_per_node": 2}, seconds=5)
    reader = InMemoryMetricReader()
    otlp = GpuMetricsOtlp([core], reader, host_name="h1")
    try:
        data = reader.get_metrics_data()
    finally:
        otlp.shutdown()
    (rm,) = data.resource_metrics
    assert {k: rm.resource.attributes[k] for k in ("service.name", "host.name", "k8s.node.name")} == {
        "service.name": "gpuaware-agent", "host.name": "h1", "k8s.node.name": "sim-node-000"}
    got = {}
    units = {}
    for m in rm.scope_metrics[0].metrics:
        units[m.name] = m.unit
        for p in m.data.data_points:
            got[(m.name, p.attributes["hw.id"], p.attributes.get("dcgm.field", ""))] = p.value
    want = expected(core)
    assert {k: pytest.approx(v) for k, v in want.items()} == {k: got[k] for k in want}
    assert units["hw.gpu.utilization"] == "1" and units["hw.gpu.memory.usage"] == "By"
    assert units["hw.energy"] == "J" and units["hw.temperature"] == "Cel" and units["dcgm_fi_dev_sm_clock"] == "MHz"


def test_pods_as_metrics_has_them_a_holder_on_its_gpus_points_and_a_shared_gpu_per_pod():
    """GPU 0 held by one pod: its points carry the pod's k8s.* attributes. GPU 1 shared by three: the device points
    carry none, and each pod gets its part under gpuaware.pod.gpu.*, the values /metrics' per-pod series show.
    GPU 2: no pod."""
    core, cluster = ticked_core({"gpus_per_node": 3, "workloads": ["training-compute"], "shared": {0: 1, 1: 3}})
    pods = cluster.attribution()
    reader = InMemoryMetricReader()
    otlp = GpuMetricsOtlp([core], reader, host_name="h1", pods=pods)
    try:
        data = reader.get_metrics_data()
    finally:
        otlp.shutdown()
    (rm,) = data.resource_metrics
    by_name = {m.name: list(m.data.data_points) for m in rm.scope_metrics[0].metrics}
    uuid = {t.device.index: t.device.uuid for t in core.tracks}
    (holder,) = pods.pods(uuid[0])
    power = {p.attributes["hw.id"]: dict(p.attributes) for p in by_name["hw.power"]}
    assert {k: v for k, v in power[uuid[0]].items() if k.startswith("k8s.")} == {
        "k8s.pod.name": holder.name, "k8s.namespace.name": holder.namespace, "k8s.container.name": holder.container,
        **({"k8s.pod.uid": holder.uid} if holder.uid else {})}
    assert not [k for g in (1, 2) for k in power[uuid[g]] if k.startswith("k8s.")]
    text = families(metrics_text(core, pods=pods))
    for otlp_name, dcgm_name, scale in (("gpuaware.pod.gpu.utilization", "DCGM_FI_DEV_GPU_UTIL", 0.01),
                                        ("gpuaware.pod.gpu.memory.usage", "DCGM_FI_DEV_FB_USED", 2**20)):
        got = {p.attributes["k8s.pod.uid"]: p.value for p in by_name[otlp_name]}
        want = {s.labels["pod_uid"]: s.value * scale for s in text[dcgm_name].samples if s.labels.get("pod_uid")}
        assert len(want) == 3 and got == pytest.approx(want)
        assert {p.attributes["hw.id"] for p in by_name[otlp_name]} == {uuid[1]}


def test_a_real_collector_receives_the_gpu_metrics(tmp_path):
    need(find_collector, CollectorMissing)  # skipped without it, failed under CI=true
    core, _ = ticked_core({"gpus_per_node": 2}, seconds=5)
    with OtelCollector(tmp_path) as collector:
        otlp = otlp_metrics.start([core], collector.endpoint, interval_s=3600, host_name="h1")
        try:
            want = expected(core)  # the same tick: nothing ticks the core until the flush is done
            assert otlp.force_flush()
        finally:
            otlp.shutdown()
        resources, points = [], {}
        for _ in range(100):
            resources, points = points_from_json(collector.received())
            if all(k in points for k in want):
                break
            time.sleep(0.1)
        assert collector.version().endswith("v0.165.0")
    assert resources and all(r["service.name"] == "gpuaware-agent" and r["k8s.node.name"] == "sim-node-000"
                             for r in resources)
    assert {k: pytest.approx(v) for k, v in want.items()} == {k: points[k][0] for k in want}
    for t in core.tracks:
        _, attrs, metric = points[("hw.gpu.utilization", t.device.uuid, "DCGM_FI_DEV_GPU_UTIL")]
        assert attrs == {"hw.id": t.device.uuid, "hw.type": "gpu", "hw.name": f"gpu{t.device.index}",
                         "hw.vendor": "NVIDIA", "hw.model": t.device.model,
                         "hw.driver_version": t.device.driver_version, "hw.gpu.task": "general",
                         "dcgm.field": "DCGM_FI_DEV_GPU_UTIL"}
        assert metric["unit"] == "1" and "gauge" in metric
        _, _, energy = points[("hw.energy", t.device.uuid, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")]
        assert energy["sum"]["isMonotonic"] and energy["unit"] == "J"
        _, errors, _ = points[("hw.errors", t.device.uuid, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")]
        assert errors["error.type"] == "uncorrected"
        _, temp, _ = points[("hw.temperature", f"{t.device.uuid}/gpu", "DCGM_FI_DEV_GPU_TEMP")]
        assert (temp["hw.type"], temp["hw.parent"]) == ("temperature", t.device.uuid)


def test_tls_files_need_an_https_endpoint_and_client_files_go_in_pairs(tmp_path):
    with pytest.raises(ValidationError, match="is for TLS: give agent"):
        AgentSettings(otlp_metrics_endpoint="http://c:4318", otlp_metrics_certificate="/ca.pem")
    with pytest.raises(ValidationError, match="go together"):
        AgentSettings(otlp_metrics_endpoint="https://c:4318", otlp_metrics_client_certificate="/c.pem")
    missing = AgentSettings(otlp_metrics_endpoint="https://c:4318", otlp_metrics_certificate=str(tmp_path / "no.pem"))
    with pytest.raises(ValueError, match=r"agent.otlp_metrics_certificate: '.*no.pem' is not a readable file"):
        export_otlp_metrics(SimpleNamespace(cores=[]), missing)
    a_directory = AgentSettings(otlp_metrics_endpoint="https://c:4318", otlp_metrics_certificate=str(tmp_path))
    with pytest.raises(ValueError, match="is not a readable file"):
        export_otlp_metrics(SimpleNamespace(cores=[]), a_directory)


def _flush_to(collector: OtelCollector, tls: otlp_metrics.Tls) -> dict:
    """What the collector received of one flush (the SDK's flush says True even when the export failed)."""
    core, _ = ticked_core({"gpus_per_node": 1}, seconds=5)
    otlp = otlp_metrics.start([core], collector.endpoint, interval_s=3600, host_name="h1", tls=tls)
    try:
        want = expected(core)
        otlp.force_flush()
    finally:
        otlp.shutdown()
    points: dict = {}
    for _ in range(100):  # as long as the test above waits: the collector forwards on its own thread
        _, points = points_from_json(collector.received())
        if all(k in points for k in want):
            break
        time.sleep(0.1)
    return {k: points[k][0] for k in want if k in points}


def test_a_real_collector_that_asks_for_mutual_tls_receives_the_metrics_only_from_a_verified_agent(tmp_path,
                                                                                                 monkeypatch):
    """The collector's receiver serves TLS and requires a client certificate from its CA: the agent with the CA and
    its client pair is received; without its client pair, or trusting another CA, it is refused and nothing
    arrives (the export fails: the SDK logs it and the agent tries again at the next interval)."""
    from gpuaware.local.kube_control_plane import _Pki

    need(find_collector, CollectorMissing)
    pki, other = _Pki(tmp_path / "pki"), _Pki(tmp_path / "other")
    server = pki.server("otelcol", "otelcol", ["IP:127.0.0.1", "DNS:localhost"])
    cert, key = pki.client("agent", "gpuaware-agent")
    # An image's own CA bundle (requests reads it on every request) must not replace the configured CA.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other.ca_cert))
    with OtelCollector(tmp_path / "c", tls=(*server, pki.ca_cert)) as collector:
        assert collector.endpoint.startswith("https://")
        assert _flush_to(collector, otlp_metrics.Tls(ca=str(pki.ca_cert))) == {}  # no client certificate
        # the receiver's certificate does not chain to what the agent trusts
        assert _flush_to(collector, otlp_metrics.Tls(ca=str(other.ca_cert), cert=str(cert), key=str(key))) == {}
        got = _flush_to(collector, otlp_metrics.Tls(ca=str(pki.ca_cert), cert=str(cert), key=str(key)))
    assert len(got) > 10 and all(k[0].startswith(("hw.", "dcgm_")) for k in got)
