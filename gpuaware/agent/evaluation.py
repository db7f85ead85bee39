"""``gpuaware eval sampling``: adaptive sampling against fixed 1 s sampling over the fault scenarios.

Each scenario runs the real agent core on simulated GPUs with a simulated clock, one tick per
second. Figures:

- ``sample_reduction``: full samples a fixed 1 s sampler takes / full samples the adaptive one took;
  ``light_points``: the light watch points (utilisation and power, ~5 bytes) published besides;
- ``util_mae_pct_points``: the utilisation timeline rebuilt from the published samples (linear
  between samples, as a dashboard draws it) against the true per-second utilisation;
- ``faults_injected`` / ``faults_detected``: each fault counts as detected when the event expected
  for its kind is raised on its GPU after it takes effect; ``detection_delay_p95_s`` over those;
- ``false_alarms``: anomaly/ECC/throttle/XID events of WARNING or worse on GPUs and at times with no
  fault (an INFO trend is a dashboard mark, not an alarm); ``false_alarms_per_gpu_day`` per GPU-day;
- per predictive fault (a thermal fault or a memory leak) ``lead_time_s``: when its GPU was first
  graded CRITICAL minus when it truly crossed its limit (negative = before), and ``crossed_after_s``,
  how long after its onset it crossed; ``flagged_120s_before`` counts those flagged 120 s or more
  ahead, ``lead_120s_possible`` those that crossed 120 s or more after their onset. The simulated GPU
  goes on for ``LEAD_S`` after the run, so a limit crossed just after it ends still counts;
- ``faults_below_threshold``: faults whose effect no rule acts on (a thermal fault heating its GPU less
  than the peer threshold, a leak never within the trend horizon of exhaustion): expected no alarm and
  no remediation, not counted among the faults to detect;
- ``verdict_accuracy``: the share of faults whose worst verdict and strongest recommended action,
  from the fault until the next one on its GPU, are the ones expected (the scenario's ``verdict``
  and ``action``, else ``EXPECTED_VERDICT`` by kind, or the XID's row of ``gpuaware.agent.verdict.XIDS``);
  a forecast (CRITICAL, heading for a limit) that did not come true and that the agent withdrew is judged
  from when its verdict was lowered: the grade it settled at. ``verdict_accuracy_worst``: by the worst
  verdict throughout; ``verdicts_lowered``: the faults the two differ on;
- ``false_remediations``: GPUs told to drain, reset, reboot or be serviced with no fault (or
  before theirs), and faults told so whose expected action is not one (docs/health.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuaware.agent.collectors.sim import (
    LIMIT_FAULTS,
    SCENARIO_DIR,
    Fault,
    SimCluster,
    load_scenario,
    scenario_library,
)
from gpuaware.agent.core import AgentCore
from gpuaware.agent.headroom import FB_EXHAUSTED, LEAD_S
from gpuaware.agent.sampling import SamplingPolicy, load_policy
from gpuaware.agent.verdict import ACTION_RANK, REMEDIATIONS, VERDICT_RANK, XIDS
from gpuaware.contract.events import EventKind, GpuEvent, HealthAction, HealthVerdict, Severity

EXPECTED: dict[str, set[EventKind]] = {
    "ecc_sbe_storm": {EventKind.ECC_SBE},
    "ecc_dbe": {EventKind.ECC_DBE},
    "xid": {EventKind.XID},
    "thermal_runaway": {EventKind.ANOMALY, EventKind.THERMAL_THROTTLE_START},
    "power_cap": {EventKind.POWER_THROTTLE_START},
    "stuck_util": {EventKind.ANOMALY},
    "dead": {EventKind.HEALTH_CHANGE},
    "telemetry_collapse": {EventKind.ANOMALY},
    "clock_degraded": {EventKind.ANOMALY},  # clock_peer
    "power_skew": {EventKind.ANOMALY},  # power_peer
    "thermal_drift": {EventKind.ANOMALY, EventKind.THERMAL_THROTTLE_START},
    "fan_failure": {EventKind.ANOMALY, EventKind.THERMAL_THROTTLE_START},
    "memory_leak": {EventKind.ANOMALY},
    "memory_wear": {EventKind.ANOMALY},
}
# Faults that cross a limit some time after they start: graded by whether they reach it (below), and
# scored by their lead time, when the GPU was first graded CRITICAL against when it crossed.
THERMAL_KINDS = LIMIT_FAULTS - {"memory_leak", "memory_wear"}
PREDICTIVE = LIMIT_FAULTS
SLOW = frozenset({"thermal_drift", "fan_failure", "memory_leak", "memory_wear"})
V, A = HealthVerdict, HealthAction
EXPECTED_VERDICT: dict[str, tuple[HealthVerdict, HealthAction]] = {
    "ecc_sbe_storm": (V.WARNING, A.WATCH),
    "ecc_dbe": (V.CRITICAL, A.RESET_GPU),
    "power_cap": (V.INFO, A.WATCH),
    "stuck_util": (V.WARNING, A.RESET_GPU),
    "dead": (V.CRITICAL, A.REBOOT_NODE),
    "telemetry_collapse": (V.WARNING, A.DRAIN),
    "clock_degraded": (V.WARNING, A.WATCH),
    "power_skew": (V.WARNING, A.WATCH),
}
# Thermal faults and leaks by what they do (docs/health.md, "Severity"): one that takes the GPU to its
# slowdown temperature or out of memory is CRITICAL (drained before it gets there), one that settles below
# is WARNING (thermal) or a trend (memory).
REACHES_LIMIT = {"thermal": (V.CRITICAL, A.DRAIN), "memory_leak": (V.CRITICAL, A.DRAIN),
                 "memory_wear": (V.CRITICAL, A.DRAIN)}
STAYS_BELOW = {"thermal": (V.WARNING, A.DRAIN), "memory_leak": (V.INFO, A.WATCH), "memory_wear": (V.INFO, A.WATCH)}
# Below its limit a fault is graded by what the rules grade (docs/health.md, "Severity"), from the simulated GPU's
# truth: a thermal fault by its own heat (its temperature over where it would be without it), WARNING from twice
# the peer threshold, INFO from the threshold; a leak INFO once it is within the trend horizon of exhaustion.
# Less than that is nothing a rule acts on (an idle board's fan adds 2 °C): expected no alarm and no
# remediation, counted as ``faults_below_threshold`` and not as a fault to detect.
THERMAL_INFO_C = 2.5  # NodePeers.threshold_c
THERMAL_WARN_C = 5.0  # NodePeers.warn_factor x threshold_c
LEAK_HORIZON_S = 1800.0  # MemoryLeak.horizon_s
VERDICTS = list(VERDICT_RANK)  # index by rank + 1
ACTIONS = list(ACTION_RANK)
ALARM_KINDS = {EventKind.ANOMALY, EventKind.ECC_SBE, EventKind.ECC_DBE, EventKind.XID,
               EventKind.THERMAL_THROTTLE_START, EventKind.POWER_THROTTLE_START}


@dataclass
class FaultResult:
    scenario: str
    kind: str
    node: int
    gpu: int
    at_s: float
    detected: bool
    delay_s: float | None
    health_before: float
    health_min_after: float
    verdict: str = ""
    action: str = ""
    expected: tuple[str, str] = ("", "")
    crossed_s: float | None = None  # when the GPU crossed the limit (predictive kinds), seconds after start
    flagged_s: float | None = None  # when it was first graded CRITICAL
    quiet: bool = False  # its effect stays below every rule's threshold: expected no alarm, not a fault to detect
    verdict_worst: str = ""  # the worst verdict and strongest action over the window (``verdict``: where it settled)
    action_worst: str = ""

    @property
    def lead_time_s(self) -> float | None:
        """Flagged minus crossed: negative = flagged before the threshold."""
        if self.kind not in PREDICTIVE or self.crossed_s is None or self.flagged_s is None:
            return None
        return self.flagged_s - self.crossed_s

    @property
    def verdict_ok(self) -> bool:
        return self._ok(self.verdict, self.action)

    @property
    def worst_ok(self) -> bool:
        return self._ok(self.verdict_worst, self.action_worst)

    def _ok(self, verdict: str, action: str) -> bool:
        if self.quiet:  # nothing to act on: no alarm, no remediation (a dashboard mark is no harm)
            return VERDICT_RANK[HealthVerdict(verdict)] <= VERDICT_RANK[V.INFO] and \
                HealthAction(action) not in REMEDIATIONS
        return (verdict, action) == self.expected


@dataclass
class ScenarioResult:
    name: str
    gpus: int
    duration_s: int
    samples_adaptive: int
    samples_fixed: int
    watch_reads: int
    abs_err_sum: float
    abs_err_n: int
    faults: list[FaultResult]
    false_alarms: int
    events: int
    wall_s: float
    false_remediations: int = 0
    light_points: int = 0


def run_scenario(path: Path, policy: SamplingPolicy | None = None) -> ScenarioResult:
    scenario = load_scenario(path)
    policy = policy or SamplingPolicy()
    clock = [0.0]
    cluster = SimCluster(scenario, clock=lambda: clock[0], epoch=0.0)
    cores = [AgentCore(c, policy, clock=lambda: clock[0]) for c in cluster.collectors()]
    duration = int(scenario.duration_s)
    n_gpus = scenario.gpus_per_node
    truth = np.full((scenario.nodes, n_gpus, duration), np.nan)
    published: list[list[list[tuple[float, float]]]] = [[[] for _ in range(n_gpus)] for _ in range(scenario.nodes)]
    health = np.full((scenario.nodes, n_gpus, duration), 100.0)
    verdicts = np.zeros((scenario.nodes, n_gpus, duration), dtype=np.int8)  # VERDICT_RANK
    actions = np.zeros((scenario.nodes, n_gpus, duration), dtype=np.int8)  # ACTION_RANK
    events: list[tuple[int, GpuEvent]] = []
    # The truth a fault below its limit is graded by: each second, a thermal fault's own heat, a leak's runway.
    watched = {(f.node, f.gpu) for f in scenario.faults if f.kind in PREDICTIVE}
    own_heat = {key: np.zeros(duration) for key in watched}
    runway = {key: np.full(duration, np.inf) for key in watched}
    started = time.perf_counter()
    for s in range(duration):
        clock[0] = float(s)
        for (n, g) in watched:
            gpu = cluster.gpus[n][g]
            gpu.advance_to(float(s), 0.0)
            own_heat[(n, g)][s] = gpu.temp - gpu.temp_base
            rate = sum(f.leak_mib_per_s for f in gpu.faults if f.kind == "memory_leak" and f.active(s))
            if rate > 0:
                runway[(n, g)][s] = (FB_EXHAUSTED * gpu.spec.fb_total_mib - gpu.mem) / rate
        for n, core in enumerate(cores):
            out = core.tick(float(s))
            for idx, _seq, r in out.samples:
                published[n][idx].append((r.ts, r.util_gpu or 0.0))
            for idx, r in out.points:  # light watch points draw the same timeline
                published[n][idx].append((r.ts, r.util_gpu or 0.0))
            events.extend((n, e) for e in out.events)
            for t in core.tracks:
                health[n, t.device.index, s] = t.health.score
                verdicts[n, t.device.index, s] = VERDICT_RANK[t.verdict.verdict]
                actions[n, t.device.index, s] = ACTION_RANK[t.verdict.action]
                if not t.lost and t.last_watch is not None and t.last_watch.ts == s:
                    truth[n, t.device.index, s] = t.last_watch.util_gpu or 0.0
    wall = time.perf_counter() - started

    err_sum, err_n = 0.0, 0
    for n in range(scenario.nodes):
        for g in range(n_gpus):
            pts = published[n][g]
            mask = ~np.isnan(truth[n, g])
            if not pts or not mask.any():
                continue
            ts = np.arange(duration, dtype=float)[mask]
            pts.sort()
            rebuilt = np.interp(ts, [p[0] for p in pts], [p[1] for p in pts])
            err_sum += float(np.abs(rebuilt - truth[n, g][mask]).sum())
            err_n += int(mask.sum())

    # A fault heading for its limit may cross it after the run ends: the simulated GPU goes on (the agent
    # does not) for LEAD_S, so a CRITICAL in the run's last minutes is judged by whether it came true.
    for (n, g) in watched:
        cluster.gpus[n][g].advance_to(float(duration - 1 + LEAD_S), 0.0)
    uuid_of = {(n, t.device.index): t.device.uuid for n, core in enumerate(cores) for t in core.tracks}
    faults = [_judge(scenario.name, f, events, uuid_of, health) for f in scenario.faults]
    remediation = np.isin(actions, [ACTION_RANK[a] for a in REMEDIATIONS])
    false_remediations = 0
    for n in range(scenario.nodes):
        for g in range(n_gpus):
            mine = sorted((f for f in scenario.faults if (f.node, f.gpu) == (n, g)), key=lambda f: f.at_s)
            false_remediations += bool(remediation[n, g, :int(mine[0].at_s) if mine else duration].any())
            for i, f in enumerate(mine):
                end = int(mine[i + 1].at_s) if i + 1 < len(mine) else duration
                res = faults[scenario.faults.index(f)]
                window = slice(int(f.at_s), max(end, int(f.at_s) + 1))
                crossed = cluster.gpus[n][g].crossed_s  # the simulated GPU's truth: first second at a limit
                last = end if i + 1 < len(mine) else duration + LEAD_S  # the last fault: its crossing after the run
                res.crossed_s = crossed if crossed is not None and window.start <= crossed < last else None
                withdrawn = [e.ts_ms / 1000 for _, e in events if e.gpu_uuid == uuid_of[(n, g)]
                             and e.attributes.get("condition") == "lowered" and window.start <= e.ts_ms / 1000 < end]
                _grade(res, verdicts[n, g, window], actions[n, g, window],
                       withdrawn[-1] - window.start if withdrawn and f.kind in PREDICTIVE and res.crossed_s is None
                       else None)
                flagged = np.flatnonzero(verdicts[n, g, window] == VERDICT_RANK[HealthVerdict.CRITICAL])
                res.flagged_s = float(flagged[0]) + f.at_s if flagged.size else None
                heat = float(own_heat[(n, g)][window].max()) if (n, g) in own_heat else None
                left = float(runway[(n, g)][window].min()) if (n, g) in runway else None
                expected = expected_verdict(f, res.crossed_s is not None, heat, left)
                res.expected = tuple(x.value for x in expected)
                res.quiet = expected == (V.PASS, A.NONE) and f.verdict is None
                if HealthAction(res.expected[1]) not in REMEDIATIONS and remediation[n, g, window].any():
                    false_remediations += 1
    faulty: dict[tuple[int, int], float] = {}
    for f in scenario.faults:  # a GPU's first fault: one GPU may carry several (a collapse, then the loss)
        faulty[(f.node, f.gpu)] = min(f.at_s, faulty.get((f.node, f.gpu), f.at_s))
    false_alarms = sum(
        1 for n, e in events
        if e.kind in ALARM_KINDS and e.severity is not Severity.INFO and not any(
            uuid_of[(fn, fg)] == e.gpu_uuid and e.ts_ms / 1000 >= at for (fn, fg), at in faulty.items())
    )
    samples_fixed = int(np.count_nonzero(~np.isnan(truth)))
    return ScenarioResult(scenario.name, scenario.nodes * n_gpus, duration, sum(c.samples_taken for c in cores),
                          samples_fixed, sum(c.watch_reads for c in cores), err_sum, err_n, faults, false_alarms,
                          len(events), wall, false_remediations, sum(c.points_taken for c in cores))


def _grade(res: FaultResult, verdicts: np.ndarray, actions: np.ndarray, withdrawn: float | None) -> None:
    """The verdict and action a fault is judged by, from its GPU's per-second ones over the fault's window: the
    worst, or for a forecast that did not come true and that the agent withdrew (a CRITICAL condition ``lowered``,
    ``withdrawn`` seconds into the window), the worst from when the verdict followed: the grade the fault settled at.
    The worst is kept beside it (``verdict_worst``), and remediations are counted over the whole window either way."""
    res.verdict_worst = VERDICTS[int(verdicts.max()) + 1].value
    res.action_worst = ACTIONS[int(actions.max())].value
    start = 0
    if withdrawn is not None:
        below = np.flatnonzero(verdicts[int(withdrawn):] < VERDICT_RANK[V.CRITICAL])
        start = int(withdrawn) + int(below[0]) if below.size else 0
    res.verdict = VERDICTS[int(verdicts[start:].max()) + 1].value
    res.action = ACTIONS[int(actions[start:].max())].value


def expected_verdict(f: Fault, reached_limit: bool = False, own_heat_c: float | None = None,
                     runway_s: float | None = None) -> tuple[HealthVerdict, HealthAction]:
    """``own_heat_c``: the most a thermal fault heated its GPU (beyond where it would be without it);
    ``runway_s``: the least time to exhaustion a leak left; None: not known (graded as before)."""
    if f.kind in PREDICTIVE:
        table = REACHES_LIMIT if reached_limit else STAYS_BELOW
        default = table["thermal" if f.kind in THERMAL_KINDS else f.kind]
        if not reached_limit and f.kind in THERMAL_KINDS and own_heat_c is not None:
            default = (default if own_heat_c >= THERMAL_WARN_C else (V.INFO, A.WATCH) if own_heat_c >= THERMAL_INFO_C
                       else (V.PASS, A.NONE))
        elif not reached_limit and f.kind == "memory_leak" and runway_s is not None and runway_s > LEAK_HORIZON_S:
            default = (V.PASS, A.NONE)
    elif f.kind == "xid":
        rule = XIDS.get(f.xid)
        default = (rule.verdict, rule.action) if rule else (V.WARNING, A.WATCH)
    else:
        default = EXPECTED_VERDICT[f.kind]
    return f.verdict or default[0], f.action or default[1]


def _judge(name: str, f: Fault, events: list[tuple[int, GpuEvent]], uuid_of: dict, health: np.ndarray) -> FaultResult:
    target = uuid_of[(f.node, f.gpu)]
    hits = [e.ts_ms / 1000 - f.at_s for _, e in events
            if e.gpu_uuid == target and e.kind in EXPECTED[f.kind] and e.ts_ms / 1000 >= f.at_s]
    at = int(f.at_s)
    before = float(health[f.node, f.gpu, max(0, at - 1)])
    after = float(health[f.node, f.gpu, at:].min()) if at < health.shape[2] else before
    return FaultResult(name, f.kind, f.node, f.gpu, f.at_s, bool(hits), min(hits) if hits else None, before, after)


def evaluate(paths: list[Path] | None = None, policy: SamplingPolicy | None = None) -> dict:
    results = [run_scenario(p, policy) for p in (paths or scenario_library())]
    judged = [f for r in results for f in r.faults]
    faults = [f for f in judged if not f.quiet]  # the faults there is something to detect
    delays = [f.delay_s for f in faults if f.delay_s is not None]
    adaptive = sum(r.samples_adaptive for r in results)
    fixed = sum(r.samples_fixed for r in results)
    return {
        "scenarios": [r.name for r in results],
        "gpu_seconds": fixed,
        "samples_fixed_1s": fixed,
        "samples_adaptive": adaptive,
        "sample_reduction": round(fixed / max(adaptive, 1), 2),
        "watch_reads": sum(r.watch_reads for r in results),
        "light_points": sum(r.light_points for r in results),
        "util_mae_pct_points": round(
            sum(r.abs_err_sum for r in results) / max(1, sum(r.abs_err_n for r in results)), 3),
        "faults_injected": len(faults),
        "faults_detected": sum(f.detected for f in faults),
        "detection_delay_p95_s": round(float(np.percentile(delays, 95)), 2) if delays else None,
        "detection_delay_max_s": round(max(delays), 2) if delays else None,
        # Sudden faults only: a slow drift or leak is not visible seconds after it starts; its figure is its lead.
        "detection_delay_p95_s_sudden": round(float(np.percentile(sudden, 95)), 2) if (sudden := [
            f.delay_s for f in faults if f.delay_s is not None and f.kind not in SLOW]) else None,
        "health_dropped": sum(f.health_min_after < f.health_before for f in faults),
        "false_alarms": sum(r.false_alarms for r in results),
        # WARNING or worse on a GPU with no fault (yet), per GPU-day of simulated time.
        "false_alarms_per_gpu_day": round(sum(r.false_alarms for r in results) / max(fixed / 86400.0, 1e-9), 4),
        "predictive_faults": len(leads := [f.lead_time_s for f in faults if f.lead_time_s is not None]),
        "flagged_120s_before": sum(lead <= -120.0 for lead in leads),
        # A lead of 120 s is possible at all only for a fault that takes 120 s or more to reach its limit.
        "lead_120s_possible": sum(f.crossed_s - f.at_s >= 120.0 for f in faults if f.lead_time_s is not None),
        "faults_below_threshold": len(judged) - len(faults),
        "verdict_accuracy": round(sum(f.verdict_ok for f in judged) / len(judged), 3) if judged else None,
        # The same by the worst verdict over each fault's window, forecasts the agent withdrew included.
        "verdict_accuracy_worst": round(sum(f.worst_ok for f in judged) / len(judged), 3) if judged else None,
        "verdicts_lowered": sum(f.verdict != f.verdict_worst for f in judged),
        "false_remediations": sum(r.false_remediations for r in results),
        "faults": [
            {"scenario": f.scenario, "kind": f.kind, "gpu": f"{f.node}/{f.gpu}", "at_s": f.at_s,
             "detected": f.detected, "delay_s": f.delay_s, "health_before": round(f.health_before, 1),
             "health_min_after": round(f.health_min_after, 1), "verdict": f.verdict, "action": f.action,
             "verdict_worst": f.verdict_worst, "action_worst": f.action_worst,
             "expected": list(f.expected), "lead_time_s": f.lead_time_s,
             "crossed_after_s": None if f.lead_time_s is None else f.crossed_s - f.at_s, "below_threshold": f.quiet}
            for f in judged
        ],
        "per_scenario": {
            r.name: {"sample_reduction": round(r.samples_fixed / max(r.samples_adaptive, 1), 2),
                     "util_mae_pct_points": round(r.abs_err_sum / max(r.abs_err_n, 1), 3),
                     "false_alarms": r.false_alarms, "false_remediations": r.false_remediations,
                     "wall_s": round(r.wall_s, 2)}
            for r in results
        },
    }


def scenario_paths(name: str) -> list[Path]:
    """A scenario file, a folder of them (``unseen``: the held-out set), or a name in agent/scenarios."""
    p = Path(name) if Path(name).exists() else SCENARIO_DIR / name
    if p.is_dir():
        return sorted(p.glob("*.yaml"))
    return [p if p.exists() else SCENARIO_DIR / f"{name}.yaml"]


def evaluate_scenarios(scenarios: list[str], policy_path: str | None = None) -> dict:
    """`gpuaware eval sampling`: ``scenarios`` by file, folder or name in gpuaware/agent/scenarios (every library one
    when empty) under the policy of ``policy_path`` (the default policy when None)."""
    policy = load_policy(policy_path) if policy_path else None
    paths = [p for s in scenarios for p in scenario_paths(s)] or None
    return evaluate(paths, policy)
