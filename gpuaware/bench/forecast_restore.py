"""What a worker restart costs the forecasts: rebuilt from the retained history vs never restarted.

    python -m gpuaware.bench.forecast_restore [--gpus 16] [--before-min 180] [--after-min 60]

Replays the agents of a simulated cluster (GenTD26 pods) on a simulated clock into per-GPU
trackers. At ``before-min`` each tracker is snapshotted as the changelog stores it (JSON) and
restored, which rebuilds its forecasters from the last 60 minutes; both copies then learn the
same ``after-min`` minutes. Prints JSON: the 5-minute utilisation forecast MAE of each copy over
that hour, the mean absolute difference between their forecasts, and the rebuild time per GPU.
"""

from __future__ import annotations

import argparse
import json
import time

from gpuaware.agent.collectors.sim import Scenario
from gpuaware.agent.replay import simulate
from gpuaware.stream.gpu_state import GpuTracker

METRIC, HORIZON_S = "util_gpu", 300


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--before-min", type=int, default=180)
    ap.add_argument("--after-min", type=int, default=60)
    args = ap.parse_args()
    scenario = Scenario(name="restore", seed=11, nodes=max(1, args.gpus // 8), gpus_per_node=min(8, args.gpus),
                        models=["H100", "A100"], duration_s=86400)
    total_s = (args.before_min + args.after_min) * 60
    start = time.time() - total_s
    live: dict[str, GpuTracker] = {}
    restored: dict[str, GpuTracker] = {}
    rebuild_s: list[float] = []
    # (uuid, minute) -> forecast made then, for the value HORIZON later; per copy
    made: dict[str, dict[tuple[str, int], float]] = {"live": {}, "restored": {}}
    actual: dict[tuple[str, int], float] = {}
    restart_at = start + args.before_min * 60
    for tick in simulate(scenario, total_s, start):
        if not restored and tick.second >= restart_at:
            for uuid, t in live.items():
                began = time.perf_counter()
                restored[uuid] = GpuTracker.from_dict(json.loads(json.dumps(t.to_dict())))
                rebuild_s.append(time.perf_counter() - began)
        for batch in tick.batches:
            for sample in batch.samples:
                info = batch.gpus[sample.gpu]
                ts = batch.base_ts_ms + sample.dt_ms
                copies = {"live": live.setdefault(info.uuid, GpuTracker(info.uuid))}
                if restored:
                    copies["restored"] = restored[info.uuid]
                for name, t in copies.items():
                    last = t.history[-1][0] if t.history else None
                    t.learn_sample(batch.node, info, sample, ts, ts)  # replayed as if live: arrival = stamp
                    if t.history and t.history[-1][0] != last and restored:  # a minute closed: note its forecast
                        minute = t.history[-1][0]
                        actual[(info.uuid, minute)] = t.history[-1][1]
                        for f in t.forecasts:
                            if f.metric == METRIC and f.horizon_s == HORIZON_S:
                                made[name][(info.uuid, minute + HORIZON_S // 60)] = f.mean
    both = [k for k in made["live"] if k in made["restored"] and k in actual]
    mae = {name: sum(abs(made[name][k] - actual[k]) for k in both) / max(len(both), 1) for name in made}
    diff = sum(abs(made["live"][k] - made["restored"][k]) for k in both) / max(len(both), 1)
    print(json.dumps({
        "gpus": len(live), "before_min": args.before_min, "after_min": args.after_min, "forecasts_compared": len(both),
        "mae_util_5min_live": round(mae["live"], 3), "mae_util_5min_restored": round(mae["restored"], 3),
        "mean_abs_forecast_difference": round(diff, 3),
        "rebuild_ms_per_gpu": round(1000 * sum(rebuild_s) / max(len(rebuild_s), 1), 2),
    }, indent=2))


if __name__ == "__main__":
    main()
