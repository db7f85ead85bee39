"""Departures: a bind waiting for its victims wakes when the pod watch sees them go."""

from __future__ import annotations

import asyncio

from gpuaware.scheduler.kube.departures import Departures


async def test_waiters_wake_when_the_pod_leaves_and_unknown_pods_are_ignored():
    departures = Departures()
    gone = departures.expect("default/v")
    assert departures.expect("default/v") is gone  # one event per pod, whoever asks first
    waiter = asyncio.create_task(gone.wait())
    departures.left("default/other")  # nobody waits for it
    await asyncio.sleep(0)
    assert not waiter.done()
    departures.left("default/v")
    await asyncio.wait_for(waiter, 1)
    assert departures.expect("default/v") is not gone  # forgotten once gone: a new pod of that name waits anew
