"""PodGroup status: the ``PodGroupScheduled`` condition of each Workload API gang this scheduler places.

kube-apiserver 1.36 (``scheduling.k8s.io/v1alpha2``, ``kubectl explain podgroups.status.conditions``) documents
the condition a scheduler keeps on a PodGroup it schedules: ``PodGroupScheduled``, True once the gang's
requirement is met, False with reason ``Unschedulable`` when it cannot be placed. Kueue, JobSet and
``kubectl get podgroups -o wide`` read it, so a gang gpuaware refuses says why on the object its owner
watches, not only in its pods' Events.

Written when the condition changes (a flip moves ``lastTransitionTime``; a new message does not), from the
cache: the members are this scheduler's pods that name the group; the refusal is the ``FailedScheduling``
reason the pass reported for a pending member. Other conditions on the group (``DisruptionTarget``) are kept.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS
from gpuaware.scheduler.kube.cache_view import CacheView
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.objects import PodSpecError
from gpuaware.scheduler.kube.podgroups import gang_size
from gpuaware.scheduler.metrics import SchedulerStats

CONDITION = "PodGroupScheduled"


def wanted(size: int, bound: int, refused: str | None) -> tuple[str, str, str] | None:
    """(status, reason, message) of ``PodGroupScheduled`` for a gang of ``size`` with ``bound`` members bound and,
    when a pending member was refused, that refusal; None while there is nothing to say (not tried yet)."""
    if bound >= size:
        return "True", "Scheduled", f"{bound} bound (minCount {size})"
    if refused is not None:
        return "False", "Unschedulable", refused
    return None


def with_condition(status: dict[str, Any], new: tuple[str, str, str], generation: int | None,
                   now: datetime) -> list[dict[str, Any]] | None:
    """The group's conditions with ``PodGroupScheduled`` set to ``new``; None when it already says that."""
    conditions = list(status.get("conditions") or [])
    old = next((c for c in conditions if c.get("type") == CONDITION), None)
    state, reason, message = new
    if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == new:
        return None
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == state else None
    cond = {"type": CONDITION, "status": state, "reason": reason, "message": message[:32768],
            "lastTransitionTime": since or now.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if generation is not None:
        cond["observedGeneration"] = generation
    return [c for c in conditions if c.get("type") != CONDITION] + [cond]


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


class PodGroupStatusWriter:
    """``refusal``: the ``FailedScheduling`` reason last reported for a pod, or None."""

    def __init__(self, calls: ApiCalls, cache: CacheView, stats: SchedulerStats,
                 refusal: Callable[[str], str | None]):
        self.calls, self.cache, self.stats, self.refusal = calls, cache, stats, refusal
        # (group, uid) -> condition written: not written again before the watch shows it. By uid, so that a group
        # deleted and made again under its name (a Job run again) gets its condition; pruned to the groups there are.
        self.sent: dict[tuple[str, str], tuple[str, str, str]] = {}

    def conditions(self, now: datetime) -> dict[str, list[dict[str, Any]]]:
        """The groups whose condition changes, and their new conditions."""
        groups = self.cache.podgroups
        members: dict[str, list[str]] = {}
        for key, pod in self.cache.pods.items():
            if (pod.get("spec") or {}).get("schedulerName") == self.cache.scheduler_name and \
                    (group := groups.names(pod)) is not None:
                members.setdefault(group, []).append(key)
        out: dict[str, list[dict[str, Any]]] = {}
        self.sent = {k: v for k, v in self.sent.items()
                     if (obj := groups.groups.get(k[0])) is not None and _uid(obj) == k[1]}
        for group, keys in members.items():
            obj = groups.groups.get(group)
            if obj is None:
                continue
            sent_key = (group, _uid(obj))
            try:
                size = gang_size(obj)
            except PodSpecError:
                continue  # the members' rejection says why
            bound = sum(1 for k in keys if k in self.cache.running and k not in self.cache.assumed)
            refused = next((r for k in sorted(keys) if k in self.cache.pending and (r := self.refusal(k))), None)
            new = wanted(size, bound, refused)
            if new is None or self.sent.get(sent_key) == new:
                continue
            conditions = with_condition(obj.get("status") or {}, new, (obj.get("metadata") or {}).get("generation"),
                                        now)
            self.sent[sent_key] = new
            if conditions is not None:
                out[group] = conditions
        return out

    async def write(self) -> None:
        for group, conditions in self.conditions(datetime.now(UTC)).items():
            namespace, name = group.split("/", 1)
            try:
                await self.calls.call(self.calls.api.patch_pod_group_status, namespace, name,
                                      {"conditions": conditions})
            except (ApiException, *TRANSPORT_ERRORS) as exc:
                self.sent = {k: v for k, v in self.sent.items() if k[0] != group}  # tried again on the next tick
                self.stats.api_errors[("patch-podgroup-status", getattr(exc, "status", 0) or 0)] += 1
