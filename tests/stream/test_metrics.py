"""The stream worker's collector: what a scrape costs the worker."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from gpuaware.stream.metrics import StreamCollector, StreamStats


class _Fingerprint:
    def __init__(self, cls: str) -> None:
        self.cls = cls

    def predict_one(self) -> tuple[str, float]:
        return self.cls, 0.9


class _Tracker:
    """What the collector reads of a GPU, counting how often it is read."""

    walks = 0

    def __init__(self, cls: str, err: float, forecasting: bool = True) -> None:
        self.fingerprint = _Fingerprint(cls)
        self.err = err
        self.forecasting = forecasting

    def forecast_abs_errors(self) -> dict[tuple[str, int], float]:
        _Tracker.walks += 1
        return {("util_gpu", 5): self.err}


def _scrape(registry: CollectorRegistry) -> dict[str, float]:
    lines = generate_latest(registry).decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")}


def test_frequent_scrapes_walk_the_gpus_once_per_interval_and_see_changes_after_it() -> None:
    now = [100.0]
    trackers = [_Tracker("training", 2.0), _Tracker("idle", 4.0), _Tracker("idle", 0.0, forecasting=False)]
    registry = CollectorRegistry()
    registry.register(StreamCollector(StreamStats(), lambda: list(trackers), dict, fleet_every_s=5.0,
                                      clock=lambda: now[0]))
    _Tracker.walks = 0
    first = _scrape(registry)
    assert first['gpuaware_stream_forecast_mae{horizon_minutes="5",metric="util_gpu"}'] == 2.0
    assert first['gpuaware_stream_workload_class_gpus{class="idle"}'] == 2.0
    assert first["gpuaware_stream_gpus_forecasting"] == 2.0
    trackers.append(_Tracker("idle", 6.0))
    for _ in range(20):  # a poller at 4 Hz for under 5 s: the GPU walk is not redone
        now[0] += 0.2
        scraped = _scrape(registry)
    assert _Tracker.walks == 3
    assert scraped["gpuaware_stream_gpus"] == 4.0  # the GPU count itself is live
    assert scraped['gpuaware_stream_workload_class_gpus{class="idle"}'] == 2.0
    now[0] += 1.0  # 5 s after the walk
    scraped = _scrape(registry)
    assert _Tracker.walks == 7
    assert scraped['gpuaware_stream_forecast_mae{horizon_minutes="5",metric="util_gpu"}'] == 3.0
    assert scraped['gpuaware_stream_workload_class_gpus{class="idle"}'] == 3.0
    assert scraped["gpuaware_stream_gpus_forecasting"] == 3.0


def test_scrapes_that_come_during_a_walk_wait_for_it_instead_of_walking_too() -> None:
    import threading
    import time

    class Slow(_Tracker):
        def forecast_abs_errors(self) -> dict[tuple[str, int], float]:
            time.sleep(0.05)
            return super().forecast_abs_errors()

    trackers = [Slow("idle", 1.0) for _ in range(4)]
    registry = CollectorRegistry()
    registry.register(StreamCollector(StreamStats(), lambda: list(trackers), dict, fleet_every_s=60.0))
    _Tracker.walks = 0
    start = threading.Barrier(4)
    results = []

    def scrape() -> None:
        start.wait()
        results.append(_scrape(registry)["gpuaware_stream_gpus_forecasting"])

    threads = [threading.Thread(target=scrape) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [4.0] * 4
    assert _Tracker.walks == 4  # one walk of the four GPUs, not one per scrape


def test_a_worker_stops_exporting_the_cluster_forecast_once_it_stops_making_it() -> None:
    """After a rebalance moves the demand topic, the old owner's last forecast must not stand beside the new
    owner's: two series per model double sums and break the forecast dashboard's join on (cluster, model)."""
    from gpuaware.contract.events import ModelDemand

    now = [1000.0]
    stats = StreamStats(clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(StreamCollector(stats, lambda: [], lambda: {}, clock=lambda: now[0], demand_max_age_s=60.0))
    stats.demand = [ModelDemand("H100", 900, 3.0, 2.0, 4.0, 8.0)]
    now[0] += 30.0
    text = generate_latest(registry).decode()
    assert 'gpuaware_cluster_demand_gpus{bound="mean",horizon_s="900",model="H100"} 3.0' in text
    assert 'gpuaware_cluster_capacity_gpus{model="H100"} 8.0' in text
    now[0] += 31.0  # no new forecast for over a minute: the demand partition went to another worker
    text = generate_latest(registry).decode()
    assert "gpuaware_cluster_demand_gpus{" not in text and "gpuaware_cluster_capacity_gpus{" not in text
    stats.demand = [ModelDemand("H100", 900, 5.0, 4.0, 6.0, 8.0)]  # owning it again
    assert 'model="H100"} 5.0' in generate_latest(registry).decode()
