"""The agent honours the scheduler's GPU cordons: it reads its node's annotation from the real kube-apiserver
(as the shipped gpuaware-agent ServiceAccount, through the ``kubernetes`` client) and samples cordoned GPUs at
the floor; it acknowledges the power caps it applied on its node."""

from __future__ import annotations

import socket

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuaware.agent.collectors.sim import SimCluster, load_scenario
from gpuaware.agent.cordons import CordonWatcher
from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentCollector, AgentStats
from gpuaware.agent.readings import XidEvent
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract import annotations
from gpuaware.contract.events import HealthAction, HealthVerdict
from gpuaware.local.fake_apiserver import make_node
from gpuaware.plumbing.kube.api import MERGE_PATCH, KubeApi, connect


def _core() -> tuple[AgentCore, list[float]]:
    clock = [0.0]
    cluster = SimCluster(load_scenario("baseline").model_copy(update={"nodes": 2, "gpus_per_node": 4}),
                         clock=lambda: clock[0], epoch=0.0)
    policy = SamplingPolicy(floor_s=1, ceiling_s=30, backoff=2)
    return [AgentCore(cluster.node(i), policy, clock=lambda: clock[0]) for i in range(2)], clock


def _cordoned_gauge(cores) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(AgentCollector(cores, AgentStats()))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    return {(s.labels["Hostname"], s.labels["gpu"]): s.value for s in families["gpuaware_gpu_cordoned"].samples}


def test_cordoned_gpus_are_read_from_the_node_and_sampled_at_the_floor(kube):
    cores, clock = _core()
    stats = AgentStats()
    node = make_node(cores[0].node, gpus=4)
    node["metadata"]["annotations"] = {annotations.ANN_CORDONED: "1,3"}
    kube.create("nodes", node)  # the second simulated node is not in this cluster
    watcher = CordonWatcher(cores, kube.api("gpuaware-agent"), stats)
    watcher.apply(watcher.read())
    assert [t.cordoned for t in cores[0].tracks] == [False, True, False, True]
    assert not any(t.cordoned for t in cores[1].tracks)
    for s in range(120):
        clock[0] = float(s)
        for core in cores:
            core.tick(float(s))
    intervals = [t.sampler.interval for t in cores[0].tracks]
    assert intervals[1] == intervals[3] == 1  # cordoned: at the floor
    assert intervals[0] > 1 and intervals[2] > 1  # the others backed off while stable
    gauge = _cordoned_gauge(cores)
    assert gauge[(cores[0].node, "1")] == 1 and gauge[(cores[0].node, "0")] == 0
    assert gauge[(cores[1].node, "1")] == 0

    # An operator releases GPU 3: it backs off again.
    KubeApi(kube.admin).core.patch_node(cores[0].node, {"metadata": {"annotations": {
        annotations.ANN_CORDONED: "1"}}}, _content_type=MERGE_PATCH)
    watcher.apply(watcher.read())
    assert [t.cordoned for t in cores[0].tracks] == [False, True, False, False]
    assert not cores[0].tracks[3].sampler.pinned
    assert stats.cordon_read_errors == 0  # a node the API does not know is not an error

    # The API gone: the read fails, is counted, and the last known cordons stand.
    watcher.api = KubeApi(connect(_nothing_listening()))
    watcher.apply(watcher.read())
    assert stats.cordon_read_errors == 2
    assert [t.cordoned for t in cores[0].tracks] == [False, True, False, False]


def _nothing_listening() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_no_api_means_no_watcher(monkeypatch, tmp_path):
    cores, _ = _core()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert CordonWatcher.from_settings(cores, AgentStats(), None, 15.0) is None
    # An agent run beside a cluster reads through the kubeconfig KUBECONFIG names (it used to read nothing).
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": _nothing_listening()}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert CordonWatcher.from_settings(cores, AgentStats(), None, 15.0) is not None
    monkeypatch.delenv("KUBECONFIG")
    assert CordonWatcher.from_settings(cores, AgentStats(), "http://127.0.0.1:1", 0) is None
    assert CordonWatcher.from_settings(cores, AgentStats(), "http://127.0.0.1:1", 5.0) is not None


def test_power_caps_the_gpus_accepted_are_acknowledged_on_the_node(kube):
    """Issue 17 item 11: a cap is acknowledged on the Node (its agent's only write, held to that node by the
    admission policy tested in tests/deploy/test_rbac.py), and the acknowledgement follows a lift."""
    from gpuaware.agent.runtime import AgentRuntime
    from gpuaware.contract.events import AgentControl, ControlKind

    cores, _ = _core()
    stats = AgentStats()
    kube.create("nodes", make_node(cores[0].node, gpus=4))
    # The agent's token is bound to a pod on its node: the admission policy lets it write that node only.
    api = kube.agent_api(cores[0].node)
    watcher = CordonWatcher(cores, api, stats)
    runtime = AgentRuntime.__new__(AgentRuntime)  # only its control handling, on these cores
    runtime.cores, runtime.stats = cores, stats
    uuid = cores[0].devices[2].uuid
    runtime.handle_control(AgentControl("c", 0, cores[0].node, ControlKind.POWER_CAP, None, uuid, 250))

    def acked() -> dict[int, int]:
        return annotations.power_caps(api.read_node(cores[0].node), annotations.ANN_POWER_CAPS_APPLIED)

    watcher.apply(watcher.read())
    assert acked() == {2: 250}
    version = api.read_node(cores[0].node)["metadata"]["resourceVersion"]
    watcher.apply(watcher.read())
    assert api.read_node(cores[0].node)["metadata"]["resourceVersion"] == version  # unchanged: not written
    runtime.handle_control(AgentControl("c", 0, cores[0].node, ControlKind.POWER_CAP, None, uuid, 0))
    watcher.apply(watcher.read())
    assert acked() == {}


