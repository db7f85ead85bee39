"""GPU health score 0-100, explainable: the sum of per-component penalties, each decaying as faults age.

    score = clamp(100 - sum of penalty_c, 0, 100);  component health_c = 100 - penalty_c

The components (ecc, xid, thermal, power, throttle, pcie, anomaly, availability), their penalties
and half-lives are tabled in docs/agent.md ("Health score"). Penalties take the larger of the
instant value and the decayed stored value, so a fault's mark fades smoothly. Bands: healthy >= 80,
degraded >= 50, critical below; the band only improves once the score is 3 points past the
boundary, so it does not flap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuaware.agent.readings import (
    CRITICAL_XIDS,
    POWER_THROTTLE_MASK,
    THERMAL_THROTTLE_MASK,
    THROTTLE_HW_SLOWDOWN,
    Reading,
)
from gpuaware.contract.events import HealthBand

COMPONENTS = ("ecc", "xid", "thermal", "power", "throttle", "pcie", "anomaly", "availability")
HALF_LIFE_S = {"ecc": 6 * 3600.0, "xid": 3600.0, "thermal": 600.0, "power": 600.0, "throttle": 600.0,
               "pcie": 1800.0, "anomaly": 1800.0, "availability": 0.0}
# Findings graded WARNING or worse only (core.py): an INFO trend, the Half-Space Trees among them, costs nothing.
ANOMALY_PENALTY = {"stuck_busy": 35.0, "thermal_runaway": 20.0}
HEALTHY_AT = 80.0
DEGRADED_AT = 50.0
HYSTERESIS = 3.0


def band_of(score: float) -> HealthBand:
    if score >= HEALTHY_AT:
        return HealthBand.HEALTHY
    if score >= DEGRADED_AT:
        return HealthBand.DEGRADED
    return HealthBand.CRITICAL


_RANK = {HealthBand.CRITICAL: 0, HealthBand.DEGRADED: 1, HealthBand.HEALTHY: 2, HealthBand.UNKNOWN: 3}


@dataclass
class HealthScorer:
    slowdown_temp_c: float = 87.0
    penalties: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0.0))
    last_ts: float | None = None
    band: HealthBand = HealthBand.HEALTHY
    _last_dbe: int | None = None
    _last_replays: tuple[float, int] | None = None
    _sbe_window: list[tuple[float, int]] = field(default_factory=list)

    @property
    def score(self) -> float:
        return max(0.0, min(100.0, 100.0 - sum(self.penalties.values())))

    def components(self) -> dict[str, float]:
        return {c: max(0.0, 100.0 - p) for c, p in self.penalties.items()}

    def _decay(self, ts: float) -> None:
        if self.last_ts is not None and ts > self.last_ts:
            dt = ts - self.last_ts
            for c, hl in HALF_LIFE_S.items():
                if hl > 0:
                    self.penalties[c] *= math.pow(0.5, dt / hl)
        self.last_ts = ts if self.last_ts is None else max(ts, self.last_ts)

    def _raise(self, component: str, value: float) -> None:
        self.penalties[component] = min(100.0, max(self.penalties[component], value))

    def learn_xid(self, ts: float, xid: int) -> None:
        self._decay(ts)
        self.penalties["xid"] = min(100.0, self.penalties["xid"] + (70.0 if xid in CRITICAL_XIDS else 10.0))

    def learn_anomaly(self, ts: float, detector: str) -> None:
        self._decay(ts)
        self.penalties["anomaly"] = min(100.0, self.penalties["anomaly"] + ANOMALY_PENALTY.get(detector, 10.0))

    def learn_lost(self, ts: float) -> None:
        self._decay(ts)
        self.penalties["availability"] = 100.0

    def learn_one(self, r: Reading) -> None:
        self._decay(r.ts)
        self.penalties["availability"] = 0.0
        if r.ecc_sbe_volatile is not None:
            self._sbe_window.append((r.ts, r.ecc_sbe_volatile))
            while len(self._sbe_window) > 2 and self._sbe_window[1][0] <= r.ts - 60:
                self._sbe_window.pop(0)
            t0, c0 = self._sbe_window[0]
            rate = max(0, r.ecc_sbe_volatile - c0) * 60.0 / max(r.ts - t0, 1.0)
            self._raise("ecc", min(40.0, 12.0 * math.log10(1 + rate)))
        if r.ecc_dbe_volatile is not None:
            if self._last_dbe is not None and r.ecc_dbe_volatile > self._last_dbe:
                self.penalties["ecc"] = min(100.0, self.penalties["ecc"] + 60.0 * (r.ecc_dbe_volatile - self._last_dbe))
            self._last_dbe = r.ecc_dbe_volatile
        if r.remapped_rows_uncorrectable:
            self._raise("ecc", 20.0)
        if r.remap_failure:
            self._raise("ecc", 100.0)
        reasons = r.throttle_reasons or 0
        if r.temp_c is not None:
            headroom = self.slowdown_temp_c - r.temp_c
            self._raise("thermal", 0.0 if headroom >= 15 else 40.0 * min(1.0, (15 - headroom) / 15))
        if reasons & THERMAL_THROTTLE_MASK:
            self._raise("thermal", 60.0)
        if reasons & POWER_THROTTLE_MASK:
            self._raise("power", 15.0)
        if reasons & THROTTLE_HW_SLOWDOWN:
            self._raise("throttle", 30.0)
        if r.pcie_replays is not None:
            if self._last_replays is not None:
                t0, c0 = self._last_replays
                rate = max(0, r.pcie_replays - c0) * 60.0 / max(r.ts - t0, 1.0)
                self._raise("pcie", min(20.0, 6.0 * math.log10(1 + rate)))
            self._last_replays = (r.ts, r.pcie_replays)

    def update_band(self) -> tuple[HealthBand, HealthBand] | None:
        """The (old, new) band if the score crossed a boundary (with hysteresis on the way up)."""
        score = self.score
        new = band_of(score)
        if new == self.band:
            return None
        if _RANK[new] > _RANK[self.band] and band_of(score - HYSTERESIS) != new:
            return None
        old, self.band = self.band, new
        return old, new
