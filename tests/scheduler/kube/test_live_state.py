"""LiveGpuState: the stream's GPU state located on the model's nodes, bands written, changes logged."""

from __future__ import annotations

import time

from contract import annotations
from contract.events import GpuState, HealthBand, NodeGpu, NodeState
from gpuaware.local.fake_apiserver import make_node
from scheduler.feed import StateView
from scheduler.kube.cache import ClusterCache
from scheduler.kube.live_state import REAPPLY_EVERY_S, LiveGpuState


def gpu(g: int, band: HealthBand, node: str = "n0", temp: float = 60.0) -> GpuState:
    ts = int(time.time() * 1000)
    return GpuState(f"GPU-{node}-{g}", node, "H100", ts, ts, 50.0, 20.0, 1000.0, 81920, 300.0, temp, 90.0, band)


def setup() -> tuple[StateView, ClusterCache, LiveGpuState]:
    cache = ClusterCache(scheduler_name="gpuaware")
    cache.sync_nodes([make_node("n0", gpus=2)])
    view = StateView()
    # The stream also knows a node this cluster does not have: it is left out.
    for node in ("n0", "elsewhere"):
        view.learn(NodeState(node, int(time.time() * 1000), None, None, [
            NodeGpu(f"GPU-{node}-{g}", g, "H100", 81920, 0, HealthBand.HEALTHY) for g in range(2)], 2000, 0))
        for g in range(2):
            view.learn(gpu(g, HealthBand.HEALTHY, node))
    return view, cache, LiveGpuState(view, cache)


def test_gpus_are_located_on_the_models_nodes():
    _, _, state = setup()
    assert state.apply(time.time())
    assert state.where == {"GPU-n0-0": (0, 0), "GPU-n0-1": (0, 1)}


def test_band_changes_are_written_and_logged():
    view, cache, state = setup()
    now = time.time()
    state.apply(now)
    assert list(state.band_changes) == []
    view.learn(gpu(1, HealthBand.CRITICAL))
    assert state.apply(now + 0.1)
    assert int(cache.cluster.band[0, 1]) > 0
    ((at, node, g, band),) = state.band_changes
    assert (at, node, g) == (now + 0.1, "n0", 1) and band == int(cache.cluster.band[0, 1])


def test_nothing_new_is_not_applied_again_until_time_passes():
    _, _, state = setup()
    now = time.time()
    assert state.apply(now)
    assert not state.apply(now + REAPPLY_EVERY_S / 2)
    assert state.apply(now + REAPPLY_EVERY_S)  # staleness moves on with time alone


def test_a_cordon_stands_whatever_the_stream_says():
    _view, cache, state = setup()
    node = make_node("n0", gpus=2)
    node["metadata"]["annotations"] = {annotations.ANN_CORDONED: "0"}
    cache.node_event("MODIFIED", node)
    state.apply(time.time())
    assert int(cache.cluster.band[0, 0]) > 0 and int(cache.cluster.band[0, 1]) == 0
