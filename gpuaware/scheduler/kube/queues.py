"""GPUQueues: what one grants a pod, the core ``Tenant`` it becomes, and which namespace is whose (``Tenancy``).

- A queue's ``quota`` is per GPU model (``"*"``: any model without its own entry); ``borrowing.enabled``
  and ``borrowing.limitGpus`` bound use beyond it (``gpuaware.scheduler.core.queue``). An entry's ``memoryGiB``
  caps the GPU memory the queue's pods hold on that model (fractional and MIG pods their own, whole GPUs
  all of theirs); gangs are held to all of it as a whole.
- ``priorityClasses``: when listed, a pod of the queue must use one of them (else it is rejected, with
  the reason as an Event); unlisted, any class is allowed.
- Only the queue grants non-preemptibility: a pod is non-preemptible when its priority is high and its
  queue admits that class. The pod's ``gpuaware.io/preemptible`` annotation may volunteer (``"true"``),
  never refuse.
- Kueue's ``kueue.x-k8s.io/queue-name`` label on a pod picks the GPUQueue of that name, when one exists and
  lists the pod's namespace (a label cannot claim another tenant's quota); else the namespace's queue, as
  without the label. Kueue's LocalQueue is namespaced (the label names one in the pod's namespace); so is
  this reading of it.
- Namespaces in no queue follow ``scheduler.unqueued``: ``allow`` (as if one unlimited queue: the old
  behaviour), ``best-effort`` (the default: at most medium priority, always preemptible, no guarantee,
  and reclaimed from first), or ``reject``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

from gpuaware.scheduler.core.queue import Tenant
from gpuaware.scheduler.core.remediation import DEFAULT_EVICTION_MODE, EvictionMode, eviction_mode
from gpuaware.scheduler.core.workload import PriorityLevel
from gpuaware.scheduler.kube.objects import PodSpecError, PodWorkload, created_s

log = logging.getLogger(__name__)

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
UNQUEUED_POLICIES = ("allow", "best-effort", "reject")
UNQUEUED_TENANT = "unqueued"
DEFAULT_TENANT = "default"


class QueueSpecError(ValueError):
    """A GPUQueue the scheduler cannot read."""


@dataclass(frozen=True)
class Queue:
    """What the scheduler reads of a GPUQueue."""

    name: str
    tenant: str
    namespaces: tuple[str, ...]
    weight: float
    quota_gpus: float  # the sum over models
    borrow: bool
    generation: int
    created: float
    quota_by_model: tuple[tuple[str, float], ...] = ()  # (model or "*", GPUs)
    borrow_limit_gpus: float | None = None
    priority_classes: tuple[str, ...] = ()  # empty: any
    memory_by_model: tuple[tuple[str, float], ...] = ()  # (model or "*", GiB of GPU memory at most)
    eviction_mode: EvictionMode = DEFAULT_EVICTION_MODE  # its pods on a GPU taken out of service for its health

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Queue:
        """The queue, or ``QueueSpecError`` naming it: the apiserver validates the schema, but an informer
        must not die on an object stored before a schema change (or by a server without one)."""
        try:
            return cls._of(obj)
        except (TypeError, ValueError, AttributeError, KeyError, ArithmeticError) as exc:  # int(inf): OverflowError
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            name = meta.get("name", "?") if isinstance(meta, dict) else "?"
            raise QueueSpecError(f"GPUQueue {name!r} is ignored: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def _of(cls, obj: dict[str, Any]) -> Queue:
        spec = obj.get("spec") or {}
        for field_name in ("namespaces", "priorityClasses"):
            values = spec.get(field_name) or []
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ValueError(f"spec.{field_name} must be a list of names")
        if not isinstance(spec.get("tenant", DEFAULT_TENANT), str):
            raise ValueError("spec.tenant must be a name")
        borrowing = spec.get("borrowing") or {}
        by_model: dict[str, float] = {}
        memory: dict[str, float] = {}
        for i, e in enumerate(spec.get("quota") or []):
            model = str(e.get("model") or "*")
            by_model[model] = by_model.get(model, 0.0) + _amount(e.get("gpus", 0), f"spec.quota[{i}].gpus")
            if e.get("memoryGiB") is not None:
                gib = _amount(e["memoryGiB"], f"spec.quota[{i}].memoryGiB")
                if gib == 0 and by_model[model] > 0:  # the CRD's rule, for objects stored before it
                    raise ValueError(f"spec.quota[{i}].memoryGiB: 0 would refuse every pod the quota's gpus grant")
                memory[model] = memory.get(model, 0.0) + gib
        limit = borrowing.get("limitGpus")
        return cls(obj["metadata"]["name"], spec.get("tenant", DEFAULT_TENANT), tuple(spec.get("namespaces") or ()),
                   float(spec.get("weight", 1)), sum(by_model.values()), bool(borrowing.get("enabled", True)),
                   int(obj["metadata"].get("generation", 1)), created_s(obj), tuple(sorted(by_model.items())),
                   None if limit is None else _amount(limit, "spec.borrowing.limitGpus"),
                   tuple(spec.get("priorityClasses") or ()), tuple(sorted(memory.items())),
                   eviction_mode(spec.get("evictionMode"), "spec.evictionMode"))


def _amount(value: Any, field: str) -> float:
    """A non-negative finite number (GPUs, GiB); else ``ValueError`` naming the field and the reason."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{field}: {value!r} is not a non-negative number")
    return float(value)


