"""The DCGM families: dcgm-exporter's types, labels and XID, per architecture, schema, prefix, MIG instance and pod."""

from __future__ import annotations

import dataclasses
import re

import pytest

from gpuaware.agent.core import AgentCore
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.agent.settings import AgentSettings
from gpuaware.bench.agent_series import ticked_core as _core
from gpuaware.config import ConfigError, load_config
from gpuaware.contract.dcgm import (
    FAMILIES,
    GPM_ONLY,
    MIN_LABEL_BUDGET,
    RENAMED,
    SCHEMAS,
    UNCONFIRMED_49,
    pod_label_name,
)
from tests.agent.metrics_support import families as _families
from tests.agent.metrics_support import metrics_text as _text
from tests.support import sim_cluster


def test_type_lines_follow_dcgm_exporters_csv_and_counters_keep_their_names():
    core, _ = _core({"gpus_per_node": 1})
    text = _text(core)
    types = dict(re.findall(r"^# TYPE (DCGM_\w+) (\w+)$", text, re.M))
    assert types == {name: f.type for name, f in FAMILIES.items() if name in types}
    for name in ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                 "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"):
        assert types[name] == "counter"
        assert re.search(rf"^{name}{{", text, re.M) and f"{name}_total" not in text
    assert types["DCGM_FI_DEV_GPU_UTIL"] == "gauge"
    assert "# TYPE gpuaware_agent_samples_total counter" in text  # our own counters keep _total

def test_xid_is_zero_with_its_labels_until_the_first_and_then_carries_code_and_text():
    cluster, clock = sim_cluster("xid")
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    core.tick(0.0)
    (before,) = [s for s in _families(_text(core))["DCGM_FI_DEV_XID_ERRORS"].samples if s.labels["gpu"] == "0"]
    assert before.value == 0 and (before.labels["err_code"], before.labels["err_msg"]) == ("0", "No Error")
    core.tracks[0].last_xid = 79
    (after,) = [s for s in _families(_text(core))["DCGM_FI_DEV_XID_ERRORS"].samples if s.labels["gpu"] == "0"]
    assert after.value == 79 and after.labels["err_msg"] == "GPU has fallen off the bus"

