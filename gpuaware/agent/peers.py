"""Peer comparison on the node: a GPU running hotter than its same-model peers at the same power.

A failing fan (+0.25 °C/s that settles below the throttle point) never trips a slope or a throttle
rule: the GPU just runs some degrees hotter than its power explains. Each GPU keeps its own thermal
line, learnt while it is healthy, ``temp = a + c * p_s``, where ``p_s`` is its power smoothed with
the thermal time constant of a GPU heat sink (~40 s) and taken as a share of the board's power limit
(the prior slope, 30 °C from idle to the limit, fits data-centre boards), so a step in power is not a step in expected
temperature. Its *excess* is how far above its own line (through its long-run operating point, slope
pooled over its model) it runs; the peers' median excess (GPUs of
the same model on the node, quiet ones only: a faulty or recovering GPU is nobody's peer) is
subtracted, so a hotter room or a fan-wall change heats every GPU and flags none. ``hold``
consecutive reads with a relative excess above ``threshold_c`` open a condition, graded by headroom
(``NodePeers``; docs/health.md, "Severity").

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
from gpuaware.agent.headroom import LEAD_S, Trend, time_to_temp
from gpuaware.agent.headroom import TAU_S as THERMAL_TAU_S
from gpuaware.agent.readings import THROTTLE_GPU_IDLE, Reading
from gpuaware.contract.events import HealthAction, HealthVerdict

VERDICT_ORDER = [HealthVerdict.PASS, HealthVerdict.INFO, HealthVerdict.WARNING, HealthVerdict.CRITICAL]
THERMAL_ACTION = {HealthVerdict.INFO: HealthAction.WATCH, HealthVerdict.WARNING: HealthAction.DRAIN,
                  HealthVerdict.CRITICAL: HealthAction.DRAIN}
# A heat source still growing (the settle point rising steadily): fitted over the last GROWTH_WINDOW_S, judged
# once it has held for GROWTH_MIN_S, longer than a fan takes to spin down (30 s) plus the 20 s rate window
# that smears a step in the settle point.
GROWTH_WINDOW_S = 60.0
GROWTH_MIN_S = 50.0
# A rate that began a few seconds ago: the 20 s fit averages it with the flat seconds before it (a fan that
# stopped 7 s ago reads a third of its rate), so the excess's rate is also fitted over the last RECENT_S and
# the larger of the 20 s rate and the slow end (2 standard errors) of the recent one counts.
RECENT_S = 8.0
# Hysteresis for withdrawing a CRITICAL forecast: NVML reads whole degrees, so a settle point estimated within a
# couple of them of slowdown cannot be told from one that reaches it; lowering it there and raising it again as it
# crosses pages twice for one condition.
WITHDRAW_MARGIN_C = 2.0


@dataclass
class ThermalLine:
    """One GPU: its power smoothed with the heat sink's time constant, and its offset ``temp - c * p_s``."""

    p_s: float | None = None
    last_ts: float | None = None
    mean_x: float = 0.0  # long-run means of smoothed power and temperature: the GPU's operating point
    mean_y: float = 0.0
    n: int = 0
    excess: float = 0.0

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


@dataclass
class ThermalCondition:
    """One GPU's thermal_peer condition: open while it runs hot against its peers, graded, closed with hysteresis."""

    grade: HealthVerdict | None = None  # None: closed
    run: int = 0  # reads in a row above the threshold (to open) or below half of it (to close)
    quiet_since: float | None = None  # since when its excess has stayed within half the threshold
    rel: Trend = field(default_factory=lambda: Trend(20.0))  # its excess against its peers, for the rate
    recent: Trend = field(default_factory=lambda: Trend(RECENT_S))  # the same, lately: a rate that just began
    settle: Trend = field(default_factory=lambda: Trend(GROWTH_WINDOW_S))  # where it settles, for a growing heat source
    basis: frozenset[int] | None = None  # the quiet peers its excess was taken against (None: its own line)

    def rebase(self, basis: frozenset[int] | None) -> None:
        """Its excess is now taken against other peers (or its own line): a step in it, not a rate. The trends
        start again, so a healthy GPU whose peer left (its median moved by the room's warming its line has not
        yet learnt) does not read the step as heating."""
        if basis != self.basis:
            self.basis = basis
            self.rel, self.recent, self.settle = Trend(20.0), Trend(RECENT_S), Trend(GROWTH_WINDOW_S)


