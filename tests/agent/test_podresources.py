"""GPU -> pod attribution against a gRPC server speaking the kubelet PodResources wire format."""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuaware.agent.collectors.sim import SimCluster, load_scenario
from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentCollector, AgentStats, render
from gpuaware.agent.podresources import (
    LIST_METHOD,
    PodRef,
    PodResourcesWatcher,
    ProtobufError,
    parse_list_response,
    pod_uid_from_cgroup,
    pod_uid_of_pid,
)
from gpuaware.agent.sampling import SamplingPolicy


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _s(number: int, text: str) -> bytes:
    return _field(number, text.encode())


def list_response(pods: list[tuple[str, str, str, str, list[str]]]) -> bytes:
    """ListPodResourcesResponse{pod_resources: [PodResources{name, namespace, containers: [...]}]}."""
    out = b""
    for name, ns, container, resource, ids in pods:
        device = _s(1, resource) + b"".join(_s(2, i) for i in ids)
        cont = _s(1, container) + _field(2, device) + _varint(3 << 3 | 0) + _varint(7)  # + a cpu_id
        out += _field(1, _s(1, name) + _s(2, ns) + _field(3, cont))
    return out


@pytest.fixture
def kubelet(tmp_path):
    sock = tmp_path / "kubelet.sock"
    state = {"response": b""}

    def handle(request: bytes, context) -> bytes:
        return state["response"]

    server = grpc.server(futures.ThreadPoolExecutor(2))
    service, method = LIST_METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        service, {method: grpc.unary_unary_rpc_method_handler(handle)})])
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    yield str(sock), state
    server.stop(0)


def test_parse_keeps_gpu_devices_only():
    data = list_response([("train-0", "ml", "main", "nvidia.com/gpu", ["GPU-a", "GPU-b"]),
                          ("web", "default", "app", "example.com/fpga", ["fpga-0"])])
    assert parse_list_response(data) == {"GPU-a": [("train-0", "ml", "main")], "GPU-b": [("train-0", "ml", "main")]}
    with pytest.raises(ProtobufError):
        parse_list_response(data[:-3])


def test_gpu_metrics_carry_the_pod_that_holds_the_gpu(kubelet):
    sock, state = kubelet
    scenario = load_scenario("baseline").model_copy(update={"nodes": 1, "gpus_per_node": 2})
    clock = [0.0]
    core = AgentCore(SimCluster(scenario, clock=lambda: clock[0], epoch=0.0).node(0), SamplingPolicy(),
                     clock=lambda: clock[0])
    core.tick(0.0)
    gpu0 = core.devices[0].uuid
    state["response"] = list_response([("train-0", "ml", "main", "nvidia.com/gpu", [gpu0])])
    watcher = PodResourcesWatcher(sock, every_s=0.1).start()
    try:
        deadline = time.monotonic() + 10
        while not watcher.pods(gpu0) and time.monotonic() < deadline:
            time.sleep(0.05)
        registry = CollectorRegistry()
        registry.register(AgentCollector([core], AgentStats(), watcher))
        util = next(f for f in text_string_to_metric_families(render(registry).decode())
                    if f.name == "DCGM_FI_DEV_GPU_UTIL")
        by_gpu = {s.labels["UUID"]: s.labels for s in util.samples}
        assert (by_gpu[gpu0]["pod"], by_gpu[gpu0]["namespace"], by_gpu[gpu0]["container"]) == ("train-0", "ml", "main")
        assert "pod" not in by_gpu[core.devices[1].uuid]
    finally:
        watcher.stop()


def test_a_missing_socket_means_no_pod_labels(tmp_path):
    watcher = PodResourcesWatcher(str(tmp_path / "absent.sock")).start()
    assert not watcher.available and watcher.pods("GPU-x") == []
    watcher.stop()


def test_time_sliced_replicas_are_one_gpu_held_by_several_pods():
    data = list_response([("a", "ml", "main", "nvidia.com/gpu", ["GPU-a::0"]),
                          ("b", "ml", "main", "nvidia.com/gpu", ["GPU-a::1", "GPU-a::2"])])
    assert parse_list_response(data) == {"GPU-a": [("a", "ml", "main"), ("b", "ml", "main")]}
    watcher = PodResourcesWatcher("/nonexistent")
    watcher.owners = parse_list_response(data)
    watcher.uids[("ml", "b")] = "u-b"
    assert watcher.pods("GPU-a") == [PodRef("a", "ml", "main", ""), PodRef("b", "ml", "main", "u-b")]


UID = "1c2d3e4f-1111-2222-3333-444455556666"


@pytest.mark.parametrize("cgroup", [
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
    "cri-containerd-abc.scope\n",  # cgroup v2, systemd driver
    f"12:memory:/kubepods/besteffort/pod{UID}/0123abcd\n11:cpu:/kubepods/besteffort/pod{UID}/0123abcd\n",  # v1
])
def test_a_process_pod_uid_comes_from_its_cgroup(cgroup, tmp_path):
    assert pod_uid_from_cgroup(cgroup) == UID
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(cgroup)
    assert pod_uid_of_pid(42, str(tmp_path)) == UID
    assert pod_uid_of_pid(43, str(tmp_path)) is None
    assert pod_uid_from_cgroup("0::/user.slice/session-1.scope\n") is None