def test_each_architecture_exports_what_it_can_give():
    core, _ = _core({"gpus_per_node": 4, "models": ["H100", "A100", "T4", "L4"]})
    families = _families(_text(core))
    models = {s.labels["gpu"]: s.labels["modelName"] for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    for name in GPM_ONLY:  # NVML GPM: Hopper and newer only
        assert {models[s.labels["gpu"]] for s in families[name].samples} <= {"NVIDIA H100 80GB HBM3"}, name
    assert {s.labels["gpu"] for s in families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples} == {"0"}
    # PCIe throughput: GPM on Hopper, nvmlDeviceGetPcieThroughput elsewhere; exported on every GPU.
    for name in ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"):
        assert {s.labels["gpu"] for s in families[name].samples} == {"0", "1", "2", "3"}
        assert all(s.value > 0 for s in families[name].samples)
    # NVLink bandwidth only where there is NVLink (not T4, L4).
    assert {s.labels["gpu"] for s in families["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].samples} == {"0", "1"}

# The names, units and types each schema writes, as read from the sources gpuaware/contract/dcgm.py cites
# (dcgm-exporter 4.9.0 and 4.10.0 release notes; DCGM 4.6.x dcgm_fields.h deprecated-name block and go-dcgm's
# base-unit pairs): legacy name -> (4.9.0 name, 4.9 unit in the help text, legacy value * scale = 4.9 value).
# Every family not here keeps its legacy name, unit and value under dcgm-4.9 (UNCONFIRMED_49 says why).
SOURCE_49 = {
    "DCGM_FI_DEV_SM_CLOCK": ("DCGM_FI_DEV_SM_CLOCK_HERTZ", "Hz", 1e6),
    "DCGM_FI_DEV_MEM_CLOCK": ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "Hz", 1e6),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", "J", 1e-3),
    "DCGM_FI_DEV_GPU_UTIL": ("DCGM_FI_DEV_GPU_UTIL_RATIO", "ratio 0-1", 0.01),
    "DCGM_FI_DEV_GPU_TEMP": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "C", 1.0),
    "DCGM_FI_DEV_MEMORY_TEMP": ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "C", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("DCGM_FI_DEV_BOARD_POWER_WATTS", "W", 1.0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("DCGM_FI_DEV_XID_ERROR", "", 1.0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", "", 1.0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", "", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("DCGM_FI_DEV_ROW_REMAP_FAILED", "", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", "", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("DCGM_FI_PROF_DRAM_UTIL_RATIO", "", 1.0),
}
SOURCE_410 = {"DCGM_FI_PROF_PCIE_TX_BYTES": "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND",
              "DCGM_FI_PROF_PCIE_RX_BYTES": "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND"}
SOURCE_DRIVER_LABEL = {"dcgm-legacy": "DCGM_FI_DRIVER_VERSION", "dcgm-4.9": "DCGM_FI_SYSTEM_DRIVER_VERSION",
                       "dcgm-4.10": "DCGM_FI_SYSTEM_DRIVER_VERSION"}


def _source_names(schema: str) -> dict[str, str]:
    renamed = {} if schema == "dcgm-legacy" else {old: new for old, (new, _, _) in SOURCE_49.items()}
    if schema == "dcgm-4.10":
        renamed |= SOURCE_410
    return {n: renamed.get(n, n) for n in FAMILIES}


def test_the_contract_renames_exactly_the_source_table_and_says_why_it_keeps_the_rest():
    assert RENAMED["dcgm-4.9"] == {old: new for old, (new, _, _) in SOURCE_49.items()}
    assert RENAMED["dcgm-4.10"] == RENAMED["dcgm-4.9"] | SOURCE_410
    assert set(UNCONFIRMED_49) == set(FAMILIES) - set(SOURCE_49)
    # Base units only where 4.9.0 renames with a new unit; a kept legacy name keeps its legacy unit.
    assert {n for n, f in FAMILIES.items() if f.base_unit} == {n for n, (_, _, k) in SOURCE_49.items() if k != 1.0}


@pytest.mark.parametrize("schema", SCHEMAS)
def test_metrics_under_each_schema_have_exactly_the_source_names_units_and_driver_label(schema):
    core, _ = _core({"gpus_per_node": 2, "models": ["H100"]})  # H100: GPM and NVLink, so every family has samples
    legacy, text = _families(_text(core)), _text(core, schema=schema)
    got = _families(text)
    names = _source_names(schema)
    assert set(re.findall(r"^# TYPE (DCGM_\w+) ", text, re.M)) == set(names.values())
    for old, new in names.items():
        assert f"# TYPE {new} {FAMILIES[old].type}" in text, new
        unit = SOURCE_49[old][1] if schema != "dcgm-legacy" and old in SOURCE_49 else FAMILIES[old].unit
        assert re.search(rf"^# HELP {new} .*{re.escape(f'(in {unit}).') if unit else ''}$", text, re.M), (new, unit)
        scale = SOURCE_49[old][2] if schema != "dcgm-legacy" and old in SOURCE_49 else 1.0
        old_values = {s.labels["gpu"]: s.value for s in legacy[old].samples if not s.labels.get("pod")}
        new_values = {s.labels["gpu"]: s.value for s in got[new].samples if not s.labels.get("pod")}
        assert new_values == pytest.approx({g: v * scale for g, v in old_values.items()}), new
    labels = got[names["DCGM_FI_DEV_GPU_UTIL"]].samples[0].labels
    assert SOURCE_DRIVER_LABEL[schema] in labels
    assert not {"driver_version", *SOURCE_DRIVER_LABEL.values()} - {SOURCE_DRIVER_LABEL[schema]} & set(labels)
    assert ("Hostname" if schema == "dcgm-legacy" else "hostname") in labels


def test_dcgm_49_schema_uses_base_units_and_its_label_names():
    core, _ = _core({"gpus_per_node": 2})
    base = _families(_text(core, schema="dcgm-4.9"))
    labels = base["DCGM_FI_DEV_GPU_UTIL_RATIO"].samples[0].labels
    assert "hostname" in labels and "DCGM_FI_SYSTEM_DRIVER_VERSION" in labels
    assert "Hostname" not in labels and "DCGM_FI_DRIVER_VERSION" not in labels and "driver_version" not in labels
    assert "hostname" in base["gpuaware_gpu_health_score"].samples[0].labels
    text = _text(core, schema="dcgm-4.9")
    assert "(in ratio 0-1)" in re.search(r"# HELP DCGM_FI_DEV_GPU_UTIL_RATIO (.*)", text)[1]
    assert "(in MiB)" in re.search(r"# HELP DCGM_FI_DEV_FB_USED (.*)", text)[1]  # unconfirmed: legacy name, unit
    assert "# TYPE DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL counter" in text


def test_dcgm_410_schema_writes_pcie_throughput_per_second_as_gauges_in_bytes():
    core, _ = _core({"gpus_per_node": 2, "models": ["H100", "A100"]})
    text49, text410 = _text(core, schema="dcgm-4.9"), _text(core, schema="dcgm-4.10")
    v49, v410 = _families(text49), _families(text410)
    for old in ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"):
        new = old + "_PER_SECOND"
        assert f"# TYPE {new} gauge" in text410 and re.search(rf"^# HELP {new} .*\(in bytes/s\)\.$", text410, re.M)
        assert not re.search(rf"^{old}[{{ ]", text410, re.M) and old not in v410
        assert [(s.labels, s.value) for s in v410[new].samples] == [(s.labels, s.value) for s in v49[old].samples]
        assert {s.labels["gpu"] for s in v410[new].samples} == {"0", "1"}  # GPM on H100, the slow way on A100
    # Everything else is 4.9's: the same families, labels and values.
    renamed = {"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"}
    assert {n: [(s.labels, s.value) for s in f.samples] for n, f in v49.items() if n not in renamed} == \
        {n: [(s.labels, s.value) for s in f.samples] for n, f in v410.items() if not n.endswith("_PER_SECOND")}
    prefixed = _text(core, schema="dcgm-4.10", prefixed=True)
    assert "# TYPE gpuaware_dcgm_fi_prof_pcie_tx_bytes_per_second gauge" in prefixed
    assert "gpuaware_dcgm_fi_prof_pcie_tx_bytes{" not in prefixed


def test_beside_dcgm_exporter_every_dcgm_family_gets_the_gpuaware_prefix():
    core, _ = _core({"gpus_per_node": 1})
    text = _text(core, prefixed=True)
    assert "DCGM_FI_DEV" not in text.replace("DCGM_FI_DRIVER_VERSION", "")
    families = _families(text)
    assert families["gpuaware_dcgm_fi_dev_gpu_util"].samples
    assert "# TYPE gpuaware_dcgm_fi_dev_total_energy_consumption counter" in text

def test_mig_instances_get_their_own_series_with_gpu_instance_labels():
    core, _ = _core({"gpus_per_node": 2, "models": ["A100"], "mig": {0: ["3g.40gb", "3g.40gb"]}})
    fb = _families(_text(core))["DCGM_FI_DEV_FB_USED"].samples
    mig = sorted((s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"]) for s in fb if s.labels.get("GPU_I_ID"))
    assert mig == [("1", "3g.40gb"), ("2", "3g.40gb")]
    assert all(s.labels["gpu"] == "0" for s in fb if s.labels.get("GPU_I_ID"))
    assert len([s for s in fb if not s.labels.get("GPU_I_ID")]) == 2  # one device series per GPU still

def test_a_shared_gpu_is_attributed_per_pod_not_copied_to_every_pod():
    core, cluster = _core({"gpus_per_node": 2, "workloads": ["training-compute"], "shared": {1: 3}})
    families = _families(_text(core, pods=cluster.attribution()))
    util = [s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples if s.labels["gpu"] == "1"]
    device = [s for s in util if not s.labels.get("pod")]
    pods = [s for s in util if s.labels.get("pod")]
    assert len(device) == 1 and len(pods) == 3
    assert len({s.labels["pod_uid"] for s in pods}) == 3
    # Per-process utilisation comes with the last full sample; the device series may be a newer watch read.
    sample = next(t.last_sample for t in core.tracks if t.device.index == 1)
    assert sum(s.value for s in pods) == pytest.approx(sample.util_gpu, abs=0.5)
    assert len({s.value for s in pods}) == 3  # each pod its own share, not the device value copied
    fb = [s for s in families["DCGM_FI_DEV_FB_USED"].samples if s.labels["gpu"] == "1" and s.labels.get("pod")]
    assert len(fb) == 3
    power = [s for s in families["DCGM_FI_DEV_POWER_USAGE"].samples if s.labels["gpu"] == "1"]
    assert len(power) == 1 and not power[0].labels.get("pod")


# 41 Kubernetes labels on every pod: more than any budget leaves room for.
MANY = (("app.kubernetes.io/name", "trainer"), *((f"team.example.com/k{i}", f"v{i}") for i in range(40)))


class _Labelled:
    """The simulator's pods, each carrying MANY."""

    def __init__(self, inner):
        self.inner = inner

    def pods(self, uuid):
        return [dataclasses.replace(p, labels=MANY) for p in self.inner.pods(uuid)]

    def uid_of_pid(self, pid):
        return self.inner.uid_of_pid(pid)


@pytest.mark.parametrize("budget", [MIN_LABEL_BUDGET, 30])
def test_no_series_exceeds_the_label_budget_and_only_allowlisted_pod_labels_appear(budget):
    # GPU 0: one pod, two MIG instances; GPU 1: three pods sharing it (per-pod series); GPU 2: no pod.
    core, cluster = _core({"gpus_per_node": 3, "models": ["A100"], "shared": {0: 1, 1: 3},
                           "mig": {0: ["3g.40gb", "3g.40gb"]}})
    pods = _Labelled(cluster.attribution())
    allow = ["app.kubernetes.io/name", *(k for k, _ in MANY[1:25]), "not.on/any-pod"]
    families = _families(_text(core, pods=pods, label_budget=budget, pod_labels=allow))
    samples = [s for f in families.values() for s in f.samples]
    assert max(len(s.labels) for s in samples) == budget  # filled to the budget, never past it
    added = {k for s in samples for k in s.labels if k.startswith("label_")}
    assert added and added <= {pod_label_name(k) for k in allow}
    owner = [s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples if s.labels["gpu"] == "0"]
    assert owner and all(s.labels["label_app_kubernetes_io_name"] == "trainer" for s in owner)  # the list's first
    shared = [s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples if s.labels["gpu"] == "1"]
    assert all(("label_app_kubernetes_io_name" in s.labels) == bool(s.labels.get("pod")) for s in shared)
    assert not [s for s in samples if s.labels.get("gpu") == "2" and "label_app_kubernetes_io_name" in s.labels]
    xid = [s for s in families["DCGM_FI_DEV_XID_ERRORS"].samples if s.labels["gpu"] == "0"]
    assert xid[0].labels["err_msg"] == "No Error"  # the agent's own labels are never the ones dropped
    # Default: no pod label becomes a metric label, however many the pods carry.
    assert AgentSettings().metrics_pod_labels == [] and AgentSettings().metrics_label_budget == 30
    # What the scrape adds counts where the limit applies: 30 stored labels leave 21 on /metrics.
    assert AgentSettings().metrics_labels_on_page == 21
    assert "label_" not in _text(core, pods=pods)


@pytest.mark.parametrize(("key", "value", "said"), [
    ("metrics_label_budget", "10", f"10 less the 9 labels the scrape adds (metrics_scrape_labels) is fewer than the "
                                   f"{MIN_LABEL_BUDGET} labels the agent itself may put"),
    ("metrics_label_budget", "23", "give at least 24"),
    ("metrics_pod_labels", "app,bad key!", "'bad key!' is not a Kubernetes label key"),
    ("metrics_pod_labels", "a.b, a-b", "names one metric label twice"),
])
def test_a_budget_below_the_agents_own_labels_or_a_bad_pod_label_is_refused(key, value, said):
    with pytest.raises(ConfigError) as err:
        load_config(None, environ={f"GPUAWARE_AGENT__{key.upper()}": value})
    ((where, reason, _),) = err.value.problems
    assert where == f"agent.{key}" and said in reason, reason
    assert load_config(None, environ={"GPUAWARE_AGENT__METRICS_POD_LABELS": "app, app.kubernetes.io/name"}
                       ).agent.metrics_pod_labels == ["app", "app.kubernetes.io/name"]


def test_the_agent_serves_its_budget_less_what_the_scrape_adds(tmp_path):
    from gpuaware.agent.main import metrics_collector
    from gpuaware.agent.runtime import AgentRuntime
    from gpuaware.agent.sampling import SamplingPolicy
    from gpuaware.plumbing.kafka_settings import KafkaSettings

    runtime = AgentRuntime([], KafkaSettings(), SamplingPolicy(), tmp_path / "spool")
    assert metrics_collector(runtime, None, AgentSettings()).dcgm.budget == 21
    assert metrics_collector(runtime, None, AgentSettings(metrics_label_budget=40, metrics_scrape_labels=5)
                             ).dcgm.budget == 35
