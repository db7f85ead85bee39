"""``gpuaware bench agent``: what the agent costs a node (8 simulated GPUs or the node's real ones through
NVML, 1 s floor, real broker).

Runs the real runtime in this process against a real Kafka-protocol broker for ``seconds`` of wall
time, after a warm-up, and reports: CPU as a percent of one core (process CPU time / wall time),
resident memory (VmRSS and its peak VmHWM), bytes per GPU sample on the wire (record value + key,
before and after zstd), and the size of a dcgm-exporter-style text scrape per GPU.
"""

from __future__ import annotations

import asyncio
import tempfile
import time

import cramjam
from prometheus_client import CollectorRegistry

from gpuaware.agent.collectors.base import Collector
from gpuaware.agent.collectors.sim import SimCluster, load_scenario
from gpuaware.agent.exporter import AgentCollector, render
from gpuaware.agent.runtime import AgentRuntime
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract import events, topics
from gpuaware.contract.dcgm import FAMILIES
from gpuaware.plumbing.kafka_settings import KafkaSettings


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class _Measuring(AgentRuntime):
    """The runtime, also keeping the encoded telemetry batches for the byte figures."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batch_sizes: list[tuple[int, int, int]] = []  # (samples, raw bytes, zstd bytes)

    def flush(self) -> None:
        for builder in self.builders:
            batch = builder.build()
            if batch is None:
                continue
            value = events.encode(batch)
            raw = len(value) + len(batch.key())
            zstd = len(bytes(cramjam.zstd.compress(value))) + len(batch.key())
            self.batch_sizes.append((len(batch.samples), raw, zstd))
            self.publisher.enqueue(topics.TELEMETRY, batch.key(), value)
            self.samples_published += len(batch.samples)


def _collectors(collector: str, gpus: int) -> list[Collector]:
    if collector == "nvml":
        from gpuaware.agent.collectors.nvml import NvmlCollector

        return [NvmlCollector()]
    scenario = load_scenario("baseline").model_copy(update={"nodes": 1, "gpus_per_node": gpus, "models": ["H100"]})
    return list(SimCluster(scenario).collectors())


async def _run(kafka: KafkaSettings, seconds: float, warmup: float, gpus: int, collector: str) -> dict:
    collectors = _collectors(collector, gpus)
    gpus = sum(len(c.devices()) for c in collectors)
    with tempfile.TemporaryDirectory() as spool:
        runtime = _Measuring(collectors, kafka, SamplingPolicy(floor_s=1.0), spool)
        stop = asyncio.Event()
        task = asyncio.create_task(runtime.run(stop, control=True))
        await asyncio.sleep(warmup)
        cpu0, wall0 = time.process_time(), time.monotonic()
        samples0, watch0 = runtime.cores[0].samples_taken, runtime.cores[0].watch_reads
        await asyncio.sleep(seconds)
        cpu1, wall1 = time.process_time(), time.monotonic()
        samples1, watch1 = runtime.cores[0].samples_taken, runtime.cores[0].watch_reads
        rss = _status_kib("VmRSS") / 1024
        stop.set()
        await task
    registry = CollectorRegistry()
    registry.register(AgentCollector(runtime.cores, runtime.stats))
    text = render(registry).decode()
    dcgm_names = set(FAMILIES)
    dcgm_text = "".join(line + "\n" for line in text.splitlines()
                        if any(line.startswith(n) or line.startswith(f"# HELP {n} ") or line.startswith(f"# TYPE {n} ")
                               for n in dcgm_names))
    n_samples = sum(s for s, _, _ in runtime.batch_sizes)
    return {
        "collector": collector,
        "gpus": gpus,
        "floor_s": 1.0,
        "seconds": round(wall1 - wall0, 1),
        "cpu_percent_of_core": round(100 * (cpu1 - cpu0) / (wall1 - wall0), 3),
        "rss_mib": round(rss, 1),
        "rss_peak_mib": round(_status_kib("VmHWM") / 1024, 1),
        "watch_reads_per_s": round((watch1 - watch0) / (wall1 - wall0), 2),
        "samples_per_s": round((samples1 - samples0) / (wall1 - wall0), 2),
        "bytes_per_gpu_sample": round(sum(b for _, b, _ in runtime.batch_sizes) / max(n_samples, 1), 1),
        "bytes_per_gpu_sample_zstd": round(sum(z for _, _, z in runtime.batch_sizes) / max(n_samples, 1), 1),
        "dcgm_text_bytes_per_gpu": round(len(dcgm_text.encode()) / gpus, 1),
        "records_sent": runtime.stats.records_sent,
        "spool_dropped": runtime.spool.dropped,
        "publish_errors": runtime.stats.publish_errors,
    }


def bench_agent(kafka: KafkaSettings, seconds: float = 60.0, warmup: float = 5.0, gpus: int = 8,
                collector: str = "sim") -> dict:
    """``collector`` "sim": ``gpus`` simulated H100s; "nvml": this machine's GPUs (``gpus`` is then ignored)."""
    return asyncio.run(_run(kafka, seconds, warmup, gpus, collector))
