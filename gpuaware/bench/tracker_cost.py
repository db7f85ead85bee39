"""What a stream worker's GPUs cost to build and to hold: ``python -m gpuaware.bench.tracker_cost --gpus 10000``.

Builds ``--gpus`` GPU trackers (``gpuaware.stream.gpu_state.GpuTracker``) and gives each ``--minutes`` closed minutes
(the 60-minute history a running worker holds, every horizon's pending forecasts queued), as a worker does
for GPUs it meets for the first time or recovers. JSON: ``gpus``, ``minutes``, ``cpu_s`` (process CPU time
for all of it), ``us_per_gpu_minute``, ``gc_s`` (time in the cyclic collector meanwhile), ``gc_objects_per_gpu``
(objects the collector tracks, what each full collection walks) and ``kib_per_gpu`` (tracemalloc, over
200 GPUs built the same way: Python's allocations only; the buffers of River's Rust-backed statistics are
not seen, about 0.8 KiB more per rolling quantile; a worker's RSS is in ``gpuaware/bench/stream_recovery.py``).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc

from gpuaware.stream.gpu_state import GpuTracker, TrackerSettings

FB_MIB = 81559


def build(gpus: int, minutes: int) -> list[GpuTracker]:
    settings = TrackerSettings()
    out = []
    for i in range(gpus):
        t = GpuTracker(uuid=f"GPU-{i}", settings=settings)
        t.fb_total_mib = FB_MIB
        for m in range(minutes + 1):  # the bucket of minute m + 1 closes minute m
            t._bucket(m, 40.0 + (i + m) % 7, 30_000.0 + (m % 5) * 100)
        out.append(t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--minutes", type=int, default=60)
    args = ap.parse_args()
    in_gc, started = [0.0], []

    def timed(phase: str, _info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            in_gc[0] += time.perf_counter() - started.pop()

    gc.collect()
    before = len(gc.get_objects())
    gc.callbacks.append(timed)
    cpu = time.process_time()
    kept = build(args.gpus, args.minutes)
    cpu = time.process_time() - cpu
    gc.callbacks.remove(timed)
    objects = (len(gc.get_objects()) - before) / len(kept)
    del kept
    tracemalloc.start()
    sample = build(200, args.minutes)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(json.dumps({"gpus": args.gpus, "minutes": args.minutes, "cpu_s": round(cpu, 2),
                      "us_per_gpu_minute": round(1e6 * cpu / (args.gpus * args.minutes), 1),
                      "gc_s": round(in_gc[0], 2), "gc_objects_per_gpu": round(objects),
                      "kib_per_gpu": round(held / len(sample) / 1024, 1)}))


if __name__ == "__main__":
    main()
