"""How long a sample takes to reach ``gpu.state.v1`` under the stream's publishing rules alone, with no broker and
no lag: ``python -m gpuaware.bench.publish_latency [--nodes 32] [--seconds 300] [--on-change]``.

The GenTD26 agents of ``bench pipeline``'s load generator (the default sampling policy, its 5 s flush) are
simulated, each batch handed to a ``StreamProcessor`` at its flush time, the 1 s heartbeat run every second, and
every published state that carries a newer sample than the last state of its GPU is timed from that sample, as
``bench pipeline`` times the states it reads (its ``p99_sample_to_state_s``). By default a state goes out for every
new sample (at most once per ``min_publish_interval_ms``); ``--on-change`` times the other policy
(``stream.publish_every_sample: false``): a state only on a change past the signature's steps or a health change,
otherwise at the ``max_publish_interval_ms`` refresh (30 s), so a sample that moves nothing is carried by a later
state. JSON: ``every_sample``, ``samples`` (applied in the measured window), ``published`` (every state, timed or
not: what the scheduler's feed reads), ``states``, ``on_change`` / ``by_heartbeat`` (states of each kind timed),
``p50_s``, ``p99_s``, ``max_s`` (all), ``on_change_p99_s``, ``heartbeat_p99_s``, ``batch_age_p99_s`` (the oldest
sample of a batch at its flush).
"""

from __future__ import annotations

import argparse
import json

from gpuaware.agent.collectors.sim import Scenario
from gpuaware.agent.replay import simulate
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.bench.fleet_load import GPUS_PER_NODE, MODELS
from gpuaware.bench.pipeline_bench import _pct
from gpuaware.stream.gpu_state import TrackerSettings
from gpuaware.stream.processor import StreamProcessor

EPOCH_S = 1_700_000_000.0
WARMUP_S = 120  # past the agents' start-up and every GPU's first state


def measure(nodes: int, seconds: int, seed: int = 0, every_sample: bool = True) -> dict:
    policy = SamplingPolicy()
    scenario = Scenario(name="publish-latency", seed=seed, nodes=nodes, gpus_per_node=GPUS_PER_NODE, models=MODELS,
                        node_prefix="pl", duration_s=86400, library=False)
    proc = StreamProcessor({}, TrackerSettings(every_sample=every_sample))
    newest: dict[str, int] = {}
    timed: dict[str, list[float]] = {"on_change": [], "by_heartbeat": []}
    ages: list[float] = []
    published = [0]

    def seen(states: list, now_ms: int, kind: str, measured: bool) -> None:
        if measured:
            published[0] += len(states)
        for s in states:
            if s.sample_ts_ms > newest.get(s.gpu_uuid, 0):
                if measured and s.gpu_uuid in newest:
                    timed[kind].append((now_ms - s.sample_ts_ms) / 1000)
                newest[s.gpu_uuid] = s.sample_ts_ms

    samples = 0
    for tick in simulate(scenario, WARMUP_S + seconds, EPOCH_S, flush_every_s=int(policy.flush_s), policy=policy):
        now_ms = int((tick.second + 1) * 1000)
        measured = tick.second - EPOCH_S >= WARMUP_S
        for batch in tick.batches:
            if measured and batch.samples:
                ages.append(max(now_ms - batch.base_ts_ms - s.dt_ms for s in batch.samples) / 1000)
                samples += len(batch.samples)
            seen(proc.on_telemetry(batch, 0, now_ms), now_ms, "on_change", measured)
        seen(proc.heartbeats(now_ms, None), now_ms, "by_heartbeat", measured)
    every = timed["on_change"] + timed["by_heartbeat"]
    return {
        "gpus": nodes * GPUS_PER_NODE, "seconds": seconds, "every_sample": every_sample, "samples": samples,
        "published": published[0], "states": len(every),
        "on_change": len(timed["on_change"]), "by_heartbeat": len(timed["by_heartbeat"]),
        # As bench pipeline computes its percentiles, so that the two compare.
        "p50_s": _pct(every, 50), "p99_s": _pct(every, 99), "max_s": _pct(every, 100),
        "on_change_p99_s": _pct(timed["on_change"], 99), "heartbeat_p99_s": _pct(timed["by_heartbeat"], 99),
        "batch_age_p99_s": _pct(ages, 99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32, help="simulated 8-GPU nodes")
    parser.add_argument("--seconds", type=int, default=300, help="seconds measured (after a 120 s warm-up)")
    parser.add_argument("--on-change", action="store_true",
                        help="time stream.publish_every_sample: false (states on change and at the refresh)")
    args = parser.parse_args()
    print(json.dumps(measure(args.nodes, args.seconds, every_sample=not args.on_change)))


if __name__ == "__main__":
    main()
