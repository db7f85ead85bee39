"""Queue order and tenant accounting: priority first, then dominant-resource fairness, then arrival.

Each tenant has a weight and a guaranteed GPU quota; a tenant may borrow idle capacity beyond its
quota (the borrowed work is preemptible and reclaimed when an owner needs it back).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.workload import Workload


@dataclass
class Tenant:
    name: str
    weight: float = 1.0
    quota_gpu_milli: int = 0  # guaranteed; 0 = no guarantee
    borrow: bool = True


@dataclass
class TenantLedger:
    tenants: dict[str, Tenant]
    total_gpu_milli: int
    total_mem_mib: int
    gpu_used: dict[str, int] = field(default_factory=dict)
    mem_used: dict[str, int] = field(default_factory=dict)

    def dominant_share(self, tenant: str) -> float:
        g = self.gpu_used.get(tenant, 0) / max(self.total_gpu_milli, 1)
        m = self.mem_used.get(tenant, 0) / max(self.total_mem_mib, 1)
        return max(g, m) / max(self.tenants.get(tenant, Tenant(tenant)).weight, 1e-9)

    def charge(self, w: Workload, sign: int = 1) -> None:
        self.gpu_used[w.tenant] = self.gpu_used.get(w.tenant, 0) + sign * w.gpu_milli_total
        self.mem_used[w.tenant] = self.mem_used.get(w.tenant, 0) + sign * w.memory_mib

    def within_quota(self, w: Workload) -> bool:
        t = self.tenants.get(w.tenant)
        if t is None or not t.quota_gpu_milli:
            return True
        return self.gpu_used.get(w.tenant, 0) + w.gpu_milli_total <= t.quota_gpu_milli

    def over_quota(self, tenant: str) -> int:
        t = self.tenants.get(tenant)
        if t is None or not t.quota_gpu_milli:
            return 0
        return max(0, self.gpu_used.get(tenant, 0) - t.quota_gpu_milli)


def fair_order(pending: list[Workload], ledger: TenantLedger | None) -> list[Workload]:
    """Priority, then the tenant's weighted dominant share (DRF), then arrival."""
    if ledger is None:
        return sorted(pending, key=lambda w: (-w.priority, w.submit_s))
    return sorted(pending, key=lambda w: (-w.priority, ledger.dominant_share(w.tenant), w.submit_s))


def jain_index(shares: list[float]) -> float | None:
    """Jain's fairness index of non-negative shares (1 = all equal); None without any positive share."""
    if not shares or not any(shares):
        return None
    return sum(shares) ** 2 / (len(shares) * sum(x * x for x in shares))
