"""Roll per-GPU state up to nodes and to cluster demand per GPU model (pure functions)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import numpy as np

from gpuaware.contract.events import HealthBand, ModelDemand, NodeGpu, NodeState
from gpuaware.stream.gpu_state import GpuTracker

# A partial is {model: {horizon_s: [demand, lower, upper, capacity]}} over the GPUs one worker owns.
Partial = dict[str, dict[str, list[float]]]


CRITICAL = HealthBand.CRITICAL.value  # read once: an enum member's value is a descriptor call


def _usable(t: GpuTracker) -> bool:
    return t.health_band != CRITICAL


def ordered(trackers: Iterable[GpuTracker]) -> list[GpuTracker]:
    """A node's GPUs in the order its rollup lists them."""
    return sorted(trackers, key=lambda t: (t.index, t.uuid))


def headroom(gpus: Iterable[GpuTracker]) -> tuple[int, int]:
    """Idle compute (milli-GPU) and free framebuffer (MiB) of the usable ones of ``gpus``."""
    # One loop for both sums: every node's rollup is considered every 5 s (at 50,000 GPUs, two generator passes
    # per node were 2 % of a worker's main thread). Gathering every node's GPUs' rows in one numpy call
    # (gpuaware.stream.readings) cost as much as this loop: the trackers are walked either way.
    free_milli = free_fb = 0
    for t in gpus:
        if t.health_band == CRITICAL:
            continue
        util, fb = t.util_fb()
        free_milli += max(0, 1000 - round(10 * util))
        free_fb += max(0, t.fb_total_mib - round(fb))
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
    """Forecast GPU demand per model and horizon: the sum of forecast utilisation, in whole GPUs.

    Each GPU's utilisation forecasts are the first numbers of its ``packed_forecasts`` (gpuaware.stream.gpu_state): a
    model's GPUs' are read as one array and summed in order (``cumsum``: the sum a loop over them makes, to the
    bit). Read one GPU at a time they were ~8 µs of each GPU every 10 s."""
    by_model: dict[str, tuple[list[bytes], list[bool]]] = {}
    horizons = None
    for t in trackers:
        packed = t.packed_forecasts
        if not packed or not t.model:
            continue
        if horizons is None:
            horizons = t.settings.horizons_min
        elif t.settings.horizons_min != horizons:
            raise ValueError("the demand sums GPUs forecast over one set of horizons")
        group = by_model.get(t.model)
        if group is None:
            group = by_model[t.model] = ([], [])
        group[0].append(packed)
        group[1].append(_usable(t))
    out: Partial = {}
    for model, (packs, usable) in by_model.items():
        numbers = np.frombuffer(b"".join(packs), dtype="<f8").reshape(len(packs), -1)
        # "util_gpu" is the first of the forecasts' metrics: per horizon, its mean, lower and upper
        # (+ 0.0: a sum of negative zeros is 0.0 from a loop that starts at 0.0, -0.0 from cumsum)
        sums = (np.cumsum(numbers[:, :3 * len(horizons)] / 100.0, axis=0)[-1] + 0.0).tolist()
        capacity = float(sum(usable))
        out[model] = {str(h * 60): [*sums[3 * i:3 * i + 3], capacity] for i, h in enumerate(horizons)}
    return out


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
