"""The agent's Prometheus exporter: DCGM's metric names and labels, unsupported fields left out."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.core import AgentCore
from agent.exporter import DCGM_LABELS, AgentCollector, AgentStats
from agent.sampling import SamplingPolicy
from tests.support import sim_cluster


def test_exporter_speaks_dcgm_names_and_leaves_unsupported_fields_out():
    cluster, clock = sim_cluster("thermal")
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    for s in range(0, 30):
        clock[0] = float(s)
        core.tick(float(s))
    core.tracks[0].last_sample.mem_temp_c = None  # a GPU without an HBM sensor
    registry = CollectorRegistry()
    registry.register(AgentCollector([core], AgentStats()))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                 "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_PROF_SM_ACTIVE",
                 "gpuaware_gpu_health_score", "gpuaware_agent_sampling_interval_seconds"):
        assert families[name].samples, name
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert len(util) == 8 and set(util[0].labels) == set(DCGM_LABELS)
    assert util[0].labels["Hostname"] == "sim-node-000" and util[0].labels["UUID"].startswith("GPU-")
    mem_temp = [s.labels["gpu"] for s in families["DCGM_FI_DEV_MEMORY_TEMP"].samples]
    assert "0" not in mem_temp
    comps = {s.labels["component"] for s in families["gpuaware_gpu_health_component"].samples}
    assert {"ecc", "xid", "thermal", "power", "throttle", "pcie"} <= comps
    verdicts = families["gpuaware_gpu_health_verdict"].samples
    assert len(verdicts) == 8 and {s.labels["verdict"] for s in verdicts} == {"pass"}
    assert {s.labels["action"] for s in verdicts} == {"none"}
    (node,) = families["gpuaware_node_health_verdict"].samples
    assert (node.labels["Hostname"], node.labels["verdict"], node.value) == ("sim-node-000", "pass", 1.0)
