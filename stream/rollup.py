"""Roll per-GPU state up to nodes and to cluster demand per GPU model (pure functions)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from contract.events import HealthBand, ModelDemand, NodeGpu, NodeState
from stream.gpu_state import GpuTracker

# A partial is {model: {horizon_s: [demand, lower, upper, capacity]}} over the GPUs one worker owns.
Partial = dict[str, dict[str, list[float]]]


def _usable(t: GpuTracker) -> bool:
    return t.health_band != HealthBand.CRITICAL.value


def ordered(trackers: Iterable[GpuTracker]) -> list[GpuTracker]:
    """A node's GPUs in the order its rollup lists them."""
    return sorted(trackers, key=lambda t: (t.index, t.uuid))


def headroom(gpus: Iterable[GpuTracker]) -> tuple[int, int]:
    """Idle compute (milli-GPU) and free framebuffer (MiB) of the usable ones of ``gpus``."""
    usable = [t for t in gpus if _usable(t)]
    free_milli = sum(max(0, 1000 - round(10 * t.smoothed.get("util_gpu", 0.0))) for t in usable)
    free_fb = sum(max(0, t.fb_total_mib - round(t.smoothed.get("fb_used_mib", 0.0))) for t in usable)
    return free_milli, free_fb


def node_state(node: str, trackers: Iterable[GpuTracker], now_ms: int) -> NodeState:
    """The node's GPUs and measured headroom (``headroom``)."""
    gpus = ordered(trackers)
    return node_record(node, gpus, headroom(gpus), now_ms)


def node_record(node: str, gpus: list[GpuTracker], free: tuple[int, int], now_ms: int) -> NodeState:
    """``node_state`` from GPUs already ``ordered`` and their ``headroom`` (the stream worker has both when it
    decides whether a rollup is republished).

    Telemetry v1 carries no NVLink topology, so every GPU of a node is reported in island 0.
    """
    free_milli, free_fb = free
    return NodeState(
        node=node, ts_ms=now_ms, cpu_milli=None, memory_mib=None,
        gpus=[NodeGpu(t.uuid, t.index, t.model, t.fb_total_mib, 0, HealthBand(t.health_band)) for t in gpus],
        free_gpu_milli=free_milli, free_fb_mib=free_fb,
    )


def model_demand(trackers: Iterable[GpuTracker]) -> Partial:
    """Forecast GPU demand per model and horizon: the sum of forecast utilisation, in whole GPUs."""
    out: Partial = defaultdict(dict)
    for t in trackers:
        if not t.model:
            continue
        capacity = 1.0 if _usable(t) else 0.0
        for f in t.forecasts:
            if f.metric != "util_gpu":
                continue
            cell = out[t.model].setdefault(str(f.horizon_s), [0.0, 0.0, 0.0, 0.0])
            cell[0] += f.mean / 100.0
            cell[1] += f.lower / 100.0
            cell[2] += f.upper / 100.0
            cell[3] += capacity
    return dict(out)


def merge_demand(partials: Mapping[str, Partial]) -> list[ModelDemand]:
    """Sum the partials of every worker into one demand line per (model, horizon)."""
    total: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for partial in partials.values():
        for model, horizons in partial.items():
            for horizon, cell in horizons.items():
                acc = total[(model, int(horizon))]
                for i in range(4):
                    acc[i] += cell[i]
    return [
        ModelDemand(model, horizon, round(d, 3), round(lo, 3), round(hi, 3), capacity)
        for (model, horizon), (d, lo, hi, capacity) in sorted(total.items())
    ]
