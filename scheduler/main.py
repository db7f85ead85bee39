"""Run the scheduler process (``gpuaware scheduler``): ``scheduler.wiring`` until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib

from plumbing.gc_policy import loading_long_lived_heap
from plumbing.kafka_settings import KafkaSettings
from plumbing.signals import stop_on_signals
from scheduler.kube.live import LiveScheduler
from scheduler.settings import SchedulerSettings
from scheduler.wiring import build_scheduler


async def serve(kafka: KafkaSettings | None, settings: SchedulerSettings, metrics_host: str, metrics_port: int,
                stop: asyncio.Event, own_process: bool = False) -> LiveScheduler:
    """``own_process``: the process is the scheduler's alone, so its garbage collection is tuned for the heap
    the scheduler keeps once ready (``plumbing.gc_policy``)."""
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
