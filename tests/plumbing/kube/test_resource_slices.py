"""The ResourceSlice publisher and the DRA contract on a real kube-apiserver (1.36, default feature gates).

Whole GPUs and MIG partitions (partitionable devices) as the apiserver accepts them, NVIDIA-shaped slices
accepted and read as they are, publishing idempotent with generation bumps, another publisher's slices left
alone, and what the apiserver refuses refused by the contract first. Skipped when the control plane is not
built, failed under ``CI=true``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from kubernetes import config
from kubernetes.client.exceptions import ApiException

from gpuaware.contract import dra
from gpuaware.local.kube_control_plane import KWOK_NODE_ANNOTATION, BinariesMissing, KubeControlPlane, find_binaries
from gpuaware.plumbing.kube.resource_slices import NodeGpu, SlicePublisher, node_slices
from tests.contract.nvidia_slices import a100_static_mig_node, h100_node
from tests.support import REPO, need

A100_PARTS = tuple([dra.MigPartition("1g.10gb", 19, p, 1, 9856 * 2**20, 14) for p in range(7)]
                   + [dra.MigPartition("3g.40gb", 9, p, 4, 40192 * 2**20, 42, 3, 2) for p in (0, 4)]
                   + [dra.MigPartition("7g.80gb", 0, 0, 8, 79 * 2**30, 98, 7, 5, 0, 1, 1)])


def a100s(n: int, partitions: bool = True) -> list[NodeGpu]:
    return [NodeGpu(i, f"GPU-a100-{i}", "NVIDIA A100-SXM4-80GB", 80 * 2**30, nvlink_island=i // 4,
                    architecture="Ampere", cuda_compute_capability="8.0", driver_version="550.54.15",
                    cuda_driver_version="12.4", partitions=A100_PARTS if partitions else ()) for i in range(n)]


@pytest.fixture(scope="module")
def cp() -> Iterator[KubeControlPlane]:
    need(find_binaries, BinariesMissing)
    with KubeControlPlane(scheduler=False, kwok=False) as plane:
        yield plane


@pytest.fixture(scope="module")
def publisher(cp) -> SlicePublisher:
    return SlicePublisher(config.new_client_from_config(str(cp.kubeconfig)))


def stored(publisher: SlicePublisher, node: str) -> list[dra.SliceView]:
    return [dra.parse_slice(s) for s in publisher.current(node)]


def test_whole_gpus_and_mig_partitions_are_accepted_and_read_back(publisher):
    # 16 GPUs x 11 placements: devices spread over 64-device slices, counter sets over 8-set slices.
    result = publisher.publish("a100-16", a100s(16))
    views = stored(publisher, "a100-16")
    assert result.written == len(views) == 5 and {v.slice_count for v in views} == {5}  # 3 + 2
    devices = dra.pool_devices(views)[(dra.DRIVER, "a100-16")]
    assert len(devices) == 16 * (1 + len(A100_PARTS))
    whole = [d for d in devices if d.type == dra.TYPE_GPU]
    assert [(d.minor, d.index, d.nvlink_island, d.memory_bytes) for d in whole][:5:4] == \
        [(0, 0, 0, 80 * 2**30), (4, 4, 1, 80 * 2**30)]
    counters = {name for v in views for name in v.shared_counters}
    assert {cs for d in devices for cs in d.consumes_counters} == counters
    assert counters == {f"gpu-{i}-counter-set" for i in range(16)}
    # Without partitions: one slice, no counters.
    publisher.publish("h100-plain", a100s(8, partitions=False))
    (plain,) = stored(publisher, "h100-plain")
    assert len(plain.devices) == 8 and not plain.shared_counters and not plain.devices[0].consumes_counters


def test_publishing_is_idempotent_and_bumps_the_generation_on_change(publisher):
    first = publisher.publish("n-idem", a100s(2))
    again = publisher.publish("n-idem", a100s(2))
    assert first.changed and not again.changed and again.generation == first.generation
    fewer = publisher.publish("n-idem", a100s(1, partitions=False))
    views = stored(publisher, "n-idem")
    assert fewer.generation == first.generation + 1 and fewer.deleted == 1
    assert {v.generation for v in views} == {fewer.generation} and len(views) == 1
    tainted = a100s(1, partitions=False)
    tainted[0] = NodeGpu(**{**tainted[0].__dict__, "taints": (dra.device_taint(value="critical"),)})
    assert publisher.publish("n-idem", tainted).changed
    assert not publisher.publish("n-idem", tainted).changed  # the apiserver's timeAdded is no change
    assert not stored(publisher, "n-idem")[0].devices[0].schedulable
    assert publisher.withdraw("n-idem") == 1 and publisher.current("n-idem") == []


def test_nvidias_slices_are_accepted_as_they_are_and_left_alone(cp, publisher):
    custom = publisher.custom
    for obj in (h100_node("nv-h100"), a100_static_mig_node("nv-a100")):
        body = json.loads(json.dumps(obj))
        body["metadata"].pop("generateName", None)
        custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)
        got = custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body["metadata"]["name"])
        assert dra.parse_slice(got).devices == dra.parse_slice(obj).devices
    # gpuaware's publisher sees none of them and deletes none of them.
    assert publisher.current("nv-h100") == []
    publisher.withdraw("nv-h100")
    assert custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", "nv-h100-gpu.nvidia.com-x7k2p")


REFUSED = [
    # (what, how to break a valid slice, the apiserver's words, the contract's field)
    ("devices and counters in one slice",
     lambda s: s["spec"].update(sharedCounters=[dra.gpu_counter_set(0, 80 * 2**30, A100_PARTS)]),
     "only one of `sharedCounters` or `devices` is allowed", "spec"),
    ("65 devices consuming counters",
     lambda s: s["spec"].update(devices=[dict(s["spec"]["devices"][1], name=f"gpu-0-mig-1g10gb-19-{i}")
                                         for i in range(65)]),
     "must have at most 64 items", "spec.devices"),
    ("a device name that is no DNS label", lambda s: s["spec"]["devices"][0].update(name="GPU_0"),
     "spec.devices[0].name", "spec.devices[0].name"),
    ("an attribute with two values",
     lambda s: s["spec"]["devices"][0]["attributes"].update(uuid={"string": "a", "int": 1}),
     "exactly one value must be specified", "spec.devices[0].attributes.uuid"),
    ("a taint with an unknown effect",
     lambda s: s["spec"]["devices"][0].update(taints=[{"key": "a", "effect": "Later"}]),
     "Unsupported value", "spec.devices[0].taints[0].effect"),
]


@pytest.mark.parametrize(("what", "breaks", "apiserver_says", "field"), REFUSED, ids=[r[0] for r in REFUSED])
def test_what_the_apiserver_refuses_the_parser_refuses(publisher, what, breaks, apiserver_says, field):
    (body,) = [s for s in node_slices("refused", a100s(1), 1) if s["spec"].get("devices")]
    breaks(body)
    with pytest.raises(dra.SliceInvalid) as err:
        dra.parse_slice(body)
    assert err.value.field == field
    with pytest.raises(ApiException) as refused:
        publisher.custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)
    assert refused.value.status == 422
    assert apiserver_says in json.loads(refused.value.body)["message"]


def test_bad_gpus_are_refused_with_the_field():
    with pytest.raises(ValueError, match="memory_bytes: 0 is not positive"):
        NodeGpu(0, "GPU-0", "A100", 0)
    with pytest.raises(ValueError, match="uuid: required"):
        NodeGpu(0, "", "A100", 1)


# ----------------------------------------------------------------------------- kube-scheduler on these slices
@pytest.fixture(scope="module")
def scheduling_cp() -> Iterator[KubeControlPlane]:
    need(find_binaries, BinariesMissing)
    with KubeControlPlane(scheduler=True, kwok=True) as plane:
        plane.kubectl("apply", "-f", str(REPO / "deploy/components/dra-deviceclasses/deviceclasses.yaml"))
        yield plane


def _claimed_pod(cp: KubeControlPlane, name: str, device_class: str, cel: str | None = None) -> None:
    exactly: dict = {"deviceClassName": device_class}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    cp.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": name, "namespace": "default"},
              "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}}})
    cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
              "spec": {"tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                       "resourceClaims": [{"name": "r", "resourceClaimName": name}],
                       "containers": [{"name": "c", "image": "registry.invalid/x:1",
                                       "resources": {"claims": [{"name": "r"}]}}]}})


def _pod_state(cp: KubeControlPlane, name: str) -> str:
    pod = json.loads(cp.kubectl("get", "pod", name, "-n", "default", "-o", "json").stdout)
    if pod["spec"].get("nodeName"):
        return "placed"
    conds = pod.get("status", {}).get("conditions") or []
    return "unschedulable" if any(c.get("reason") == "Unschedulable" for c in conds) else "pending"


def _until(cond, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.2)


def test_kube_scheduler_honours_the_partitions_counters(scheduling_cp):
    """A MIG partition allocated from the published counters leaves the whole GPU unallocatable: the shape
    the publisher writes is the one kube-scheduler's allocator understands."""
    cp = scheduling_cp
    cp.apply({"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": "kw-mig", "annotations": dict([KWOK_NODE_ANNOTATION])},
              "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                         "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}}})
    SlicePublisher(config.new_client_from_config(str(cp.kubeconfig))).publish("kw-mig", a100s(1))
    _claimed_pod(cp, "one-mig", dra.DEVICE_CLASS_MIG, "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'")
    _until(lambda: _pod_state(cp, "one-mig") == "placed", "the MIG claim allocated")
    _claimed_pod(cp, "whole-gpu", dra.DEVICE_CLASS_GPU)
    _until(lambda: _pod_state(cp, "whole-gpu") == "unschedulable", "the whole GPU refused: a partition holds it")
    _claimed_pod(cp, "another-mig", dra.DEVICE_CLASS_MIG, "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'")
    _until(lambda: _pod_state(cp, "another-mig") == "placed", "a second 1g partition beside the first")
    got = {json.loads(cp.kubectl("get", "resourceclaim", n, "-n", "default", "-o", "json").stdout)
           ["status"]["allocation"]["devices"]["results"][0]["device"] for n in ("one-mig", "another-mig")}
    assert len(got) == 2 and all(d.startswith("gpu-0-mig-1g10gb-19-") for d in got)


