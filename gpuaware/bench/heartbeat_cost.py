"""What the stream worker's 1 s heartbeat costs at fleet size: ``python -m gpuaware.bench.heartbeat_cost --gpus 30000``.

The heartbeat (``StreamProcessor.heartbeats``) looks once a second for states held back by ``min_interval_ms`` or
not published for ``max_interval_ms``: at the GPUs that changed since their last state and those whose last state is
that old, not at every GPU the worker owns. This builds a processor with
``--gpus`` GPUs (8 per node, each given ``--samples`` samples), publishes them all once, then, with
``--share`` of the GPUs given one new sample per second (the default policy's ~0.08-0.12 samples per GPU per
second), times each heartbeat over ``--seconds`` simulated seconds. JSON: ``gpus``, ``heartbeat_ms_p50``,
``heartbeat_ms_max``, ``states_per_s`` (what the heartbeats published), ``share_of_a_core`` (p50 per second).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from gpuaware.contract.events import GpuInfo, GpuSample, TelemetryBatch
from gpuaware.stream.processor import StreamProcessor

T0 = 1_700_000_000_000


def _batch(node: int, seq: int, ts_ms: int, gpus: list[int]) -> TelemetryBatch:
    return TelemetryBatch(f"n{node}", seq, ts_ms,
                          [GpuInfo(f"GPU-{node}-{g}", g, "NVIDIA H100 80GB HBM3", 81559) for g in gpus],
                          [GpuSample(i, seq, 0, 30 + (seq * 7 + g) % 60, 20, 30_000, 3000, 55)
                           for i, g in enumerate(gpus)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=30_000)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--share", type=float, default=0.1, help="GPUs given a new sample each second.")
    ap.add_argument("--seconds", type=int, default=40)
    args = ap.parse_args()
    proc = StreamProcessor({})
    nodes = args.gpus // 8
    for seq in range(1, args.samples + 1):
        for n in range(nodes):
            proc.on_telemetry(_batch(n, seq, T0 + seq * 5000, list(range(8))), n % 8, T0 + seq * 5000)
    now = T0 + (args.samples + 1) * 5000
    proc.heartbeats(now, None)  # every GPU published once: the steady state starts here
    seq, costs, states = args.samples + 1, [], 0
    per_s = max(1, int(args.gpus * args.share))
    cursor = 0
    for _ in range(args.seconds):
        now += 1000
        seq += 1
        for _ in range(per_s):  # new samples for a rolling share of the fleet
            n, g = divmod(cursor % (nodes * 8), 8)
            proc.on_telemetry(_batch(n, seq, now, [g]), n % 8, now)
            cursor += 1
        started = time.perf_counter()
        states += len(proc.heartbeats(now, None))
        costs.append((time.perf_counter() - started) * 1000)
    print(json.dumps({"gpus": nodes * 8, "heartbeat_ms_p50": round(statistics.median(costs), 2),
                      "heartbeat_ms_max": round(max(costs), 2), "states_per_s": round(states / args.seconds, 1),
                      "share_of_a_core": round(statistics.median(costs) / 1000, 4)}))


if __name__ == "__main__":
    main()
