"""gpuaware.scheduler.main.serve: in its own process the collector is held while the scheduler loads, and never left
off."""

from __future__ import annotations

import asyncio
import gc

import pytest

from gpuaware.scheduler import main
from gpuaware.scheduler.settings import SchedulerSettings


class _FailingStart:
    stopped = False

    async def start(self) -> None:
        assert not gc.isenabled()  # loading: no collection walks the growing heap
        raise TimeoutError("informers not synced")

    async def stop(self) -> None:
        self.stopped = True


async def test_a_failed_start_leaves_the_collector_on(monkeypatch):
    runtime = _FailingStart()
    monkeypatch.setattr(main, "build_scheduler", lambda settings, kafka: runtime)
    before = gc.get_threshold()
    try:
        with pytest.raises(TimeoutError):
            await main.serve(None, SchedulerSettings(), "127.0.0.1", 0, asyncio.Event(), own_process=True)
        assert gc.isenabled() and runtime.stopped
    finally:
        gc.enable()
        gc.unfreeze()
        gc.set_threshold(*before)