class NodePeers:
    """One per node: ``learn(tracks' readings)`` once per watch round returns the findings.

    thermal_peer is one condition per GPU (opened, updated when its grade rises, closed), graded by
    headroom (docs/health.md, "Severity"): heading for slowdown within ``lead_s`` -> CRITICAL; settling
    ``warn_factor`` times the threshold hotter than its peers -> WARNING; less -> INFO, a trend. CRITICAL is a
    forecast and is lowered (``lowered``) to what the GPU measures once the evidence withdraws it. A GPU
    that is off its line, or was within ``recover_s``, is nobody's peer, and fewer than ``min_peers``
    quiet same-model peers is no comparison: then only the heading-for-slowdown grade, from its own
    line, is judged.
    """

    def __init__(self, models: list[str], limits_w: list[float], threshold_c: float = 2.5, hold: int = 3,
                 settle_s: float = 200.0, judge_after_s: float = 400.0, offset_tau: float = 1800.0,
                 prior_c: float = 30.0, slowdown_c: list[float] | None = None, lead_s: float = LEAD_S,
                 warn_factor: float = 2.0, recover_s: float = 5 * THERMAL_TAU_S, min_peers: int = 2):
        self.models = models
        self.limits_w = limits_w
        self.slowdown_c = slowdown_c or [87.0] * len(models)
        self.lines = [ThermalLine() for _ in models]
        self.slopes = {m: ModelSlope() for m in models}
        self.threshold_c, self.hold, self.prior_c = threshold_c, hold, prior_c
        self.settle_s, self.judge_after_s, self.offset_tau = settle_s, judge_after_s, offset_tau
        self.lead_s, self.warn_factor, self.recover_s, self.min_peers = lead_s, warn_factor, recover_s, min_peers
        self.conditions = [ThermalCondition() for _ in models]
        self.started: float | None = None
        self.checks = PeerChecks(models)

    def excess(self, gpu: int) -> float:
        return self.lines[gpu].excess

    def _quiet(self, gpu: int, now: float) -> bool:
        """A peer: no open condition, and its excess within half the threshold for ``recover_s``."""
        c = self.conditions[gpu]
        return c.grade is None and c.quiet_since is not None and now - c.quiet_since >= self.recover_s

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
        quiet = {g for g in excess if self._quiet(g, now)}  # judged on last round's state, before this round's
        out = []
        for gpu, e in excess.items():
            ids = frozenset(g for g in quiet if g != gpu and self.models[g] == self.models[gpu])
            peers = [excess[g] for g in ids]
            compared = len(peers) >= self.min_peers
            rel = e - statistics.median(peers) if compared else e
            self.conditions[gpu].rebase(ids if compared else None)
            self.lines[gpu].excess = rel
            finding = self._judge_thermal(gpu, readings[gpu], rel, compared, age >= self.judge_after_s)
            if finding is not None:
                out.append((gpu, finding))
        fresh = {g: f for g, f in (full or {}).items() if g in readings and readings[g].ts - f.ts <= 30.0}
        return out + self.checks.check(readings, fresh, age >= self.settle_s)

    def _judge_thermal(self, gpu: int, r: Reading, rel: float, compared: bool, judge: bool) -> Finding | None:
        c, temp, slowdown = self.conditions[gpu], r.temp_c or 0.0, self.slowdown_c[gpu]
        c.rel.add(r.ts, rel)
        c.recent.add(r.ts, rel)
        fit = c.rel.slope() if c.rel.span() >= 15.0 else None
        rate = fit[0] if fit is not None else 0.0
        rate_hi = fit[0] + 2 * fit[1] if fit is not None else None  # the fast end: what withdrawing a forecast takes
        c.settle.add(r.ts, temp + THERMAL_TAU_S * rate)  # growth: the smooth 20 s rate (a step is not growth)
        near = c.recent.slope() if c.recent.span() >= RECENT_S - 1e-6 else None
        if near is not None:
            rate = max(rate, near[0] - 2 * near[1])
        if abs(rel) < self.threshold_c / 2:
            c.quiet_since = r.ts if c.quiet_since is None else c.quiet_since
        elif compared:
            # Off its line against its peers. On its own line (too few quiet peers) the excess holds what the
            # peers would cancel (a warming room its line has not learnt): a healthy GPU must not stop being a
            # peer because one GPU turned faulty, or the node's comparison falls apart one GPU after another.
            c.quiet_since = None
        if not judge:
            return None
        # Heading for slowdown: where the heat sink settles, or for a heat source still growing (the settle
        # point itself rising), when that growth carries it over slowdown: first-order lag tau behind it.
        # A step in the settle point (a fan that stopped) is not growth: only a steady rise over the window is.
        growth = c.settle.steady_rate(GROWTH_MIN_S)
        eta = time_to_temp(temp, rate, slowdown)
        settle = temp + THERMAL_TAU_S * rate
        if growth is not None and settle < slowdown:
            eta = (slowdown - settle) / growth + THERMAL_TAU_S
        # Hot: over the threshold, or half-way there and rising to settle twice over it (a failing fan is
        # seen seconds after it starts, not once it has crossed a line it was heading for anyway).
        hot = rel >= self.threshold_c or (rel >= self.threshold_c / 2
                                          and rel + THERMAL_TAU_S * rate >= self.warn_factor * self.threshold_c)
        if c.grade is None:
            c.run = c.run + 1 if hot else 0
            if c.run < self.hold:
                return None
            c.run = 0
        elif rel < self.threshold_c / 2:
            c.run += 1
            if c.run >= self.hold:  # hysteresis: it closes below half the threshold, not at it
                c.grade, c.run = None, 0
                return Finding("thermal_peer", "temp_c", rel, temp,
                               f"back on its line ({rel:.1f} °C against its peers): closed",
                               verdict=HealthVerdict.PASS, state="closed")
        else:
            c.run = 0
        if eta is not None and eta <= self.lead_s and hot:
            grade = HealthVerdict.CRITICAL
            what = f"reaches its slowdown temperature ({slowdown:.0f} °C) in ~{eta:.0f} s"
        elif not compared:
            return None  # no peers to tell the GPU from the room or the workload: no comparison
        elif max(rel, rel + THERMAL_TAU_S * rate) >= self.warn_factor * self.threshold_c:
            grade, what = HealthVerdict.WARNING, f"settling ~{settle:.0f} °C, below slowdown ({slowdown:.0f} °C)"
        else:
            grade, what = HealthVerdict.INFO, f"a trend, {slowdown - temp:.0f} °C from slowdown"
        lowered = False
        if c.grade is not None and VERDICT_ORDER.index(grade) < VERDICT_ORDER.index(c.grade):
            # An open condition holds its grade (it closes with hysteresis), but CRITICAL is a forecast: withdrawn
            # once even the fast end of the evidence no longer has the GPU reach slowdown within the lead time.
            lowered = c.grade is HealthVerdict.CRITICAL and self._withdrawn(c, temp, rate_hi, slowdown)
            if lowered:
                what = f"no longer heading for slowdown, CRITICAL lowered: {what}"
            else:
                grade = c.grade
        state = "open" if c.grade is None else "lowered" if lowered else "updated" if grade is not c.grade else "held"
        c.grade = grade
        peers = "relative to its same-model peers" if compared else "on its own line (too few peers to compare)"
        return Finding("thermal_peer", "temp_c", rel, temp,
                       f"{rel:.1f} °C hotter than its usual at this power, {peers}; {what}: check its fan and airflow",
                       verdict=grade, action=THERMAL_ACTION[grade], state=state)

    def _withdrawn(self, c: ThermalCondition, temp: float, rate_hi: float | None, slowdown: float) -> bool:
        """Whether a CRITICAL forecast no longer stands: the settle point at the fast end of its rate (2 standard
        errors over the slope of the last 20 s) lies ``WITHDRAW_MARGIN_C`` or more below slowdown, and its rise over
        the last minute, at the fast end too, takes it there no sooner than the lead time. While a settle point
        rises, a fan spinning down looks like a drift (both are a heat sink's resistance or source growing); only
        once it stops rising can they be told apart. Raising takes the slow end of the evidence, withdrawing the
        fast end: between the two the grade holds, and a drift still rising keeps its grade until it crosses."""
        if rate_hi is None or c.settle.span() < GROWTH_MIN_S:
            return False
        settle = temp + THERMAL_TAU_S * rate_hi
        growth = c.settle.slope()
        if settle >= slowdown - WITHDRAW_MARGIN_C or growth is None:
            return False
        rise = growth[0] + 2 * growth[1]
        return rise <= 0 or (slowdown - settle) / rise + THERMAL_TAU_S > self.lead_s