def test_the_examples_nvlink_claim_gets_two_gpus_of_one_island(scheduling_cp):
    """deploy/examples/dra: "two GPUs with >= 80 GiB on one NVLink island" against gpuaware's attribute. GPU 0
    is alone on island 0, GPUs 1 and 2 share island 1: first fit (gpu-0, gpu-1) would break the constraint."""
    import yaml

    cp = scheduling_cp
    cp.apply({"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": "kw-link", "annotations": dict([KWOK_NODE_ANNOTATION]),
                           "labels": {"kubernetes.io/hostname": "kw-link"}},
              "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                         "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}}})
    gpus = [NodeGpu(i, f"GPU-link-{i}", "NVIDIA H100 80GB HBM3", 80 * 2**30, nvlink_island=island)
            for i, island in enumerate((0, 1, 1))]
    SlicePublisher(config.new_client_from_config(str(cp.kubeconfig))).publish("kw-link", gpus)
    (template,) = [d for d in yaml.safe_load_all((REPO / "deploy/examples/dra/workload.yaml").read_text())
                   if d["kind"] == "ResourceClaimTemplate" and d["metadata"]["name"] == "two-linked-gpus"]
    cp.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": "linked", "namespace": "default"}, "spec": template["spec"]["spec"]})
    cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "linked", "namespace": "default"},
              "spec": {"tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                       "nodeSelector": {"kubernetes.io/hostname": "kw-link"},
                       "resourceClaims": [{"name": "gpus", "resourceClaimName": "linked"}],
                       "containers": [{"name": "c", "image": "registry.invalid/x:1",
                                       "resources": {"claims": [{"name": "gpus"}]}}]}})
    _until(lambda: _pod_state(cp, "linked") == "placed", "the linked-GPU claim allocated")
    claim = json.loads(cp.kubectl("get", "resourceclaim", "linked", "-n", "default", "-o", "json").stdout)
    assert sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"]) == ["gpu-1", "gpu-2"]


def test_slices_are_owned_by_their_node_and_follow_a_recreated_one(cp, publisher):
    """As DRA drivers' kubelet plugins publish them: the Node owns its slices (the garbage collector deletes them
    with it); without a Node there is no owner to name; a Node recreated under its name owns them anew."""
    gpus = [NodeGpu(0, "GPU-own-0", "NVIDIA H100 80GB HBM3", 80 * 2**30)]
    publisher.publish("own-a", gpus)
    assert all(not s["metadata"].get("ownerReferences") for s in publisher.current("own-a"))
    uids = []
    for _ in range(2):
        cp.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "own-a"}})
        uids.append(json.loads(cp.kubectl("get", "node", "own-a", "-o", "json").stdout)["metadata"]["uid"])
        assert publisher.publish("own-a", gpus).changed
        assert [s["metadata"]["ownerReferences"] for s in publisher.current("own-a")] == [[
            {"apiVersion": "v1", "kind": "Node", "name": "own-a", "uid": uids[-1], "controller": True}]]
        assert not publisher.publish("own-a", gpus).changed  # the same owner: nothing to write
        cp.kubectl("delete", "node", "own-a")
    assert uids[0] != uids[1]
