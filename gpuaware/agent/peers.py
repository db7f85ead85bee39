"""Peer comparison on the node: a GPU running hotter than its same-model peers at the same power.

A failing fan (+0.25 °C/s that settles below the throttle point) never trips a slope or a throttle
rule: the GPU just runs some degrees hotter than its power explains. Each GPU keeps its own thermal
line, learnt while it is healthy, ``temp = a + c * p_s``, where ``p_s`` is its power smoothed with
the thermal time constant of a GPU heat sink (~40 s) and taken as a share of the board's power limit
(the prior slope, 30 °C from idle to the limit, fits data-centre boards), so a step in power is not a step in expected
temperature. Its *excess* is how far above its own line (through its long-run operating point, slope
pooled over its model) it runs; the peers' median excess (GPUs of
the same model on the node) is subtracted, so a hotter room or a fan-wall change heats every GPU
and flags none. ``hold`` consecutive reads with a relative excess above ``threshold_c`` fire.

A GPU running off its line (half the threshold) stops teaching the slope; its operating point keeps
learning slowly (``offset_tau``), so a fault is absorbed over tens of minutes, long after it fired,
and a GPU can never get stuck off a line it may no longer learn. Until the model's power has varied
enough to tell the slope, the slope is ``prior_c``. Nothing is judged for ``judge_after_s`` after the
agent starts: the smoothed power starts from one reading, not from the heat sink's history.

The same peers judge three more signals (``PeerChecks``; docs/health.md, "Peer comparison"), each a
GPU against its same-model peers on the node, ``hold`` reads in a row:

- SM clock under load (the watch read's, else the newest full sample's): busy (``busy_util``) and with
  no throttle reason, a clock ``clock_deficit``
  below every one of its busy peers' is a board losing clocks before any reason says so (a clock a reason
  explains is the throttle rules' business);
- power at utilisation: busy, among busy peers within ``util_window`` points of its utilisation, none
  of them throttled, power ``power_deviation`` (and ``power_floor_w`` W) off their median and
  ``power_margin`` beyond the nearest of them, above all of them or below all;
- single-bit ECC rate: errors over ``sbe_window_s`` at least ``sbe_min`` and ``sbe_factor`` times the
  peers' median (plus one): a slow storm the absolute rate rule (60/min, 5 in 10 s) does not reach.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from gpuaware.agent.anomaly import Finding
from gpuaware.agent.readings import THROTTLE_GPU_IDLE, Reading

THERMAL_TAU_S = 40.0


@dataclass
class ThermalLine:
    """One GPU: its power smoothed with the heat sink's time constant, and its offset ``temp - c * p_s``."""

    p_s: float | None = None
    last_ts: float | None = None
    mean_x: float = 0.0  # long-run means of smoothed power and temperature: the GPU's operating point
    mean_y: float = 0.0
    n: int = 0
    excess: float = 0.0
    run: int = 0

    def learn(self, x: float, y: float, tau: float) -> None:
        self.n += 1
        rate = 1.0 / min(self.n, tau)
        self.mean_x += (x - self.mean_x) * rate
        self.mean_y += (y - self.mean_y) * rate

    def smooth(self, ts: float, power: float) -> float:
        if self.p_s is None or self.last_ts is None:
            self.p_s = power
        else:
            dt = max(0.0, ts - self.last_ts)
            self.p_s += (power - self.p_s) * (1 - math.exp(-dt / THERMAL_TAU_S))
        self.last_ts = ts
        return self.p_s


@dataclass
class ModelSlope:
    """°C per smoothed power (as a share of the power limit) of one GPU model, pooled over its GPUs on
    the node (within-GPU least squares, exponentially forgotten): the heat sink is the same design, the
    inlet temperatures are not."""

    forget: float = 1 / 3600.0
    sxx: float = 0.0
    sxy: float = 0.0
    means: dict[int, tuple[float, float]] = field(default_factory=dict)  # gpu -> running (mean p_s, mean temp)

    def learn(self, gpu: int, x: float, y: float) -> None:
        mx, my = self.means.get(gpu, (x, y))
        mx, my = mx + 0.01 * (x - mx), my + 0.01 * (y - my)
        self.means[gpu] = (mx, my)
        keep = 1 - self.forget
        self.sxx = self.sxx * keep + (x - mx) ** 2
        self.sxy = self.sxy * keep + (x - mx) * (y - my)

    def slope(self, prior: float) -> float:
        return self.sxy / self.sxx if self.sxx > 0.4 else prior


