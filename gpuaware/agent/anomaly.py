"""Edge anomaly detectors, one set per GPU, River-style: ``learn_one`` then ``score_one``, state in the object.

Each detector answers with a :class:`Finding` (or ``None``) from one watch reading. Rules that
encode physics (a GPU heating faster than its power explains, a GPU reading busy while drawing
idle power) catch the faults operators page on; a multivariate Half-Space Trees model (River)
scores how unusual the joint state is, for the dashboards and as a last-resort alarm.

Half-Space Trees are implemented here in pure Python rather than imported from River: importing
``river.anomaly`` pulls in scipy.stats and adds ~78 MiB to the agent's resident memory (measured),
more than the agent's whole budget, and numpy alone ~14 MiB, a fifth of it, for arithmetic on
70-node trees that plain lists do as fast. The API and the algorithm follow River's
``HalfSpaceTrees``; the trees are drawn from the same numpy ``default_rng`` stream (``gpuaware.agent.rng``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from gpuaware.agent.headroom import (
    LEAD_S,
    PAGE_RETIRE_LIMIT,
    ROW_REMAP_LIMIT,
    TAU_S,
    MemoryRunway,
    WearRunway,
    time_to_temp,
)
from gpuaware.agent.readings import GpuDevice, Reading
from gpuaware.agent.rng import Pcg64
from gpuaware.contract.events import HealthAction, HealthVerdict


@dataclass(slots=True)
class Finding:
    detector: str
    metric: str
    score: float
    value: float
    message: str
    # The grade the detector gives this finding; None: its row in verdict.FINDINGS.
    verdict: HealthVerdict | None = None
    action: HealthAction | None = None
    state: str = "open"  # open, updated (its grade rose), lowered (a forecast withdrawn), held, closed


class ThermalRunaway:
    """Temperature climbing faster than any power change explains (failed fan, blocked airflow)."""

    def __init__(self, slope_c_per_s: float = 0.9, window_s: float = 3.0, power_rise_pct: float = 10.0):
        self.temps: deque[tuple[float, float]] = deque(maxlen=16)  # (ts, °C), oldest first
        self.powers: deque[float] = deque(maxlen=90)
        self.slope_c_per_s = slope_c_per_s
        self.window_s = window_s
        self.power_rise_pct = power_rise_pct

    def learn_one(self, r: Reading) -> None:
        if r.temp_c is not None:
            self.temps.append((r.ts, r.temp_c))
        if r.power_w is not None:
            self.powers.append(r.power_w)

    def score_one(self, r: Reading, power_limit_w: float, slowdown_c: float = 87.0) -> Finding | None:
        if r.temp_c is None or len(self.temps) < 2:
            return None
        # The newest read at least ``window_s`` old: reads come a little more or less than a second apart on a
        # live agent (its loop's jitter), so no read need lie exactly ``window_s`` back. One far older than that
        # (a gap in the reads) is no slope of now.
        first = next(((t, c) for t, c in reversed(self.temps) if t <= r.ts - self.window_s + 1e-6), None)
        if first is None or r.ts - first[0] > 2 * self.window_s:
            return None
        slope = (r.temp_c - first[1]) / (r.ts - first[0])
        if slope < self.slope_c_per_s:
            return None
        if self.powers:
            rise = (r.power_w or 0.0) - min(self.powers)
            if rise > self.power_rise_pct / 100 * power_limit_w:
                return None
        # Graded by where the heat sink settles at this rate (headroom.py): heading for slowdown is CRITICAL
        # before it gets there; settling below it is WARNING.
        eta = time_to_temp(r.temp_c, slope, slowdown_c, TAU_S)
        if eta is not None:
            grade = HealthVerdict.CRITICAL
            what = f"reaches its slowdown temperature ({slowdown_c:.0f} °C) in ~{eta:.0f} s"
        else:
            grade, what = HealthVerdict.WARNING, f"settles ~{r.temp_c + TAU_S * slope:.0f} °C, below slowdown"
        return Finding("thermal_runaway", "temp_c", slope, r.temp_c,
                       f"temperature rising {slope:.1f} °C/s with no matching power increase; {what}",
                       verdict=grade, action=HealthAction.DRAIN)


class StuckBusy:
    """Utilisation pinned at 100% while the board draws near-idle power: a hung kernel or a stuck counter."""

    def __init__(self, consecutive: int = 3):
        self.consecutive = consecutive
        self.count = 0

    def learn_one(self, r: Reading, device: GpuDevice) -> Finding | None:
        idle = device.idle_power_w or 0.1 * (device.power_limit_w or 300)
        limit = device.power_limit_w or 300
        if r.util_gpu is not None and r.power_w is not None and r.util_gpu >= 99 and r.power_w < idle + 0.25 * (
                limit - idle):
            self.count += 1
        else:
            self.count = 0
        if self.count == self.consecutive:
            return Finding("stuck_busy", "util_gpu", 1.0, r.util_gpu or 0.0,
                           f"reads {r.util_gpu:.0f}% busy but draws {r.power_w:.0f} W (idle {idle:.0f} W)")
        return None


class EccRate:
    """Single-bit ECC errors per minute over a trailing minute, and a short window for slow storms.

    The minute's rate alone reaches its threshold only after ~20 s of a storm of a few errors per
    second; ``burst`` errors inside ``burst_window_s`` (0.5/s sustained) fire within seconds, while
    the stray correctable error a healthy board shows a few times a day never does.
    """

    def __init__(self, threshold_per_min: float = 60.0, burst: int = 5, burst_window_s: float = 10.0):
        self.history: deque[tuple[float, int]] = deque()
        self.threshold = threshold_per_min
        self.burst = burst
        self.burst_window_s = burst_window_s
        self.rate_per_min = 0.0

    def learn_one(self, r: Reading) -> Finding | None:
        if r.ecc_sbe_volatile is None:
            return None
        self.history.append((r.ts, r.ecc_sbe_volatile))
        while len(self.history) > 2 and self.history[1][0] <= r.ts - 60:
            self.history.popleft()
        t0, c0 = self.history[0]
        span = max(r.ts - t0, 1.0)
        self.rate_per_min = max(0, r.ecc_sbe_volatile - c0) * 60.0 / max(span, 1.0)
        recent = next((c for t, c in self.history if t >= r.ts - self.burst_window_s - 1e-6), r.ecc_sbe_volatile)
        burst = r.ecc_sbe_volatile - recent
        if self.rate_per_min >= self.threshold or burst >= self.burst:
            return Finding("ecc_sbe_rate", "ecc_sbe_volatile", self.rate_per_min, float(r.ecc_sbe_volatile),
                           f"{self.rate_per_min:.0f} single-bit ECC errors per minute ({burst} in the last "
                           f"{self.burst_window_s:.0f} s)")
        return None


WATCHED = ("util_gpu", "fb_used_mib", "temp_c", "power_w", "ecc_sbe_volatile", "ecc_dbe_volatile", "throttle_reasons")


class TelemetryCollapse:
    """Telemetry falling apart: watch fields going absent, reads slowing down, reads coming back empty.

    XID 79 ("fallen off the bus") has almost no numeric precursor; what precedes it is the driver
    answering slower and with less. A read is *bad* when a field the GPU used to report is absent or
    the read took ``slow_factor`` times its usual time (and at least ``slow_floor_s``); ``bad`` bad
    reads among the last ``window`` fire.
    """

    def __init__(self, window: int = 5, bad: int = 3, slow_factor: float = 5.0, slow_floor_s: float = 0.05):
        self.window, self.bad = window, bad
        self.slow_factor, self.slow_floor_s = slow_factor, slow_floor_s
        self.reported: set[str] = set()
        self.usual_read_s: float | None = None
        self.recent: deque[bool] = deque(maxlen=window)
        self.fired = False

    def learn_one(self, r: Reading) -> Finding | None:
        present = {f for f in WATCHED if getattr(r, f) is not None}
        absent = sorted(self.reported - present)
        slow = (r.read_s is not None and self.usual_read_s is not None
                and r.read_s > max(self.slow_factor * self.usual_read_s, self.slow_floor_s))
        bad = bool(absent) or slow
        if not bad:
            self.reported |= present
            if r.read_s is not None:
                self.usual_read_s = r.read_s if self.usual_read_s is None else (
                    0.95 * self.usual_read_s + 0.05 * r.read_s)
        self.recent.append(bad)
        count = sum(self.recent)
        if count < self.bad:
            self.fired = False
            return None
        if self.fired:
            return None
        self.fired = True
        what = []
        if absent:
            what.append(f"fields absent: {', '.join(absent)}")
        if slow:
            what.append(f"read took {r.read_s * 1000:.0f} ms (usually {self.usual_read_s * 1000:.0f} ms)")
        return Finding("telemetry_collapse", "read", float(count), float(r.read_s or 0.0),
                       f"telemetry collapsing: {count} of the last {len(self.recent)} reads bad ({'; '.join(what)})")


class HalfSpaceTrees:
    """Streaming Half-Space Trees (Tan, Ting & Liu, IJCAI 2011) over features scaled to [0, 1].

    Mass is counted in a reference window and a latest window of ``window_size`` samples; every
    window the latest becomes the reference. ``score_one`` is 1 - (mass-weighted depth) / max, so
    points in sparse regions of the reference window score near 1, as in River.
    """

    def __init__(self, n_features: int, n_trees: int = 10, height: int = 6, window_size: int = 120, seed: int = 0):
        rng = Pcg64(seed)
        self.n_trees, self.height, self.window_size = n_trees, height, window_size
        n_nodes = 2 ** (height + 1) - 1
        # Drawn in numpy's order (all split dimensions, then the workspace centres) so a seed gives the
        # trees it gave when this was numpy code.
        self.split_dim = [[rng.integers(0, n_features) for _ in range(n_nodes)] for _ in range(n_trees)]
        self.split_val = [[0.0] * n_nodes for _ in range(n_trees)]
        centres = [[rng.random() for _ in range(n_features)] for _ in range(n_trees)]
        for t in range(n_trees):
            pairs = [(c, 2 * max(c, 1 - c)) for c in centres[t]]  # (centre, span)
            bounds = {0: ([c - w for c, w in pairs], [c + w for c, w in pairs])}
            for node in range(2 ** height - 1):
                low, high = bounds.pop(node)
                d = self.split_dim[t][node]
                mid = (low[d] + high[d]) / 2
                self.split_val[t][node] = mid
                left_high, right_low = high.copy(), low.copy()
                left_high[d], right_low[d] = mid, mid
                bounds[2 * node + 1] = (low, left_high)
                bounds[2 * node + 2] = (right_low, high)
        self.r_mass = [[0] * n_nodes for _ in range(n_trees)]
        self.l_mass = [[0] * n_nodes for _ in range(n_trees)]
        self.counter = 0
        self.first_window = True
        self.max_score = n_trees * window_size * (2 ** (height + 1) - 1)
        self.size_limit = 0.1 * window_size

    def _path(self, x: Sequence[float], tree: int) -> list[int]:
        """Node indices from root to leaf in one tree."""
        dims, vals = self.split_dim[tree], self.split_val[tree]
        node, path = 0, [0]
        for _ in range(self.height):
            node = 2 * node + 1 + (x[dims[node]] > vals[node])
            path.append(node)
        return path

    def learn_one(self, x: Sequence[float]) -> None:
        for t, mass in enumerate(self.l_mass):
            for node in self._path(x, t):
                mass[node] += 1
        self.counter += 1
        if self.counter == self.window_size:
            self.r_mass, self.l_mass = self.l_mass, [[0] * len(m) for m in self.l_mass]
            self.first_window = False
            self.counter = 0

    def score_one(self, x: Sequence[float]) -> float:
        if self.first_window:
            return 0.0
        total = 0
        for t, mass in enumerate(self.r_mass):
            for depth, node in enumerate(self._path(x, t)):
                m = mass[node]
                # Stop descending where the reference mass gets too thin to be reliable (as River does);
                # the root always counts.
                if depth and m < self.size_limit:
                    break
                total += m << depth  # mass times 2**depth: integers, so the sum is exact
                if m < self.size_limit:
                    break
        return 1.0 - total / self.max_score


class MultivariateHST:
    """Half-Space Trees over the scaled joint state (util, power, temperature, memory)."""

    def __init__(self, seed: int, threshold: float = 0.99, consecutive: int = 30, warmup: int = 300):
        self.model = HalfSpaceTrees(n_features=4, seed=seed)
        self.threshold = threshold
        self.consecutive = consecutive
        self.warmup = warmup
        self.seen = 0
        self.run = 0
        self.score = 0.0

    @staticmethod
    def features(r: Reading, device: GpuDevice) -> tuple[float, float, float, float]:
        limit = device.power_limit_w or 300.0
        slowdown = device.slowdown_temp_c or 90.0
        return (
            min(1.0, (r.util_gpu or 0.0) / 100),
            min(1.0, (r.power_w or 0.0) / limit),
            min(1.0, max(0.0, ((r.temp_c or 25.0) - 25.0) / (slowdown - 25.0))),
            min(1.0, (r.fb_used_mib or 0.0) / max(device.fb_total_mib, 1)),
        )

    def learn_one(self, r: Reading, device: GpuDevice) -> Finding | None:
        x = self.features(r, device)
        self.score = self.model.score_one(x) if self.seen >= self.warmup else 0.0
        self.model.learn_one(x)
        self.seen += 1
        self.run = self.run + 1 if self.score >= self.threshold else 0
        if self.run == self.consecutive:
            return Finding("hst", "joint", self.score, self.score, f"unusual joint state (HST score {self.score:.2f})")
        return None


class MemoryLeak:
    """Framebuffer filling steadily toward exhaustion (a leak): graded by the time it has left (headroom.py).

    Exhausted within ``LEAD_S`` at the slow end of the rate's interval -> CRITICAL + DRAIN (the job is
    checkpointed and moved before it is killed out of memory); within ``horizon_s`` -> INFO, a trend.
    """

    def __init__(self, fb_total_mib: float, horizon_s: float = 1800.0):
        self.runway = MemoryRunway(fb_total_mib)
        self.horizon_s = horizon_s
        self.eta_s: float | None = None

    def learn_one(self, r: Reading) -> Finding | None:
        eta = self.runway.learn_one(r.ts, r.fb_used_mib)
        self.eta_s = eta[0] if eta else None
        if eta is None or eta[1] > self.horizon_s:
            return None
        soon, late = eta
        grade = HealthVerdict.CRITICAL if late <= LEAD_S else HealthVerdict.INFO
        return Finding("memory_leak", "fb_used_mib", soon, float(r.fb_used_mib or 0),
                       f"framebuffer filling steadily: exhausted in ~{soon / 60:.0f} min (by {late / 60:.0f} min at "
                       f"the slowest)", verdict=grade,
                       action=HealthAction.DRAIN if grade is HealthVerdict.CRITICAL else HealthAction.WATCH)


class MemoryWear:
    """Rows remapped (pages retired before Ampere) climbing toward the limit of what the board can map out.

    From the full samples' counts (headroom.py, ``WearRunway``): the limit reached within ``LEAD_S`` at the
    slow end of the rate's interval -> CRITICAL + DRAIN (past it the next uncorrectable error cannot be
    mapped out: XID 64, a service request); within ``horizon_s`` -> INFO, a trend.
    """

    def __init__(self, horizon_s: float = 1800.0):
        self.runway = WearRunway()
        self.horizon_s = horizon_s

    def learn_one(self, sample: Reading | None) -> Finding | None:
        if sample is None:
            return None
        if sample.remapped_rows_correctable is not None:
            count = sample.remapped_rows_correctable + (sample.remapped_rows_uncorrectable or 0)
            limit, what = ROW_REMAP_LIMIT, "rows remapped"
        elif sample.retired_pages_sbe is not None or sample.retired_pages_dbe is not None:
            count = (sample.retired_pages_sbe or 0) + (sample.retired_pages_dbe or 0)
            limit, what = PAGE_RETIRE_LIMIT, "pages retired"
        else:
            return None
        eta = self.runway.learn_one(sample.ts, count, limit)
        if eta is None or eta[1] > self.horizon_s:
            return None
        soon, late = eta
        grade = HealthVerdict.CRITICAL if late <= LEAD_S else HealthVerdict.INFO
        return Finding("memory_wear", "remapped_rows", soon, float(count),
                       f"{count} of {limit} {what}, rising steadily: limit reached in ~{soon / 60:.0f} min (by "
                       f"{late / 60:.0f} min at the slowest)", verdict=grade,
                       action=HealthAction.DRAIN if grade is HealthVerdict.CRITICAL else HealthAction.WATCH)


GRADE_RANK = {None: 0, HealthVerdict.PASS: 0, HealthVerdict.INFO: 1, HealthVerdict.WARNING: 2,
              HealthVerdict.CRITICAL: 3}


class GpuDetectors:
    """Every detector of one GPU. One condition, one event: a detector's finding inside ``cooldown_s`` of its
    last is passed on only when its grade rose (an update); otherwise the open condition already says it."""

    def __init__(self, device: GpuDevice, seed: int = 0, cooldown_s: float = 120.0):
        self.device = device
        self.thermal = ThermalRunaway()
        self.stuck = StuckBusy()
        self.ecc = EccRate()
        self.collapse = TelemetryCollapse()
        self.hst = MultivariateHST(seed)
        self.leak = MemoryLeak(device.fb_total_mib)
        self.wear = MemoryWear()
        self.cooldown_s = cooldown_s
        self.last_fired: dict[str, tuple[float, int]] = {}  # detector -> (last seen, its grade's rank)

    def scores(self) -> dict[str, float]:
        return {"hst": self.hst.score, "ecc_sbe_per_min": self.ecc.rate_per_min}

    def learn_finding(self, f: Finding, ts: float) -> bool:
        """Whether ``f`` is news: a new condition, or one whose grade rose or was lowered (peer findings come through
        here too)."""
        last = self.last_fired.get(f.detector)
        rank = GRADE_RANK[f.verdict]
        if f.state == "closed":
            self.last_fired.pop(f.detector, None)
            return last is not None
        if last is not None and ts - last[0] < self.cooldown_s and rank <= last[1] and f.state != "lowered":
            self.last_fired[f.detector] = (ts, last[1])  # still open: the cooldown runs from the last sight
            return False
        self.last_fired[f.detector] = (ts, rank)
        return True

    def learn_one(self, r: Reading, sample: Reading | None = None) -> list[Finding]:
        """``r``: a watch read; ``sample``: the newest full sample (its row-remap and page-retirement counts)."""
        limit = self.device.power_limit_w or 300.0
        found = [
            self.thermal.score_one(r, limit, self.device.slowdown_temp_c or 87.0),
            self.stuck.learn_one(r, self.device),
            self.ecc.learn_one(r),
            self.collapse.learn_one(r),
            self.hst.learn_one(r, self.device),
            self.leak.learn_one(r),
            self.wear.learn_one(sample),
        ]
        self.thermal.learn_one(r)
        return [f for f in found if f is not None]
