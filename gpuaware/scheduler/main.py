"""Run the scheduler process (``gpuaware scheduler``): ``gpuaware.scheduler.wiring`` until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib

from gpuaware.plumbing.gc_policy import loading_long_lived_heap
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.plumbing.signals import stop_on_signals
from gpuaware.scheduler.kube.live import LiveScheduler
from gpuaware.scheduler.settings import SchedulerSettings
from gpuaware.scheduler.wiring import build_scheduler


async def serve(kafka: KafkaSettings | None, settings: SchedulerSettings, metrics_host: str, metrics_port: int,
                stop: asyncio.Event, own_process: bool = False) -> LiveScheduler:
    """``own_process``: the process is the scheduler's alone, so its garbage collection is tuned for the heap
    the scheduler keeps once ready (``gpuaware.plumbing.gc_policy``)."""
    runtime = build_scheduler(settings, kafka)
    if metrics_port:
        runtime.serve_metrics(metrics_host, metrics_port)
    try:
        with loading_long_lived_heap() if own_process else contextlib.nullcontext():
            await runtime.start()
        await runtime.run(stop)
    finally:
        await runtime.stop()
    return runtime.live


def run_scheduler(kafka: KafkaSettings | None, settings: SchedulerSettings, metrics_host: str,
                  metrics_port: int) -> None:
    async def main() -> None:
        await serve(kafka, settings, metrics_host, metrics_port, stop_on_signals(), own_process=True)

    asyncio.run(main())
