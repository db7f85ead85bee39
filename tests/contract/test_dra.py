"""The DRA contract: slices built as NVIDIA's driver shapes them, NVIDIA's own slices read as they are, and
malformed slices refused with the field and the reason (hypothesis)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaware.contract import dra
from tests.contract.nvidia_slices import a100_static_mig_node, h100_node

A100_PARTS = [dra.MigPartition("1g.10gb", 19, p, 1, 9856 * 2**20, 14) for p in range(7)] + \
    [dra.MigPartition("7g.80gb", 0, 0, 8, 79 * 2**30, 98, copy_engines=7, decoders=5, jpeg_engines=1, ofa_engines=1)]
KW = {"product_name": "NVIDIA A100-SXM4-80GB", "architecture": "Ampere", "cuda_compute_capability": "8.0",
      "driver_version": "550.54.15", "cuda_driver_version": "12.4"}


def test_names_are_nvidias():
    assert dra.gpu_device_name(3) == "gpu-3"
    assert dra.mig_device_name(1, "1g.10gb", 19, 6) == "gpu-1-mig-1g10gb-19-6"
    assert dra.mig_device_name(0, "1g.10gb+me", 20, 0) == "gpu-0-mig-1g10gb-me-20-0"
    assert dra.counter_set_name(2) == "gpu-2-counter-set"
    assert dra.semver("8.0") == "8.0.0" and dra.semver("550.54.15") == "550.54.15"
    with pytest.raises(ValueError, match="not MAJOR"):
        dra.semver("12.x")


def test_a_built_gpu_reads_back_as_built():
    dev = dra.gpu_device(2, uuid="GPU-2", memory_bytes=80 * 2**30, nvlink_island=1, index=2, **KW)
    view = dra.parse_slice(dra.resource_slice("n", [dev])).devices[0]
    assert (view.name, view.type, view.minor, view.uuid, view.memory_bytes, view.nvlink_island, view.index) == \
        ("gpu-2", "gpu", 2, "GPU-2", 80 * 2**30, 1, 2)
    assert view.attributes["cudaComputeCapability"] == "8.0.0"
    assert view.schedulable and not view.consumes_counters


def test_partitions_and_their_gpu_consume_one_counter_set():
    gpu = dra.gpu_device(0, uuid="GPU-0", memory_bytes=80 * 2**30, partitions=A100_PARTS, **KW)
    migs = [dra.mig_device(0, p, parent_uuid="GPU-0", **KW) for p in A100_PARTS]
    counters = dra.resource_slice("n", shared_counters=[dra.gpu_counter_set(0, 80 * 2**30, A100_PARTS)],
                                  slice_count=2)
    devices = dra.parse_slice(dra.resource_slice("n", [gpu, *migs], slice_count=2)).devices
    shared = dra.parse_slice(counters).shared_counters["gpu-0-counter-set"]
    # The whole GPU uses everything; each partition fits, and the seven 1g partitions fill the memory slices.
    assert devices[0].consumes_counters["gpu-0-counter-set"] == shared
    for d in devices[1:]:
        used = d.consumes_counters["gpu-0-counter-set"]
        assert all(used[k] <= shared[k] for k in used)
    ones = [d for d in devices if d.profile == "1g.10gb"]
    assert sum(d.consumes_counters["gpu-0-counter-set"].get("memory-slice-3", 0) for d in ones) == 1
    with pytest.raises(ValueError, match="not both"):
        dra.resource_slice("n", [gpu], shared_counters=[dra.gpu_counter_set(0, 1, A100_PARTS)])


def test_nvidias_slices_are_read_as_they_are():
    h100 = dra.parse_slice(h100_node())
    assert [d.minor for d in h100.devices] == list(range(8))
    assert {d.memory_bytes for d in h100.devices} == {81559 * 2**20}
    assert h100.devices[0].product_name == "NVIDIA H100 80GB HBM3"
    assert h100.devices[0].attributes[dra.ATTR_PCI_BUS_ID] == "0000:18:00.0"
    mig = dra.parse_slice(a100_static_mig_node())
    assert [(d.type, d.minor, d.profile) for d in mig.devices] == \
        [("gpu", 0, None), ("mig", 1, "3g.40gb"), ("mig", 1, "2g.20gb"), ("mig", 1, "2g.20gb")]
    assert mig.devices[1].parent_uuid == "GPU-a100-1" and mig.devices[1].capacity["memorySlice3"] == 1
    assert mig.generation == 3


def test_taints_and_other_drivers():
    taint = dra.device_taint(value="critical")
    dev = dra.gpu_device(0, uuid="GPU-0", memory_bytes=1, taints=[taint], **KW)
    view = dra.parse_slice(dra.resource_slice("n", [dev])).devices[0]
    assert view.taints == (dra.Taint(dra.TAINT_UNHEALTHY, "critical", "NoSchedule"),) and not view.schedulable
    none = dra.parse_slice(dra.resource_slice("n", [dra.gpu_device(0, uuid="u", memory_bytes=1, taints=[
        dra.device_taint(dra.TAINT_UNMONITORED, effect="None")], **KW)])).devices[0]
    assert none.schedulable
    with pytest.raises(ValueError, match="effect"):
        dra.device_taint(effect="Later")
    other = dra.parse_slice(dra.resource_slice("n", [{"name": "nic-0", "attributes": {"speed": {"int": 400}}}],
                                               driver="rdma.example.com"))
    assert other.devices[0].type == "" and other.devices[0].attributes["speed"] == 400


def test_pool_devices_keep_the_newest_generation():
    old = dra.parse_slice(dra.resource_slice("n", [dra.gpu_device(0, uuid="a", memory_bytes=1, **KW)], generation=1))
    new = dra.parse_slice(dra.resource_slice("n", [dra.gpu_device(1, uuid="b", memory_bytes=1, **KW)], generation=2))
    assert [d.uuid for d in dra.pool_devices([old, new])[(dra.DRIVER, "n")]] == ["b"]


def _with(obj: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    at = out
    for key in path[:-1]:
        at = at[key]
    if value is _DELETE:
        del at[path[-1]]
    else:
        at[path[-1]] = value
    return out


_DELETE = object()
BROKEN = [
    (["spec", "driver"], _DELETE, "spec.driver", "required"),
    (["spec", "driver"], "Not_A_Domain", "spec.driver", "DNS subdomain"),
    (["spec", "pool", "generation"], "1", "spec.pool.generation", "must be int"),
    (["spec", "pool", "resourceSliceCount"], 0, "spec.pool.resourceSliceCount", "at least 1"),
    (["spec", "nodeName"], _DELETE, "spec", "exactly one of nodeName"),
    (["spec", "devices", 0, "name"], "GPU_0", "spec.devices[0].name", "DNS label"),
    (["spec", "devices", 1, "name"], "gpu-0", "spec.devices[1].name", "listed twice"),
    (["spec", "devices", 0, "attributes", "type"], _DELETE, "spec.devices[0].attributes.type", "required"),
    (["spec", "devices", 0, "attributes", "uuid"], {"string": "a", "int": 1}, "spec.devices[0].attributes.uuid",
     "exactly one"),
    (["spec", "devices", 0, "attributes", "cudaComputeCapability"], {"version": "9.0"},
     "spec.devices[0].attributes.cudaComputeCapability.version", "semantic version"),
    (["spec", "devices", 0, "capacity", "memory"], {"value": "80 GB"}, "spec.devices[0].capacity.memory.value",
     "quantity"),
    (["spec", "devices", 0, "capacity", "memory"], {"value": "-1Gi"}, "spec.devices[0].capacity.memory.value",
     "negative"),
    (["spec", "devices", 0, "capacity"], {}, "spec.devices[0].capacity.memory", "required"),
    (["spec", "devices", 0, "name"], "gpu-x", "spec.devices[0].name", "gpu-<minor>"),
    (["spec", "devices", 0, "taints"], [{"key": "a", "effect": "Sometimes"}], "spec.devices[0].taints[0].effect",
     "not one of"),
    (["spec", "sharedCounters"], [{"name": "c", "counters": {"m": {"value": "1"}}}], "spec", "only one of"),
    (["apiVersion"], "resource.k8s.io/v1beta1", "apiVersion", "only resource.k8s.io/v1"),
]


@pytest.mark.parametrize(("path", "value", "field", "reason"), BROKEN, ids=[b[2] + ":" + b[3] for b in BROKEN])
def test_a_malformed_slice_is_refused_with_field_and_reason(path, value, field, reason):
    with pytest.raises(dra.SliceInvalid) as err:
        dra.parse_slice(_with(h100_node(), path, value))
    assert err.value.field == field
    assert reason in err.value.reason


def test_a_mig_device_without_its_parent_is_refused():
    broken = _with(a100_static_mig_node(), ["spec", "devices", 1, "attributes", "parentUUID"], _DELETE)
    with pytest.raises(dra.SliceInvalid, match=r"spec.devices\[1\].attributes.parentUUID: required"):
        dra.parse_slice(broken)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3), max_leaves=8)
_PATHS = [["spec"], ["spec", "pool"], ["spec", "devices"], ["spec", "devices", 0], ["spec", "devices", 0, "attributes"],
          ["spec", "devices", 0, "attributes", "uuid"], ["spec", "devices", 0, "capacity"],
          ["spec", "devices", 0, "capacity", "memory"], ["spec", "devices", 0, "taints"], ["metadata"],
          ["spec", "nodeName"], ["spec", "devices", 0, "consumesCounters"]]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_PATHS), _JSON)
def test_any_corruption_is_read_or_refused_with_a_field(path, junk):
    """Whatever lands anywhere in a slice, the parser answers a SliceView or SliceInvalid, never another error."""
    try:
        dra.parse_slice(_with(h100_node(), path, junk))
    except dra.SliceInvalid as err:
        assert err.reason
        assert str(err).startswith(f"{err.field}: ")


def test_taint_rules_are_read_and_matched():
    rule = dra.parse_taint_rule({"metadata": {"name": "r"}, "spec": {
        "deviceSelector": {"driver": dra.DRIVER, "pool": "n1"},
        "taint": {"key": dra.TAINT_UNHEALTHY, "value": "critical", "effect": "NoSchedule"}}})
    assert rule.applies(dra.DRIVER, "n1", "gpu-3") and not rule.applies(dra.DRIVER, "n2", "gpu-3")
    assert rule.taint == dra.Taint(dra.TAINT_UNHEALTHY, "critical", "NoSchedule")
    with pytest.raises(dra.SliceInvalid, match=r"^spec.taint.effect: 'Soon' is not one of"):
        dra.parse_taint_rule({"metadata": {"name": "r"}, "spec": {"taint": {"key": "k", "effect": "Soon"}}})
    with pytest.raises(dra.SliceInvalid, match=r"spec\.deviceSelector\.pool: must be a non-empty string"):
        dra.parse_taint_rule({"metadata": {"name": "r"}, "spec": {"deviceSelector": {"pool": 3},
                                                                  "taint": {"key": "k", "effect": "None"}}})


def test_a_pool_with_slices_missing_is_incomplete():
    dev = dra.gpu_device(0, uuid="a", memory_bytes=1, **KW)
    one_of_two = dra.parse_slice(dra.resource_slice("n", [dev], generation=2, slice_count=2))
    older = dra.parse_slice(dra.resource_slice("n", [dev], generation=1, slice_count=1, name="old"))
    assert dra.incomplete_pools([older, one_of_two]) == {(dra.DRIVER, "n")}
    other = dra.parse_slice(dra.resource_slice("n", shared_counters=[dra.gpu_counter_set(0, 1, A100_PARTS)],
                                               generation=2, slice_count=2))
    assert dra.incomplete_pools([older, one_of_two, other]) == set()


def test_a_shareable_gpu_allows_multiple_allocations_and_reads_back_so():
    d = dra.gpu_device(0, uuid="GPU-s-0", product_name="NVIDIA H100 80GB HBM3", memory_bytes=80 * 2**30,
                       shareable=True)
    assert d["allowMultipleAllocations"] is True
    (view,) = dra.parse_slice(dra.resource_slice("s", [d])).devices
    assert view.shareable
    with pytest.raises(ValueError, match="shareable"):
        dra.gpu_device(0, uuid="GPU-s-0", product_name="NVIDIA A100-SXM4-80GB", memory_bytes=80 * 2**30,
                       shareable=True, partitions=(dra.MigPartition("1g.10gb", 19, 0, 1, 9856 * 2**20, 14),))
    bad = dra.resource_slice("s", [dict(d, allowMultipleAllocations="yes")])
    with pytest.raises(dra.SliceInvalid, match="allowMultipleAllocations"):
        dra.parse_slice(bad)


@pytest.mark.parametrize(("raw", "field", "reason"), [
    ({}, "t", "must be a list"),
    ([{"operator": "Exists"}] * 17, "t", "more than 16 tolerations"),
    (["x"], "t[0]", "must be an object"),
    ([{"key": "gpu.nvidia.com/xid", "effect": "NoEvict"}], "t[0].effect", "'NoEvict' is not one of"),
    ([{"key": "bad key!", "operator": "Exists"}], "t[0].key", "is not a C identifier"),
    ([{"key": 7, "operator": "Exists"}], "t[0].key", "must be a string"),
])
def test_request_tolerations_are_read_or_refused_with_the_field_and_reason(raw, field, reason):
    with pytest.raises(dra.SliceInvalid) as info:
        dra.parse_tolerations(raw, "t")
    assert info.value.field == field and reason in info.value.reason


def test_a_toleration_follows_kubernetes_rule_for_keys_values_and_effects():
    xid = dra.Taint("gpu.nvidia.com/xid", "79", "NoExecute")
    (anything,) = dra.parse_tolerations([{"operator": "Exists"}], "t")
    (key_only,) = dra.parse_tolerations([{"key": "gpu.nvidia.com/xid", "operator": "Exists"}], "t")
    (other_value,) = dra.parse_tolerations([{"key": "gpu.nvidia.com/xid", "value": "48"}], "t")
    (other_effect,) = dra.parse_tolerations([{"operator": "Exists", "effect": "NoSchedule"}], "t")
    assert anything.tolerates(xid) and key_only.tolerates(xid)
    assert not other_value.tolerates(xid) and not other_effect.tolerates(xid)
    assert dra.tolerated([key_only], [xid]) and not dra.tolerated([key_only], [xid, dra.Taint("a/b", "", "NoSchedule")])
    assert dra.tolerated([], [])  # nothing to tolerate
