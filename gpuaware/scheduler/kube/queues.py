"""What a GPUQueue grants a pod, and the core ``Tenant`` it becomes.

- A queue's ``quota`` is per GPU model (``"*"``: any model without its own entry); ``borrowing.enabled``
  and ``borrowing.limitGpus`` bound use beyond it (``gpuaware.scheduler.core.queue``). An entry's ``memoryGiB``
  caps the GPU memory the queue's pods hold on that model (fractional and MIG pods their own, whole GPUs
  all of theirs); gangs are held to all of it as a whole.
- ``priorityClasses``: when listed, a pod of the queue must use one of them (else it is rejected, with
  the reason as an Event); unlisted, any class is allowed.
- Only the queue grants non-preemptibility: a pod is non-preemptible when its priority is high and its
  queue admits that class. The pod's ``gpuaware.io/preemptible`` annotation may volunteer (``"true"``),
  never refuse.
- Namespaces in no queue follow ``scheduler.unqueued``: ``allow`` (as if one unlimited queue: the old
  behaviour), ``best-effort`` (the default: at most medium priority, always preemptible, no guarantee,
  and reclaimed from first), or ``reject``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuaware.scheduler.core.queue import Tenant
from gpuaware.scheduler.core.workload import PriorityLevel
from gpuaware.scheduler.kube.objects import PodSpecError, PodWorkload

UNQUEUED_POLICIES = ("allow", "best-effort", "reject")
UNQUEUED_TENANT = "unqueued"


def tenant_of(q: Any) -> Tenant:  # q: gpuaware.scheduler.kube.cache.Queue
    by_model = {m: int(g * 1000) for m, g in q.quota_by_model}
    return Tenant(q.tenant, q.weight, int(q.quota_gpus * 1000), q.borrow,
                  None if q.borrow_limit_gpus is None else int(q.borrow_limit_gpus * 1000),
                  by_model if set(by_model) != {"*"} else {},
                  {m: int(gib * 1024) for m, gib in q.memory_by_model})


def govern(pw: PodWorkload, pod: dict[str, Any], queue: Any | None, unqueued: str) -> PodWorkload:
    """``pw`` as its queue (or the unqueued policy) allows; raises ``PodSpecError`` for a pod it refuses."""
    w = pw.workload
    volunteered = w.preemptible and w.priority >= PriorityLevel.HIGH  # the pod said "true" itself
    if queue is None:
        if unqueued == "reject":
            raise PodSpecError(f"namespace {pod['metadata'].get('namespace', '')!r} is in no GPUQueue and "
                               f"scheduler.unqueued is reject")
        if unqueued == "best-effort":
            w = dataclasses.replace(w, tenant=UNQUEUED_TENANT, priority=min(w.priority, PriorityLevel.MEDIUM),
                                    preemptible=True)
            return dataclasses.replace(pw, workload=w)
        return dataclasses.replace(pw, workload=dataclasses.replace(
            w, preemptible=volunteered or w.priority < PriorityLevel.HIGH))
    cls = pod.get("spec", {}).get("priorityClassName") or ""
    if queue.priority_classes and cls not in queue.priority_classes:
        raise PodSpecError(f"priority class {cls or '(none)'!r} is not one GPUQueue {queue.name} allows "
                           f"({', '.join(queue.priority_classes)})")
    return dataclasses.replace(pw, workload=dataclasses.replace(
        w, preemptible=volunteered or w.priority < PriorityLevel.HIGH))
