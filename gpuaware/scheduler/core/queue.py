"""Queue order and tenant accounting: priority first, then dominant-resource fairness, then arrival.

Each tenant has a weight and a guaranteed GPU quota; a tenant may borrow idle capacity beyond its
quota (the borrowed work is preemptible and reclaimed when an owner needs it back).

Limits (Kueue's ClusterQueue ideas), all off for a ``Tenant`` built with defaults so
the simulator's tenants behave as before:
- ``borrow=False``: never beyond the quota; ``borrow_limit_milli``: at most that far beyond it;
- ``quota_by_model``: a quota per GPU model (``"*"``: models without their own entry); use of a model
  is held to its quota plus what the tenant may still borrow, and nodes of a model it may not use
  more of are masked for it (``models_full``);
- ``mem_quota_by_model``: a cap on the GPU memory the tenant holds per GPU model (``"*"``: models
  without their own entry); borrowing does not extend it. A fractional or MIG workload counts the GPU
  memory it asked for (else its share of the GPU's), whole GPUs all of theirs; nodes of a model whose
  cap it would pass are masked for it like a used GPU quota;
- ``unqueued``: the tenant of namespaces in no queue under the ``best-effort`` policy: no guarantee,
  everything it runs counts as borrowed, so it is reclaimed from first.

A gang is held to these as a whole: ``admits`` and ``models_full`` take all of its members, so a model
is open to a gang only when the whole gang fits what the tenant has left of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuaware.scheduler.core.policy_specs import ORDERS
from gpuaware.scheduler.core.workload import Workload


@dataclass
class Tenant:
    name: str
    weight: float = 1.0
    quota_gpu_milli: int = 0  # guaranteed; 0 = no guarantee
    borrow: bool = True
    borrow_limit_milli: int | None = None  # beyond the quota; None: as much as is idle
    quota_by_model: dict[str, int] = field(default_factory=dict)  # model ("*": any other) -> milli-GPUs
    mem_quota_by_model: dict[str, int] = field(default_factory=dict)  # model ("*": any other) -> GPU memory MiB
    unqueued: bool = False  # no guarantee at all: everything it runs is borrowed

    @property
    def limited(self) -> bool:
        return (not self.borrow or self.borrow_limit_milli is not None or bool(self.quota_by_model)
                or bool(self.mem_quota_by_model) or self.unqueued)

    def ceiling(self, quota: int) -> int | None:
        """The most it may use against ``quota``; None: no limit."""
        if not self.borrow:
            return quota
        return None if self.borrow_limit_milli is None else quota + self.borrow_limit_milli


def held_gpu_memory(w: Workload, per_gpu_mib: int) -> int:
    """The GPU memory ``w`` holds on GPUs of ``per_gpu_mib`` each: a fraction (or MIG slice) what it asked for,
    else its share of the GPU's memory; whole GPUs all of theirs."""
    if w.shares_gpu:
        return w.gpu_memory_mib or -(-w.gpu_milli * per_gpu_mib // 1000)
    return w.num_gpu * per_gpu_mib


@dataclass
class Usage:
    """What running work holds, summed per (tenant, GPU model), kept up to date as work starts and ends: a
    pass's ledger is then built from these few sums instead of charging every running workload again."""

    gpu_mem_by_model: dict[str, int] = field(default_factory=dict)  # model -> memory of one of its GPUs, MiB
    sums: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # -> [milli-GPUs, memory MiB, GPU MiB]

    def add(self, w: Workload, model: str, sign: int = 1) -> None:
        s = self.sums.setdefault((w.tenant, model), [0, 0, 0])
        s[0] += sign * w.gpu_milli_total
        s[1] += sign * w.memory_mib
        s[2] += sign * held_gpu_memory(w, self.gpu_mem_by_model.get(model, 0))


@dataclass
class TenantLedger:
    tenants: dict[str, Tenant]
    total_gpu_milli: int
    total_mem_mib: int
    gpu_used: dict[str, int] = field(default_factory=dict)
    mem_used: dict[str, int] = field(default_factory=dict)
    model_used: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, model) -> milli-GPUs
    gpu_mem_by_model: dict[str, int] = field(default_factory=dict)  # model -> memory of one of its GPUs, MiB
    model_mem_used: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, model) -> GPU memory MiB

    def dominant_share(self, tenant: str) -> float:
        g = self.gpu_used.get(tenant, 0) / max(self.total_gpu_milli, 1)
        m = self.mem_used.get(tenant, 0) / max(self.total_mem_mib, 1)
        return max(g, m) / max(self.tenants.get(tenant, Tenant(tenant)).weight, 1e-9)

    def charge(self, w: Workload, sign: int = 1, model: str | None = None) -> None:
        gpu_mem = self.gpu_memory_mib(w, model) if model is not None else 0
        self._add(w.tenant, model, sign * w.gpu_milli_total, sign * w.memory_mib, sign * gpu_mem)

    def charge_usage(self, usage: Usage) -> None:
        """Charge what ``usage`` sums up (as charging each of its workloads would)."""
        for (tenant, model), (gpu, mem, gpu_mem) in usage.sums.items():
            self._add(tenant, model, gpu, mem, gpu_mem)

    def _add(self, tenant: str, model: str | None, gpu_milli: int, memory_mib: int, gpu_memory_mib: int) -> None:
        self.gpu_used[tenant] = self.gpu_used.get(tenant, 0) + gpu_milli
        self.mem_used[tenant] = self.mem_used.get(tenant, 0) + memory_mib
        if model is not None:
            key = (tenant, self._model_key(tenant, model))
            self.model_used[key] = self.model_used.get(key, 0) + gpu_milli
            mem_key = self._mem_key(tenant, model)
            if mem_key is not None:
                key = (tenant, mem_key)
                self.model_mem_used[key] = self.model_mem_used.get(key, 0) + gpu_memory_mib

    def _model_key(self, tenant: str, model: str) -> str:
        t = self.tenants.get(tenant)
        return model if t is not None and model in t.quota_by_model else "*"

    def _mem_key(self, tenant: str, model: str) -> str | None:
        """The memory cap ``model`` falls under for ``tenant``; None: its GPU memory is not capped."""
        t = self.tenants.get(tenant)
        if t is None or not t.mem_quota_by_model:
            return None
        return model if model in t.mem_quota_by_model else "*" if "*" in t.mem_quota_by_model else None

    def gpu_memory_mib(self, w: Workload, model: str) -> int:
        return held_gpu_memory(w, self.gpu_mem_by_model.get(model, 0))

    def admits(self, w: Workload, gpu_milli: int | None = None) -> bool:
        """Whether ``w`` (or ``gpu_milli`` of its tenant's, a whole gang) fits the tenant's limits at all
        (per-model limits are ``models_full``'s)."""
        t = self.tenants.get(w.tenant)
        if t is None or not t.limited:
            return True
        ceiling = t.ceiling(t.quota_gpu_milli)
        asked = w.gpu_milli_total if gpu_milli is None else gpu_milli
        return ceiling is None or self.gpu_used.get(w.tenant, 0) + asked <= ceiling

    def models_full(self, w: Workload, models: list[str], members: Sequence[Workload] = ()) -> set[str]:
        """Of ``models``, those ``w`` (with ``members``: the whole gang, ``w`` among them) may not use: its
        tenant's quota for them (plus what it may borrow) or its GPU memory cap for them would be passed."""
        t = self.tenants.get(w.tenant)
        if t is None or not (t.quota_by_model or t.mem_quota_by_model):
            return set()
        ws = list(members) or [w]
        milli = sum(x.gpu_milli_total for x in ws)
        room = None
        ceiling = t.ceiling(t.quota_gpu_milli)
        if ceiling is not None:
            room = ceiling - t.quota_gpu_milli  # what it may borrow, on any model
        full = set()
        for m in models:
            if t.quota_by_model:
                key = m if m in t.quota_by_model else "*"
                quota = t.quota_by_model.get(key, 0)
                used = self.model_used.get((w.tenant, key), 0)
                limit = quota + (room if room is not None else 1 << 62)
                if used + milli > limit:
                    full.add(m)
                    continue
            mem_key = self._mem_key(w.tenant, m)
            if mem_key is not None:
                need = sum(self.gpu_memory_mib(x, m) for x in ws)
                if self.model_mem_used.get((w.tenant, mem_key), 0) + need > t.mem_quota_by_model[mem_key]:
                    full.add(m)
        return full

    def within_quota(self, w: Workload) -> bool:
        t = self.tenants.get(w.tenant)
        if t is not None and t.unqueued:
            return False
        if t is None or not t.quota_gpu_milli:
            return True
        return self.gpu_used.get(w.tenant, 0) + w.gpu_milli_total <= t.quota_gpu_milli

    def over_quota(self, tenant: str) -> int:
        t = self.tenants.get(tenant)
        if t is not None and t.unqueued:
            return self.gpu_used.get(tenant, 0)
        if t is None or not t.quota_gpu_milli:
            return 0
        return max(0, self.gpu_used.get(tenant, 0) - t.quota_gpu_milli)


