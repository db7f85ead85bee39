"""The scheduling queue: our unbound pods, as workloads waiting for a pass, or refused with a reason.

kube-scheduler keeps its queue apart from its cache (``internal/queue`` beside ``internal/cache``); so
does this: ``ClusterCache`` decides what goes in (a pod of ours, unbound, readable), the pass takes out
what it places (``pop``), and a failed binding cycle puts a pod back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpuaware.scheduler.kube.objects import PodWorkload


@dataclass
class Rejected:
    pod: dict[str, Any]
    reason: str


class SchedulingQueue:
    """Each key is pending (``pending``: its workload) or refused (``rejected``: the reason, an Event), never
    both."""

    def __init__(self) -> None:
        self.pending: dict[str, PodWorkload] = {}
        self.rejected: dict[str, Rejected] = {}

    def add(self, key: str, pw: PodWorkload) -> None:
        self.rejected.pop(key, None)
        self.pending[key] = pw

    def refuse(self, key: str, pod: dict[str, Any], reason: str) -> None:
        """Left alone with ``reason`` until the pod or what it depends on changes."""
        self.pending.pop(key, None)
        self.rejected[key] = Rejected(pod, reason)

    def pop(self, key: str) -> PodWorkload | None:
        """Out of the queue (placed, bound, gone, or read again); its workload if it was pending."""
        self.rejected.pop(key, None)
        return self.pending.pop(key, None)

    def clear(self) -> None:
        self.pending.clear()
        self.rejected.clear()

    def waiting(self) -> Iterator[str]:
        """Every key in the queue, pending or refused."""
        yield from self.pending
        yield from self.rejected
