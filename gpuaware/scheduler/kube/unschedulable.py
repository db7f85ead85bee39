"""Pods that cannot be placed: a ``FailedScheduling`` Event and an UNSCHEDULABLE decision, once per reason."""

from __future__ import annotations

from gpuaware.contract.events import DecisionAction
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.kube.cache_view import CacheView
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.decisions import DecisionSink, Outcome
from gpuaware.scheduler.kube.tasks import Tasks
from gpuaware.scheduler.metrics import SchedulerStats


class UnschedulableReporter:
    def __init__(self, calls: ApiCalls, cache: CacheView, stats: SchedulerStats, sink: DecisionSink,
                 tasks: Tasks):
        self.calls, self.cache, self.stats, self.sink, self.tasks = calls, cache, stats, sink, tasks
        self._reported: dict[str, str] = {}  # pod -> last FailedScheduling message written

    def unschedulable(self, w: Workload, reason: str, label: str) -> None:
        """``label``: the metric label of ``reason``, from its code
        (``gpuaware.scheduler.core.status.reason_label``)."""
        pod = self.cache.pods.get(w.id)
        if pod is None or self._reported.get(w.id) == reason:
            return
        if not self.calls.event(pod, "FailedScheduling", reason, "Warning"):
            return  # dropped (the Events lane is full): reported on a later pass
        self._reported[w.id] = reason
        self.stats.decisions[("UNSCHEDULABLE", label)] += 1
        self.tasks.spawn(self.sink.record(Outcome(w.id, DecisionAction.UNSCHEDULABLE, None, [reason]), w))

    def report_rejected(self) -> None:
        """Pods whose gpuaware request the cache could not parse."""
        for key, rej in self.cache.rejected.items():
            if self._reported.get(key) != rej.reason and self.calls.event(
                    rej.pod, "FailedScheduling", f"invalid gpuaware request: {rej.reason}", "Warning"):
                self._reported[key] = rej.reason
                self.stats.decisions[("UNSCHEDULABLE", "invalid-request")] += 1

    def refusal(self, key: str) -> str | None:
        """The ``FailedScheduling`` reason last reported for pod ``key``, or None."""
        return self._reported.get(key)

    def forget(self, key: str) -> None:
        """The pod was placed or left: a later failure is reported again."""
        self._reported.pop(key, None)
