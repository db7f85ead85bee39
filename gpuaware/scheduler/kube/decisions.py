"""Where decisions go besides Events: a publisher (``scheduler.decisions.v1`` in the runner) and a bounded log."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpuaware.contract.events import DecisionAction, GpuAssignment, SchedulerDecision
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.metrics import PRIORITY_NAMES

log = logging.getLogger(__name__)


class DecisionPublisher(Protocol):
    async def __call__(self, record: SchedulerDecision) -> None: ...


async def discard_decision(record: SchedulerDecision) -> None:
    """The default publisher: no decision log beyond Events and ``DecisionSink.recent``."""


@dataclass
class Outcome:
    """What happened to one pod (or GPU), for tests, the live view and the decision log."""

    key: str
    action: DecisionAction
    node: str | None = None
    reasons: list[str] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)  # stream signals the decision read
    steered_by: list[str] = field(default_factory=list)  # the ones that changed the placement


class DecisionSink:
    def __init__(self, publish: DecisionPublisher = discard_decision, keep: int = 10_000,
                 on_pod: Callable[[str, str, str, str | None, float], None] | None = None):
        """``on_pod(key, action, first reason, node, unix time)`` hears each pod's decision (the metrics' per-pod
        view: ``SchedulerStats.pod_decided``); GPU decisions (cordons, resumes) have no workload and skip it."""
        self.recent: list[Outcome] = []
        self.keep = keep
        self._publish = publish
        self._on_pod = on_pod

    async def record(self, outcome: Outcome, w: Workload | None, assignments: list[GpuAssignment] | None = None,
                     sharing: str | None = None, score: float | None = None, latency_s: float | None = None) -> None:
        self.recent.append(outcome)
        if len(self.recent) > self.keep:
            del self.recent[: len(self.recent) - self.keep]
        if w is not None and self._on_pod is not None:
            self._on_pod(outcome.key, outcome.action.value, (outcome.reasons or [""])[0], outcome.node, time.time())
        record = SchedulerDecision(
            decision_id=uuid.uuid4().hex, ts_ms=int(time.time() * 1000), workload_id=outcome.key,
            action=outcome.action, tenant=w.tenant if w else None,
            priority=PRIORITY_NAMES.get(w.priority) if w else None, node=outcome.node,
            assignments=assignments or [], sharing=sharing, reasons=outcome.reasons[:8], score=score,
            latency_us=int(latency_s * 1e6) if latency_s is not None else None,
            signals=list(outcome.signals), steered_by=list(outcome.steered_by))
        try:
            await self._publish(record)
        except Exception as exc:  # the decision stands; losing its log line must not stop scheduling
            log.warning("could not publish decision for %s: %s", outcome.key, exc)
