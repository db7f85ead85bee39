"""What the stream worker's timers cost at fleet size: ``python -m gpuaware.bench.stream_timers --gpus 50000``.

Builds a processor holding ``--gpus`` GPUs (8 per node, three batches each), then for ``--rounds`` rounds of
5 s: ``--share`` of the nodes send a batch of ``--samples`` of their GPUs' samples (the default sampling policy's
~0.1 samples per GPU per second: ~4 per 8-GPU node in 5 s, from nearly every node), and times the fleet peer
check and the node rollups (each every 5 s) and one heartbeat (every 1 s) after the round. JSON: ``gpus``,
``share``, ``fleet_check_ms_p50``, ``node_states_ms_p50``, ``heartbeat_ms_p50``, and ``share_of_a_core`` (the
three at their rates).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from gpuaware.bench.heartbeat_cost import T0, _batch
from gpuaware.stream.processor import StreamProcessor

PARTITIONS = 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=50_000)
    ap.add_argument("--share", type=float, default=0.98, help="Nodes sending a batch in each 5 s round.")
    ap.add_argument("--samples", type=int, default=4, help="Samples in a node's batch (of its 8 GPUs).")
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    rng = random.Random(0)
    proc = StreamProcessor({})
    nodes = max(1, args.gpus // 8)
    owned = set(range(PARTITIONS))
    for seq in range(1, 4):
        for n in range(nodes):
            proc.on_telemetry(_batch(n, seq, T0 + seq * 5000, list(range(8))), n % PARTITIONS, T0 + seq * 5000)
    now = T0 + 4 * 5000
    proc.node_states(now, owned)
    proc.heartbeats(now, owned)
    fleet, rollups, heartbeat = [], [], []
    for seq in range(5, 5 + args.rounds):
        now += 5000
        for n in range(nodes):
            if rng.random() < args.share:
                gpus = sorted(rng.sample(range(8), min(8, args.samples)))
                proc.on_telemetry(_batch(n, seq, now, gpus), n % PARTITIONS, now)
        for costs, timer in ((fleet, proc.fleet_check), (rollups, proc.node_states), (heartbeat, proc.heartbeats)):
            started = time.perf_counter()
            timer(now, owned)
            costs.append((time.perf_counter() - started) * 1000)
    p50 = {name: statistics.median(costs) for name, costs in
           (("fleet_check", fleet), ("node_states", rollups), ("heartbeat", heartbeat))}
    print(json.dumps({"gpus": nodes * 8, "share": args.share, **{f"{k}_ms_p50": round(v, 1) for k, v in p50.items()},
                      "share_of_a_core": round((p50["fleet_check"] / 5 + p50["node_states"] / 5 + p50["heartbeat"])
                                               / 1000, 4)}))


if __name__ == "__main__":
    main()
