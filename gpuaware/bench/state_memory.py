"""How much memory the scheduler's live view of a fleet takes: ``python -m gpuaware.bench.state_memory --gpus 100000``;
with ``--stream``, a stream worker's state: ``python -m gpuaware.bench.state_memory --stream --gpus 2000``.

Fills a ``gpuaware.scheduler.feed.StateView`` with one decoded ``gpu.state.v1`` record per GPU (each with
the six forecasts and health components the stream publishes, decoded from its own bytes as the
feed does) and reports what tracemalloc saw allocated for it: ``state_mib`` and ``bytes_per_gpu``.
The cluster model's per-GPU arrays (``gpuaware.scheduler.core.cluster``) are a few numpy cells per GPU on
top of this.

``--stream`` replays ``--seconds`` simulated seconds of the pipeline bench's fleet (``gpuaware.bench.worker_cost``: its
load generator's batches and events, the worker's timers) into a ``StreamProcessor`` with a dict for its table, and
reports what tracemalloc saw allocated for it: ``bytes_per_gpu`` (trackers, forecaster rows, the table's entries and
the processor's maps), ``forecaster_bytes_per_gpu`` (the forecasters' rows, a fixed width however old the GPU), and
the ``top`` allocation sites per GPU. The default 200 s closes three minutes per GPU, what ``gpuaware bench pipeline``
measures; the memory of an hour's history beyond that is the history entries' JSON in the table. (Resident memory
measured in this process would not do: the fleet's template is built and freed first, and the GPUs' state reuses
that memory.)
"""

from __future__ import annotations

import argparse
import json
import tracemalloc

from gpuaware.contract.events import Forecast, GpuState, HealthBand, decode, encode
from gpuaware.scheduler.feed import StateView


def state_record(i: int, now_ms: int) -> bytes:
    forecasts = [Forecast(metric, h * 60, 41.5, 30.25, 60.75) for metric in ("util_gpu", "fb_used_mib")
                 for h in (1, 5, 15)]
    return encode(GpuState(
        gpu_uuid=f"GPU-fleet-{i // 8:05d}-{i % 8}", node=f"fleet-{i // 8:05d}", model="NVIDIA H100 80GB HBM3",
        sample_ts_ms=now_ms - 3000, published_ms=now_ms, util_gpu=41.37, util_mem=12.5, fb_used_mib=40211.3,
        fb_total_mib=81559, power_w=402.1, temp_c=61.0, health_score=98.5, health_band=HealthBand.HEALTHY,
        health_components={"thermal": 100.0, "ecc": 100.0, "xid": 100.0, "throttle": 95.0},
        forecasts=forecasts, workload_class="training-compute-bound", class_confidence=0.82, samples=5000 + i,
    ))


def measure(gpus: int) -> dict:
    now_ms = 1_800_000_000_000
    view = StateView(clock=lambda: now_ms / 1000)
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    for i in range(gpus):
        view.learn(decode(state_record(i, now_ms)), arrived_ms=now_ms)
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"gpus": gpus, "state_mib": round((after - before) / 2**20, 1),
            "bytes_per_gpu": round((after - before) / gpus)}


def measure_stream(gpus: int, seconds: int, top: int = 8) -> dict:
    import gc

    from gpuaware.bench.fleet_load import TICKS_PER_S, Fleet, load_template
    from gpuaware.bench.worker_cost import T0_MS, Worker

    fleet = Fleet(load_template(None), gpus, "sm")
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    worker = Worker(fleet)
    for tick in range(seconds * TICKS_PER_S):
        worker.tick(tick, T0_MS + tick * 100)
    gc.collect()
    diff = tracemalloc.take_snapshot().compare_to(before, "lineno")
    tracemalloc.stop()
    held = len(worker.processor.trackers)
    total = sum(d.size_diff for d in diff)
    forecasting = sum(t.forecasting for t in worker.processor.trackers.values())
    out = {"gpus": held, "seconds": seconds, "forecasting": forecasting,
           "state_mib": round(total / 2**20, 1), "bytes_per_gpu": round(total / held)}
    try:
        from gpuaware.stream.gpu_state import TrackerSettings, forecast_columns
    except ImportError:  # a checkout from before the forecasters' rows, measured to compare
        pass
    else:
        rows = forecast_columns(TrackerSettings())
        out["forecaster_bytes_per_gpu"] = round(rows.held() * rows.row_bytes / held)
    return {**out, "top": [[str(d.traceback), round(d.size_diff / held)] for d in diff[:top]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=100_000)
    p.add_argument("--stream", action="store_true", help="A stream worker's state, not the scheduler's view.")
    p.add_argument("--seconds", type=int, default=200, help="With --stream: simulated seconds of the fleet replayed.")
    args = p.parse_args()
    print(json.dumps(measure_stream(args.gpus, args.seconds) if args.stream else measure(args.gpus)))


if __name__ == "__main__":
    main()
