"""On a machine with an NVIDIA GPU: exercise the NVML collector and the agent core, print what they read.

Run from the project root: ``python -m gpuaware.bench.nvml_check`` (start a GPU load beside it to see non-idle values).
"""

from __future__ import annotations

import dataclasses
import json
import time

from prometheus_client import CollectorRegistry, generate_latest

from gpuaware.agent.collectors.nvml import NvmlCollector
from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentCollector, AgentStats
from gpuaware.agent.sampling import SamplingPolicy


def main() -> None:
    c = NvmlCollector("gpu-box")
    devs = c.devices()
    print("DEVICES", json.dumps([dataclasses.asdict(d) for d in devs], default=str))

    def present(r):
        return {k: v for k, v in dataclasses.asdict(r).items() if v is not None}

    for i in range(2):
        print("FULL", i, json.dumps(present(c.read(0, full=True)), default=str))
        time.sleep(1)
    print("WATCH", json.dumps(present(c.read(0, full=False)), default=str))
    for full in (False, True):
        t, n = time.perf_counter(), 0
        while time.perf_counter() - t < 2:
            c.read(0, full=full)
            n += 1
        print(f"READ_US full={full}", round(2e6 / n, 1))
    core = AgentCore(c, SamplingPolicy())
    for i in range(6):
        out = core.tick(time.time())
        print("TICK", i, "samples", len(out.samples), "events", [(e.kind.value, e.message) for e in out.events],
              "interval", core.tracks[0].sampler.interval)
        time.sleep(1)
    registry = CollectorRegistry()
    registry.register(AgentCollector([core], AgentStats()))
    wanted = ("DCGM_", "gpuaware_gpu_health_score", "gpuaware_gpu_health_band")
    print("METRICS\n" + "\n".join(x for x in generate_latest(registry).decode().splitlines() if x.startswith(wanted)))
    print("XIDS", c.xid_events())
    try:  # what the agent would publish for DRA (agent.resource_slices); needs the kubernetes client
        from gpuaware.agent.resource_slices import node_gpus
        from gpuaware.plumbing.kube.resource_slices import node_slices

        print("RESOURCE_SLICES", json.dumps(node_slices("gpu-box", node_gpus(core), 1), default=str))
    except Exception as exc:  # reported, and the rest of the check stands
        print("RESOURCE_SLICES failed:", repr(exc))
    c.close()


if __name__ == "__main__":
    main()
