"""What encoding one ``gpu.state.v1`` record costs a stream worker: ``python -m gpuaware.bench.state_encoding``.

``GpuStateCodec`` (gpuaware.stream.state_codec, what the worker's ``StatePublisher`` uses) against the contract's
``encode`` with the forecasts kept encoded per GPU and spliced in (``KeptField``, the publisher's encoder before the
codec), on the same states: 1,000 GPUs' states with six forecasts and five health components, as a worker publishes
them (the forecasts the same list from state to state, a new one each minute). CPU time (``time.process_time``), so a
loaded machine changes the figures less than wall time would; the best of ``--passes`` passes, ``--rounds`` rounds of
the two interleaved. JSON: ``kept_forecasts_us`` and ``codec_us`` per round (CPU microseconds per state), ``ratio`` of
their medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from gpuaware.contract.events import Forecast, GpuState, HealthAction, HealthBand, HealthVerdict
from gpuaware.stream.publisher import KeptField
from gpuaware.stream.state_codec import GpuStateCodec

T0_MS = 1_800_000_000_000


def states(gpus: int) -> list[GpuState]:
    forecasts = [Forecast(metric, minutes * 60, 50.123, 40.1, 60.2) for metric in ("util_gpu", "fb_used_mib")
                 for minutes in (1, 5, 15)]
    return [GpuState(
        gpu_uuid=f"GPU-{i:08d}-bench", node=f"node-{i // 8:05d}", model="NVIDIA H100 80GB HBM3",
        sample_ts_ms=T0_MS + i, published_ms=T0_MS + 500, util_gpu=55.12, util_mem=33.2, fb_used_mib=40000.5,
        fb_total_mib=81559, power_w=350.5, temp_c=65.2, health_score=98.5, health_band=HealthBand.HEALTHY,
        health_components={"thermal": 1.0, "power": 0.98, "ecc": 1.0, "xid": 1.0, "memory_wear": 0.99},
        forecasts=forecasts, workload_class="training", class_confidence=0.87, samples=1234 + i,
        verdict=HealthVerdict.PASS, recommended_action=HealthAction.NONE) for i in range(gpus)]


def cpu_us_per_state(encode: Callable[[GpuState, bytes], bytes], batch: list[GpuState], passes: int) -> float:
    best = float("inf")
    for _ in range(passes):
        started = time.process_time()
        for s in batch:
            encode(s, s.gpu_uuid.encode())
        best = min(best, time.process_time() - started)
    return round(best / len(batch) * 1e6, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    batch = states(args.gpus)
    kept, codec = KeptField(GpuState, "forecasts"), GpuStateCodec()
    for s in batch:  # the same bytes (and each encoder's per-GPU parts kept before the timing)
        if codec.encode(s, s.gpu_uuid.encode()) != kept.encode(s, s.gpu_uuid.encode()):
            raise SystemExit(f"the codec's bytes differ from encode's for {s.gpu_uuid}")
    out: dict[str, list[float]] = {"kept_forecasts_us": [], "codec_us": []}
    for _ in range(args.rounds):
        out["kept_forecasts_us"].append(cpu_us_per_state(kept.encode, batch, args.passes))
        out["codec_us"].append(cpu_us_per_state(codec.encode, batch, args.passes))
    ratio = statistics.median(out["kept_forecasts_us"]) / statistics.median(out["codec_us"])
    print(json.dumps({**out, "ratio": round(ratio, 2), "gpus": args.gpus}))


if __name__ == "__main__":
    main()