def fair_order(pending: list[Workload], ledger: TenantLedger | None) -> list[Workload]:
    """Priority, then the tenant's weighted dominant share (DRF), then arrival."""
    if ledger is None:
        return sorted(pending, key=lambda w: (-w.priority, w.submit_s))
    return sorted(pending, key=lambda w: (-w.priority, ledger.dominant_share(w.tenant), w.submit_s))


def gpu_weight(w: Workload) -> float:
    """GPUs a workload holds, for GPU service (GPU-seconds); CPU-only work counts as a hundredth of one."""
    return max(w.gpu_milli_total / 1000.0, 0.01)


def queue_order(pending: list[Workload], order: str, ledger: TenantLedger | None, now: float,
                attained: Mapping[str, float] | None = None, aging_gpus: float = 0.1) -> list[Workload]:
    """Priority first; within a priority, by ``order``:

    - ``fair``: the tenant's weighted dominant share (DRF, when ``ledger``), then arrival;
    - ``fifo``: arrival;
    - ``las``: least attained GPU service first (``attained``: GPU-seconds run so far, 0 for new work), then
      arrival; needs no forecast (Tiresias' 2D-LAS, without its preemption);
    - ``predicted``: least predicted remaining GPU service first (the expected time left given what has run,
      times GPUs; Helios' QSSF), less ``aging_gpus`` GPU-seconds for every second waited so nothing starves;
      work without an estimate (or past what it expected) orders as if it needed an hour.
    """
    if order == "fair":
        return fair_order(pending, ledger)
    if order == "fifo":
        return sorted(pending, key=lambda w: (-w.priority, w.submit_s))
    done = attained or {}
    if order == "las":
        return sorted(pending, key=lambda w: (-w.priority, done.get(w.id, 0.0), w.submit_s))
    if order != "predicted":
        raise ValueError(f"unknown queue order {order!r}; known: {', '.join(ORDERS)}")

    def key(w: Workload) -> tuple[int, float, float]:
        gpus = gpu_weight(w)
        ran = done.get(w.id, 0.0) / gpus
        left = w.runtime.mean_remaining(ran) if w.runtime is not None else math.inf
        if not math.isfinite(left):  # no estimate, or it ran past what the estimate expected
            left = UNKNOWN_REMAINING_S
        return -w.priority, gpus * left - aging_gpus * max(0.0, now - w.submit_s), w.submit_s

    return sorted(pending, key=key)


UNKNOWN_REMAINING_S = 3600.0


def jain_index(shares: list[float]) -> float | None:
    """Jain's fairness index of non-negative shares (1 = all equal); None without any positive share."""
    if not shares or not any(shares):
        return None
    return sum(shares) ** 2 / (len(shares) * sum(x * x for x in shares))