def test_a_gpu_reset_stamped_on_the_node_is_judged_afresh_and_a_gpu_not_reset_keeps_its_verdict(kube):
    """Issue 19: NVML announces no reset done by another process, so an XID verdict outlived the reset that
    cleared it. The tooling that reset a GPU stamps it in the node's gpuaware.io/gpu-resets annotation; the
    agent (as the shipped ServiceAccount, a GET of its node) judges that GPU afresh, and only that GPU."""
    clock = [0.0]
    cluster = SimCluster(load_scenario("baseline").model_copy(update={"nodes": 1, "gpus_per_node": 3}),
                         clock=lambda: clock[0], epoch=0.0)
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    kube.create("nodes", make_node(core.node, gpus=3))
    stats = AgentStats()
    watcher = CordonWatcher([core], kube.api("gpuaware-agent"), stats, clock=lambda: 1000.0)
    admin = KubeApi(kube.admin)

    def tick_to(s: int) -> None:
        while clock[0] < s:
            clock[0] += 1.0
            core.tick(clock[0])

    def verdicts() -> list[tuple[HealthVerdict, HealthAction]]:
        return [(t.verdict.verdict, t.verdict.action) for t in core.tracks]

    bad = (HealthVerdict.CRITICAL, HealthAction.RESET_GPU)
    for g in range(3):
        cluster.gpus[0][g].pending_xids.append(XidEvent(g, 1.0, 119))  # GSP RPC timeout: held 24 h
    tick_to(20)
    assert verdicts() == [bad] * 3
    # GPUs 1 and 2 are reset; as on NVML the collector says nothing. GPU 1's reset is stamped on the node,
    # GPU 0 carries a stamp from before the agent started (a reset it already knows nothing of), GPU 2 none.
    for g in (1, 2):
        cluster.node(0).reset_gpu(g, announce=False)
    tick_to(22)
    assert verdicts() == [bad] * 3  # unseen: the verdict outlives the reset
    admin.annotate_node(core.node, {annotations.ANN_GPU_RESETS: annotations.gpu_resets_value({0: 900.0, 1: 1010.0})})
    watcher.apply(watcher.read())
    tick_to(24)
    assert verdicts() == [bad, (HealthVerdict.PASS, HealthAction.NONE), bad]

    # The same stamp read again is not a new reset: a fault after it stands.
    cluster.gpus[0][1].pending_xids.append(XidEvent(1, 25.0, 119))
    tick_to(26)
    watcher.apply(watcher.read())
    tick_to(28)
    assert verdicts()[1] == bad

    # A bad stamp is refused (warned once), acted on nowhere; the next good one is.
    admin.annotate_node(core.node, {annotations.ANN_GPU_RESETS: '{"1": "yesterday"}'})
    watcher.apply(watcher.read())
    tick_to(30)
    assert verdicts()[1] == bad
    cluster.node(0).reset_gpu(1, announce=False)
    admin.annotate_node(core.node, {annotations.ANN_GPU_RESETS: annotations.gpu_resets_value({1: 1040.0})})
    watcher.apply(watcher.read())
    tick_to(32)
    assert verdicts() == [bad, (HealthVerdict.PASS, HealthAction.NONE), bad]
    assert stats.cordon_read_errors == 0


def test_the_pods_holding_each_gpu_are_published_on_the_node_only_when_they_change(kube, tmp_path):
    """Issue 19: the scheduler cannot see which GPU another scheduler's pod holds; the agent publishes its
    PodResources view on its own Node (the admission policy allows that key, tests/deploy/test_rbac.py)."""
    from gpuaware.agent.podresources import PodResourcesWatcher

    cores, _ = _core()
    kube.create("nodes", make_node(cores[0].node, gpus=4))
    api = kube.agent_api(cores[0].node)
    watcher = CordonWatcher(cores[:1], api, AgentStats())
    socket_path = tmp_path / "kubelet.sock"
    socket_path.touch()  # the kubelet's socket is there; its answer is the map below
    pods = PodResourcesWatcher(str(socket_path))
    watcher.pods = pods
    uuid = [d.uuid for d in cores[0].devices]
    pods.owners = {uuid[1]: [("train", "team", "main")], uuid[3]: [("a", "infer", "c"), ("b", "infer", "c")]}

    def published() -> dict[int, set[str]]:
        return annotations.gpu_pods(api.read_node(cores[0].node))

    watcher.apply(watcher.read())
    assert published() == {1: {"team/train"}, 3: {"infer/a", "infer/b"}}
    version = api.read_node(cores[0].node)["metadata"]["resourceVersion"]
    watcher.apply(watcher.read())
    assert api.read_node(cores[0].node)["metadata"]["resourceVersion"] == version  # unchanged: not written
    pods.owners = {}
    watcher.apply(watcher.read())
    assert annotations.ANN_GPU_PODS not in (api.read_node(cores[0].node)["metadata"].get("annotations") or {})
