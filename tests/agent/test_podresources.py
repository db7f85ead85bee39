"""GPU -> pod attribution against a gRPC server speaking the kubelet PodResources wire format."""

from __future__ import annotations

import contextlib
import time
from concurrent import futures

import grpc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
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


def _raw_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_a_device_id_that_is_not_utf8_is_skipped_and_the_other_gpus_keep_their_pods():
    device = _s(1, "nvidia.com/gpu") + _raw_field(2, b"GPU-\xff\xfe") + _s(2, "GPU-b")
    pod = _s(1, "train-\u00e9") + _s(2, "ml") + _field(3, _s(1, "main") + _field(2, device))
    assert parse_list_response(_field(1, pod)) == {"GPU-b": [("train-\u00e9", "ml", "main")]}
    named_badly = _raw_field(1, b"p\xff") + _s(2, "ml") + _field(3, _s(1, "main") + _field(2, device))
    assert parse_list_response(_field(1, named_badly)) == {"GPU-b": [("p\ufffd", "ml", "main")]}


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400))
@example(b"\x08\x00")  # a varint where a PodResources message belongs: was a TypeError
def test_any_bytes_parse_or_raise_protobuf_error(data):
    try:
        owners = parse_list_response(data)
    except ProtobufError:
        return
    assert all(isinstance(u, str) and all(len(o) == 3 for o in holders) for u, holders in owners.items())


_names = st.one_of(st.binary(max_size=12), st.text(max_size=12).map(str.encode))
_devices = st.tuples(st.sampled_from([b"nvidia.com/gpu", b"nvidia.com/mig-1g.10gb", b"example.com/fpga", b"\xff"]),
                     st.lists(_names, max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_names, _names, _names, st.lists(_devices, max_size=2)), max_size=3), st.data())
def test_well_framed_answers_with_any_names_and_ids_parse_and_keep_every_utf8_gpu_id(pods, data):
    """Any bytes in any string field (and a varint where a message belongs) parse or raise ProtobufError."""
    out = b""
    expected: set[str] = set()
    for name, ns, container, devices in pods:
        cont = _raw_field(1, container) + b"".join(
            _raw_field(2, _raw_field(1, res) + b"".join(_raw_field(2, i) for i in ids)) for res, ids in devices)
        out += _raw_field(1, _raw_field(1, name) + _raw_field(2, ns) + _raw_field(3, cont))
        for res, ids in devices:
            if res.startswith((b"nvidia.com/gpu", b"nvidia.com/mig-")):
                for i in ids:
                    with contextlib.suppress(UnicodeDecodeError):
                        expected.add(i.decode().split("::")[0])
    if data.draw(st.booleans()):  # a varint where a PodResources message belongs
        try:
            parse_list_response(out + _varint(1 << 3 | 0) + _varint(5))
        except ProtobufError:
            pass
        else:
            raise AssertionError("a varint in place of a message was accepted")
    assert set(parse_list_response(out)) == expected


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
