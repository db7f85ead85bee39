"""LiveGpuState: the stream's GPU state located on the model's nodes, bands written, changes logged."""

from __future__ import annotations

import random
import time

from gpuaware.contract import annotations
from gpuaware.contract.events import GpuState, HealthBand, NodeGpu, NodeState
from gpuaware.local.fake_apiserver import make_node
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.live_state import REAPPLY_EVERY_S, LiveGpuState


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


def _fleet(nodes: int) -> ClusterCache:
    cache = ClusterCache(scheduler_name="gpuaware")
    cache.sync_nodes([make_node(f"n{i}", gpus=4) for i in range(nodes)])
    return cache


def _model(cache: ClusterCache) -> dict[str, list]:
    """What the plugins read of live state (not ``version``, a cache key: writing every GPU bumped it for a
    cordoned GPU on every pass, its stream band written and the cordon's written back over it)."""
    c = cache.cluster
    return {name: getattr(c, name).tolist() for name in ("band", "util", "forecast_util", "temp", "live",
                                                         "forecast_mem", "power", "fingerprint")}


def test_applying_only_what_changed_leaves_the_model_as_applying_everything_would():
    """The incremental apply (changed GPUs, moved GPUs, staleness flipping with time, a feed outage and its end)
    against a fresh ``LiveGpuState`` writing every GPU each time, on the same records at the same times."""
    rng = random.Random(7)
    t0 = 1_800_000_000.0
    incremental, full = _fleet(6), _fleet(6)
    views = [StateView(stale_after_ms=20_000, clock=lambda: t0), StateView(stale_after_ms=20_000, clock=lambda: t0)]
    live = LiveGpuState(views[0], incremental)

    def learn(record, at_s: float) -> None:
        for v in views:
            v.learn(record, arrived_ms=int(at_s * 1000))

    def node_state(i: int, at_s: float, shift: int = 0) -> NodeState:
        return NodeState(f"n{i}", int(at_s * 1000), None, None, [
            NodeGpu(f"GPU-{i + 7 * shift}-{g}", g, "H100", 81920, 0, HealthBand.HEALTHY) for g in range(4)], 0, 0)

    for i in range(5):  # n5 has no node state: its GPUs are nowhere
        learn(node_state(i, t0), t0)
    now = t0
    for step in range(60):
        now += rng.choice([0.3, 1.0, 4.0, 15.0]) if step != 30 else 40.0  # step 30: the feed is silent, an outage
        for _ in range(rng.randrange(0, 6)):
            n, g = rng.randrange(21), rng.randrange(4)
            sample = int((now - rng.choice([0, 0, 5, 25])) * 1000)
            learn(GpuState(f"GPU-{n}-{g}", f"n{n % 7}", "H100", sample, int(now * 1000), rng.uniform(0, 100), 1.0,
                           rng.uniform(0, 8e4), 81920, rng.uniform(50, 700), rng.uniform(30, 90), 90.0,
                           rng.choice(list(HealthBand)), workload_class=rng.choice([None, "training"])), now)
        if step % 17 == 5:  # a node's GPUs replaced (their states may have arrived before)
            learn(node_state(rng.randrange(5), now, shift=rng.randrange(3)), now)
        if step == 40:
            cordoned = make_node("n2", gpus=4)
            cordoned["metadata"]["annotations"] = {annotations.ANN_CORDONED: "1"}
            for cache in (incremental, full):
                cache.node_event("MODIFIED", cordoned)
        live.apply(now)
        LiveGpuState(views[1], full).apply(now)
        assert _model(incremental) == _model(full), f"step {step}"
    assert live.band_changes  # the sequence did move bands
