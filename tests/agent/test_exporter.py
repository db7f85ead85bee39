"""The agent's exporter: DCGM names and labels, unsupported fields left out, served as Prometheus parses it."""

from __future__ import annotations

import re
import urllib.request

from prometheus_client import CollectorRegistry

from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentCollector, AgentStats, serve
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.bench.agent_series import ticked_core as _core
from gpuaware.local.processes import free_port
from tests.agent.metrics_support import LEGACY_LABELS
from tests.agent.metrics_support import families as _families
from tests.agent.metrics_support import metrics_text as _text
from tests.support import sim_cluster


def test_exporter_speaks_dcgm_names_and_leaves_unsupported_fields_out():
    cluster, clock = sim_cluster("thermal")
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    for s in range(0, 30):
        clock[0] = float(s)
        core.tick(float(s))
    core.tracks[0].last_sample.mem_temp_c = None  # a GPU without an HBM sensor
    families = _families(_text(core))
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                 "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ENC_UTIL",
                 "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                 "gpuaware_gpu_health_score", "gpuaware_agent_sampling_interval_seconds"):
        assert families[name].samples, name
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert len(util) == 8 and set(util[0].labels) == LEGACY_LABELS
    assert util[0].labels["Hostname"] == "sim-node-000" and util[0].labels["UUID"].startswith("GPU-")
    assert all(s.labels["DCGM_FI_DRIVER_VERSION"] for f in families.values() if f.name.startswith("DCGM_")
               for s in f.samples)
    assert all(re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", s.labels["pci_bus_id"]) for s in util)
    mem_temp = [s.labels["gpu"] for s in families["DCGM_FI_DEV_MEMORY_TEMP"].samples]
    assert "0" not in mem_temp
    comps = {s.labels["component"] for s in families["gpuaware_gpu_health_component"].samples}
    assert {"ecc", "xid", "thermal", "power", "throttle", "pcie"} <= comps
    verdicts = families["gpuaware_gpu_health_verdict"].samples
    assert len(verdicts) == 8 and {s.labels["verdict"] for s in verdicts} == {"pass"}
    assert {s.labels["action"] for s in verdicts} == {"none"}
    (node,) = families["gpuaware_node_health_verdict"].samples
    assert (node.labels["Hostname"], node.labels["verdict"], node.value) == ("sim-node-000", "pass", 1.0)


def test_metrics_are_served_in_the_text_format_prometheus_2_parses():
    core, _ = _core({"gpus_per_node": 1}, seconds=2)
    registry = CollectorRegistry()
    registry.register(AgentCollector([core], AgentStats()))
    port = free_port()
    serve(registry, "127.0.0.1", port)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        # 0.0.4: Prometheus 2 refuses the 1.0.0 text format prometheus_client names latest.
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert b"# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in r.read()


def test_xid_errors_are_counted_per_code_so_alerts_can_leave_application_faults_out():
    cluster, clock = sim_cluster("xid")  # XID 79 on GPU 2 of node 0 at 450 s
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    for s in range(0, 460):
        clock[0] = float(s)
        core.tick(float(s))
    samples = [s for s in _families(_text(core))["gpuaware_agent_xid_errors"].samples if s.name.endswith("_total")]
    assert {(s.labels["xid"], s.value) for s in samples} >= {("79", 1.0)}
    assert all(s.labels["gpu"] and s.labels["UUID"] for s in samples)
