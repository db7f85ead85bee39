"""Tasks: spawned tasks are tracked until done and cancelled together on stop."""

from __future__ import annotations

import asyncio

from gpuaware.scheduler.kube.tasks import Tasks


async def test_done_tasks_are_forgotten_and_the_rest_cancelled_on_stop():
    tasks = Tasks()
    forever = asyncio.Event()
    done = tasks.spawn(asyncio.sleep(0))
    stuck = tasks.spawn(forever.wait())
    await done
    await asyncio.sleep(0)  # the done callback runs on the next loop turn
    assert len(tasks) == 1
    await tasks.cancel_all()
    assert stuck.cancelled() and len(tasks) == 0