def queue_or_none(obj: dict[str, Any]) -> Queue | None:
    try:
        return Queue.of(obj)
    except QueueSpecError as exc:
        log.error("%s", exc)
        return None


class Tenancy:
    """The GPUQueues the informer saw and what they make of each namespace: its tenant and the queue that
    governs its pods (the oldest queue naming a namespace keeps it); ``unqueued``: what namespaces in no queue
    get (``scheduler.unqueued``)."""

    def __init__(self, unqueued: str = "allow"):
        self.unqueued = unqueued
        self.queues: dict[str, Queue] = {}
        self.tenants_by_namespace: dict[str, str] = {}
        self.queue_by_namespace: dict[str, Queue] = {}
        self._named: dict[str, tuple[str, tuple[str, ...]]] = {}  # what a queue-name label can pick, by queue

    def sync(self, items: list[dict[str, Any]]) -> bool:
        """The queues listed; True when a namespace's tenant or queue changed."""
        self.queues = {q.name: q for q in filter(None, map(queue_or_none, items))}
        return self._remap()

    def event(self, kind: str, obj: dict[str, Any]) -> bool:
        """One queue's change; True when a namespace's tenant or queue changed."""
        q = None if kind == "DELETED" else queue_or_none(obj)
        if q is None:
            self.queues.pop((obj.get("metadata") or {}).get("name", ""), None)
        else:
            self.queues[q.name] = q
        return self._remap()

    def _remap(self) -> bool:
        mapping: dict[str, str] = {}
        owners: dict[str, Queue] = {}
        for q in sorted(self.queues.values(), key=lambda q: q.created):
            for ns in q.namespaces:
                mapping.setdefault(ns, q.tenant)
                owners.setdefault(ns, q)
        named = {q.name: (q.tenant, q.namespaces) for q in self.queues.values()}
        if mapping == self.tenants_by_namespace and owners == self.queue_by_namespace and named == self._named:
            return False
        self.tenants_by_namespace, self.queue_by_namespace, self._named = mapping, owners, named
        return True

    def labelled(self, pod: dict[str, Any]) -> Queue | None:
        """The GPUQueue the pod's ``kueue.x-k8s.io/queue-name`` label names, when it exists and lists the pod's
        namespace."""
        meta = pod["metadata"]
        name = (meta.get("labels") or {}).get(KUEUE_QUEUE_LABEL)
        q = self.queues.get(name) if name else None
        return q if q is not None and meta.get("namespace", "") in q.namespaces else None

    def tenant_of(self, pod: dict[str, Any]) -> str:
        if (q := self.labelled(pod)) is not None:
            return q.tenant
        fallback = UNQUEUED_TENANT if self.unqueued == "best-effort" else DEFAULT_TENANT
        return self.tenants_by_namespace.get(pod["metadata"].get("namespace", ""), fallback)

    def queue_of(self, pod: dict[str, Any]) -> Queue | None:
        return self.labelled(pod) or self.queue_by_namespace.get(pod["metadata"].get("namespace", ""))

    def govern(self, pw: PodWorkload, pod: dict[str, Any]) -> PodWorkload:
        """``pw`` as the pod's queue (or the unqueued policy) allows; raises ``PodSpecError`` for a pod refused."""
        return govern(pw, pod, self.queue_of(pod), self.unqueued)

    def tenants(self) -> dict[str, Tenant]:
        """The core's tenants, one per queue's tenant (and the unqueued one under ``best-effort``)."""
        out = {q.tenant: tenant_of(q) for q in self.queues.values()}
        if self.unqueued == "best-effort":
            out[UNQUEUED_TENANT] = Tenant(UNQUEUED_TENANT, unqueued=True)
        return out


def tenant_of(q: Queue) -> Tenant:
    by_model = {m: int(g * 1000) for m, g in q.quota_by_model}
    return Tenant(q.tenant, q.weight, int(q.quota_gpus * 1000), q.borrow,
                  None if q.borrow_limit_gpus is None else int(q.borrow_limit_gpus * 1000),
                  by_model if set(by_model) != {"*"} else {},
                  {m: int(gib * 1024) for m, gib in q.memory_by_model})


def govern(pw: PodWorkload, pod: dict[str, Any], queue: Queue | None, unqueued: str) -> PodWorkload:
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