@dataclass(frozen=True)
class PeerSettings:
    hold: int = 5  # reads in a row
    busy_util: float = 50.0
    clock_deficit: float = 0.10
    util_window: float = 10.0
    # Wide: two jobs at the same utilisation differ in power (memory- vs compute-bound); a board drawing
    # a third more or less than both its peers is more than a workload's difference.
    power_deviation: float = 0.35
    power_floor_w: float = 60.0
    power_margin: float = 0.15  # beyond the nearest such peer (a share of its power)
    sbe_window_s: float = 600.0
    sbe_min: int = 5
    sbe_factor: float = 5.0


class PeerChecks:
    """Clocks, power at utilisation and SBE rate against same-model peers on the node."""

    def __init__(self, models: list[str], s: PeerSettings | None = None):
        self.models, self.s = models, s or PeerSettings()
        self.runs: dict[tuple[str, int], int] = {}
        self.sbe: list[deque[tuple[float, int]]] = [deque() for _ in models]

    def _peers(self, gpu: int, values: dict[int, float]) -> list[float]:
        return [v for g, v in values.items() if g != gpu and self.models[g] == self.models[gpu]]

    def _sbe_count(self, gpu: int, r: Reading) -> int | None:
        if r.ecc_sbe_volatile is None:
            return None
        w = self.sbe[gpu]
        if w and r.ecc_sbe_volatile < w[-1][1]:
            w.clear()  # the volatile counter started again (a reset, a driver reload)
        w.append((r.ts, r.ecc_sbe_volatile))
        while len(w) > 1 and w[0][0] < r.ts - self.s.sbe_window_s:
            w.popleft()
        return w[-1][1] - w[0][1]

    def check(self, readings: dict[int, Reading], full: dict[int, Reading], judge: bool) -> list[tuple[int, Finding]]:
        s = self.s
        quiet = {g: r for g, r in readings.items() if not (r.throttle_reasons or 0) & ~THROTTLE_GPU_IDLE}
        # Power is compared under load only: near idle it climbs steeply with the first few points of
        # utilisation, so "the same utilisation" is not the same operating point there.
        busy = {g: r for g, r in quiet.items() if (r.util_gpu or 0) >= s.busy_util}
        clocks: dict[int, float] = {}
        for g, r in quiet.items():  # the watch read's clock; a collector that watches none: the newest full sample's
            f = r if r.sm_clock_mhz else full.get(g)
            if f is not None and f.sm_clock_mhz and (f.util_gpu or 0) >= s.busy_util \
                    and not (f.throttle_reasons or 0) & ~THROTTLE_GPU_IDLE:
                clocks[g] = float(f.sm_clock_mhz)
        sbe = {g: c for g, r in readings.items() if (c := self._sbe_count(g, r)) is not None}
        found: dict[tuple[str, int], tuple[float, float, str]] = {}
        for g, clock in clocks.items():
            peers = self._peers(g, clocks)
            if len(peers) >= 2:
                med = min(peers)  # below every busy peer (one slow peer does not make the others outliers)
                if med > 0 and (med - clock) / med >= s.clock_deficit:
                    found[("clock_peer", g)] = (clock, (med - clock) / med, (
                        f"SM clock {clock:.0f} MHz under load, {(med - clock) / med:.0%} below each of its same-model "
                        f"peers (slowest {med:.0f} MHz) with no throttle reason: check its power delivery and clocks"))
        for g, r in busy.items():
            if r.power_w is None or r.util_gpu is None:
                continue
            near = {h: q.power_w for h, q in busy.items() if q.power_w is not None and q.util_gpu is not None
                    and abs(q.util_gpu - r.util_gpu) <= s.util_window}
            peers = self._peers(g, near)
            if len(peers) >= 2:
                # Off their median, and beyond every peer by a margin: with a few peers, one faulty peer
                # (a hung kernel at 100% drawing idle power) must not make the healthy ones outliers, and
                # one peer off the same way (a slow board drawing less) must not hide the outlier.
                med = statistics.median(peers)
                nearest = max(peers) if r.power_w > med else min(peers)
                off = r.power_w - med
                beyond = (r.power_w - nearest) * (1 if off > 0 else -1)
                if (med > 0 and nearest > 0 and abs(off) / med >= s.power_deviation and abs(off) >= s.power_floor_w
                        and beyond / nearest >= s.power_margin):
                    found[("power_peer", g)] = (r.power_w, off / med, (
                        f"power {r.power_w:.0f} W, {off / med:+.0%} against the median of its same-model peers at "
                        f"{r.util_gpu:.0f}% busy: check its power delivery and cooling"))
        for g, count in sbe.items():
            peers = self._peers(g, sbe)
            if len(peers) >= 2:
                med = statistics.median(peers)
                if count >= s.sbe_min and count >= s.sbe_factor * (med + 1):
                    found[("ecc_peer", g)] = (float(count), count - med, (
                        f"{count} single-bit ECC errors in {s.sbe_window_s / 60:.0f} min, its same-model peers "
                        f"{med:.0f}: its memory is wearing"))
        out = []
        for key in set(self.runs) | set(found):
            run = self.runs.get(key, 0) + 1 if key in found and judge else 0
            self.runs[key] = run
            if run == s.hold:
                value, score, message = found[key]
                metric = {"clock_peer": "sm_clock_mhz", "power_peer": "power_w", "ecc_peer": "ecc_sbe_volatile"}
                out.append((key[1], Finding(key[0], metric[key[0]], score, value, message)))
        return out


