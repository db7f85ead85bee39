"""The scheduler's table of job runtime statistics (``job.runtime.v1``) and the estimates it gives a pending pod.

``RuntimeTable`` keeps the newest record per signature key (a tombstone removes the key), as the stream's
forecaster published them (``gpuaware.stream.runtime_topic``), and turns them into a ``RuntimeEstimate`` with the
same function the forecaster predicts with (``contract.runtime.posterior``):

- a pod that declares no duration: a log-normal from its signature keys, source ``forecast``;
- a pod that declares one (``gpuaware.io/duration-s``): the declared duration calibrated against completions of
  its owner (or tenant) that declared one (``contract.runtime.calibrated``), source ``calibrated``; exact, as
  declared, until there is such a completion.

Stale or absent: with no record learned within ``stale_after_s`` (the newest completion the learner published
ended longer ago; 0: never stale), or none at all, a pod without a declared duration gets no estimate (unknown,
as without the stream) and a declared one stays exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpuaware.contract.events import JobRuntime
from gpuaware.contract.runtime import KeyStats, calibrated, posterior
from gpuaware.scheduler.core.runtime import Z90, RuntimeEstimate

META = "#z90"


class RuntimeTable:
    def __init__(self, stale_after_s: float = 86_400.0, prior_weight: float = 2.0) -> None:
        self.stale_after_s, self.prior_weight = stale_after_s, prior_weight
        self.stats: dict[str, KeyStats] = {}
        self.z90 = Z90
        self.newest_ms = 0  # the newest record's ts_ms (the end of the newest completion learned)
        self.version = 0  # bumped by every change: estimates cached against it

    def learn(self, r: JobRuntime) -> None:
        self.version += 1
        self.newest_ms = max(self.newest_ms, r.ts_ms)
        if r.signature_key == META:
            self.z90 = r.mean
        elif not r.signature_key.startswith("#"):  # "#seen:": the learner's record of what it learned
            self.stats[r.signature_key] = KeyStats(r.n, r.mean, r.m2)

    def forget(self, key: str) -> None:
        """A tombstone: the forecaster dropped ``key``."""
        self.version += 1
        self.stats.pop(key, None)

    def fresh(self, now_ms: int) -> bool:
        if not self.stats:
            return False
        return self.stale_after_s <= 0 or now_ms - self.newest_ms <= self.stale_after_s * 1000

    def estimate(self, keys: Sequence[str], declared_s: float | None, declared_keys: Sequence[str],
                 now_ms: int) -> RuntimeEstimate | None:
        """The estimate for a pod with signature ``keys`` (and a declared duration, if any); None: unknown."""
        if declared_s:
            exact = RuntimeEstimate.exact(declared_s, source="declared")
            if not self.fresh(now_ms):
                return exact
            p = calibrated(declared_s, declared_keys, self.stats, self.prior_weight)
            return exact if p is None else RuntimeEstimate(p.mu, p.sigma, self.z90, "calibrated")
        if not keys or not self.fresh(now_ms):
            return None
        p = posterior(keys, self.stats, self.prior_weight)
        if p.level == "prior" or not math.isfinite(p.mu):
            return None
        return RuntimeEstimate(p.mu, p.sigma, self.z90, "forecast", p.level)
