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
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from agent.anomaly import Finding
from agent.readings import Reading

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

    def excess(self, gpu: int) -> float:
        return self.lines[gpu].excess

    def learn(self, readings: dict[int, Reading]) -> list[tuple[int, Finding]]:
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
        return out