class NodePeers:
    """One per node: ``learn(tracks' readings)`` once per watch round returns the findings."""

    def __init__(self, models: list[str], limits_w: list[float], threshold_c: float = 2.5, hold: int = 3,
                 settle_s: float = 200.0, judge_after_s: float = 400.0, offset_tau: float = 1800.0,
                 prior_c: float = 30.0):
        self.models = models
        self.limits_w = limits_w
        self.lines = [ThermalLine() for _ in models]
        self.slopes = {m: ModelSlope() for m in models}
        self.threshold_c, self.hold, self.prior_c = threshold_c, hold, prior_c
        self.settle_s, self.judge_after_s, self.offset_tau = settle_s, judge_after_s, offset_tau
        self.started: float | None = None
        self.checks = PeerChecks(models)

    def excess(self, gpu: int) -> float:
        return self.lines[gpu].excess

    def learn(self, readings: dict[int, Reading], full: dict[int, Reading] | None = None) -> list[tuple[int, Finding]]:
        """``readings``: this round's watch reads; ``full``: each GPU's newest full sample (its clocks)."""
        if not readings:
            return []
        now = max(r.ts for r in readings.values())
        self.started = now if self.started is None else self.started
        age = now - self.started
        excess: dict[int, float] = {}
        for gpu, r in readings.items():
            if r.temp_c is None or r.power_w is None:
                continue
            line, slope = self.lines[gpu], self.slopes[self.models[gpu]]
            x = line.smooth(r.ts, r.power_w / self.limits_w[gpu])
            if age < self.settle_s:  # p_s started from one reading, not from the heat sink's history
                continue
            if abs(line.excess) < self.threshold_c / 2:  # a GPU running off its line does not teach the slope
                slope.learn(gpu, x, r.temp_c)
            if line.n:
                excess[gpu] = r.temp_c - (line.mean_y + slope.slope(self.prior_c) * (x - line.mean_x))
            line.learn(x, r.temp_c, self.offset_tau)
        out = []
        for gpu, e in excess.items():
            peers = [excess[g] for g in excess if g != gpu and self.models[g] == self.models[gpu]]
            rel = e - statistics.median(peers) if len(peers) >= 2 else e
            line = self.lines[gpu]
            line.excess = rel
            line.run = line.run + 1 if age >= self.judge_after_s and rel >= self.threshold_c else 0
            if line.run == self.hold:
                out.append((gpu, Finding(
                    "thermal_peer", "temp_c", rel, readings[gpu].temp_c or 0.0,
                    f"{rel:.1f} °C hotter than its usual at this power, relative to its same-model peers: "
                    f"check its fan and airflow")))
        fresh = {g: f for g, f in (full or {}).items() if g in readings and readings[g].ts - f.ts <= 30.0}
        return out + self.checks.check(readings, fresh, age >= self.settle_s)
