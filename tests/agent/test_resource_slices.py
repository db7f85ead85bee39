"""agent.resource_slices: the agent's node GPUs published as DRA ResourceSlices (a real kube-apiserver for the
publish; skipped when it is not built, failed under ``CI=true``)."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes import config
from pydantic import ValidationError

from gpuaware.agent.collectors.sim import SimCluster, load_scenario
from gpuaware.agent.core import AgentCore
from gpuaware.agent.main import publish_slices
from gpuaware.agent.readings import GpuDevice
from gpuaware.agent.resource_slices import node_gpus, nvlink_islands, pci_bus_id, publish_until_done
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.agent.settings import AgentSettings
from gpuaware.contract import dra
from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, find_binaries
from gpuaware.plumbing.kube.resource_slices import SlicePublisher
from tests.support import need


def dev(index: int, peers: list[str]) -> GpuDevice:
    return GpuDevice(f"GPU-{index}", index, "NVIDIA H100 80GB HBM3", f"00000000:{0x18 + index:02X}:00.0", 81559,
                     nvlink_peers=peers, driver_version="535.104.05")


def test_bus_ids_and_nvlink_islands():
    assert pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0" and pci_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert pci_bus_id("") is None and pci_bus_id("3b:00") is None
    # 0-1-2 linked (2 only through 1), 3 alone, 4-5 linked; a peer on no GPU here is ignored.
    devices = [dev(0, ["GPU-1"]), dev(1, ["GPU-0", "GPU-2"]), dev(2, ["GPU-1"]), dev(3, ["GPU-elsewhere"]),
               dev(4, ["GPU-5"]), dev(5, ["GPU-4"])]
    assert nvlink_islands(devices) == {"GPU-0": 0, "GPU-1": 0, "GPU-2": 0, "GPU-3": 1, "GPU-4": 2, "GPU-5": 2}


def test_settings_are_off_by_default_and_checked():
    assert AgentSettings().resource_slices is False
    with pytest.raises(ValidationError, match="resource_slices_retry_s"):
        AgentSettings(resource_slices_retry_s=0)


def test_no_api_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    with pytest.raises(ValueError, match=r"agent\.resource_slices: no Kubernetes API"):
        publish_slices(AgentSettings(resource_slices=True), None, asyncio.Event())  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def cp():
    need(find_binaries, BinariesMissing)
    with KubeControlPlane() as plane:
        yield plane


async def test_the_sim_nodes_gpus_are_published_as_nvidia_shaped_slices(cp):
    scenario = load_scenario("baseline").model_copy(update={"nodes": 2})
    cores = [AgentCore(c, SamplingPolicy()) for c in SimCluster(scenario).collectors()]
    publisher = SlicePublisher(config.new_client_from_config(str(cp.kubeconfig)))
    await asyncio.wait_for(publish_until_done(publisher, cores, asyncio.Event(), retry_s=0.1), 60)
    for core in cores:
        (view,) = [dra.parse_slice(s) for s in publisher.current(core.node)]
        want = node_gpus(core)
        assert [(d.name, d.uuid, d.index, d.memory_bytes) for d in view.devices] == \
            [(f"gpu-{g.index}", g.uuid, g.index, g.memory_bytes) for g in want]
        assert all(d.type == dra.TYPE_GPU and d.product_name for d in view.devices)
    # A restart with the same GPUs writes nothing.
    assert not publisher.publish(cores[0].node, node_gpus(cores[0])).changed


async def test_with_resource_slices_shareable_the_gpus_allow_multiple_allocations(cp):
    scenario = load_scenario("baseline").model_copy(update={"nodes": 1})
    (core,) = [AgentCore(c, SamplingPolicy()) for c in SimCluster(scenario).collectors()]
    publisher = SlicePublisher(config.new_client_from_config(str(cp.kubeconfig)))
    await asyncio.wait_for(publish_until_done(publisher, [core], asyncio.Event(), retry_s=0.1, shareable=True), 60)
    (view,) = [dra.parse_slice(s) for s in publisher.current(core.node)]
    assert view.devices and all(d.shareable for d in view.devices)
