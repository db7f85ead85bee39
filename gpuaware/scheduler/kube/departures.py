"""Pods on their way out (preempted victims) and the binds that wait for them to be gone."""

from __future__ import annotations

import asyncio


class Departures:
    def __init__(self) -> None:
        self._gone: dict[str, asyncio.Event] = {}

    def expect(self, key: str) -> asyncio.Event:
        """The event set when ``key`` leaves the cluster (created on first ask)."""
        return self._gone.setdefault(key, asyncio.Event())

    def expected(self, key: str) -> bool:
        """``key`` is on its way out by this scheduler's doing (preempted)."""
        return key in self._gone

    def left(self, key: str) -> None:
        """From the pod watch: ``key`` is gone."""
        event = self._gone.pop(key, None)
        if event is not None:
            event.set()
