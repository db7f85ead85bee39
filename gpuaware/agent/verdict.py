"""Graded verdicts: PASS / INFO / WARNING / CRITICAL / UNKNOWN, with reasons and a recommended action.

The explainable score (``gpuaware.agent.health_score``) says *how* unwell a GPU is; an operator also needs to
know *what to do*. A verdict is the worst of what each rule says, and its action the strongest
any rule recommends. The rules, their thresholds and their sources are tabled in docs/health.md:

- the score's band (with its hysteresis): HEALTHY -> PASS, or INFO below 95;
  DEGRADED -> WARNING/watch; CRITICAL -> CRITICAL/drain; a lost GPU -> CRITICAL/reboot node.
  Once a GPU has XIDs, its xid component is left out of that score: the taxonomy judges XIDs;
- the XID taxonomy (``XIDS``, after NVIDIA's XID catalogue and Health Validation checks):
  application XIDs are the workload's when several GPUs of the node see them, the GPU's when
  one GPU keeps seeing them; hardware XIDs carry their documented verdict and action, escalated
  by repeat rules over 1 h, 24 h and 7 days;
- the edge detectors' findings (thermal runaway, peer outliers, stuck busy, ECC rates, telemetry
  collapse), each held for a while after it fired.

The node is judged with its GPUs because the application-XID rule needs them all.
A verdict improves only after the better one held for ``IMPROVE_AFTER_S``, so it does not flap.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gpuaware.agent.health_score import band_of
from gpuaware.contract.events import HealthAction, HealthBand, HealthVerdict

VERDICT_RANK = {HealthVerdict.UNKNOWN: -1, HealthVerdict.PASS: 0, HealthVerdict.INFO: 1, HealthVerdict.WARNING: 2,
                HealthVerdict.CRITICAL: 3}
ACTION_RANK = {a: i for i, a in enumerate(HealthAction)}  # UNKNOWN, NONE, WATCH, DRAIN, RESET_GPU, ...
# Actions that take the GPU (and its workloads) out of service: what the remediation chain acts on.
REMEDIATIONS = frozenset({HealthAction.DRAIN, HealthAction.RESET_GPU, HealthAction.REBOOT_NODE,
                          HealthAction.SERVICE_REQUEST})

HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY
IMPROVE_AFTER_S = 30.0
INFO_BELOW = 95.0  # a healthy score with a component this far down is worth a look, not a page


@dataclass(frozen=True)
class XidRule:
    meaning: str
    cls: str  # app, memory, nvlink, bus, gsp, engine
    verdict: HealthVerdict
    action: HealthAction
    hold_s: float  # how long one occurrence keeps its verdict without a remediation


W, C = HealthVerdict.WARNING, HealthVerdict.CRITICAL
A = HealthAction
# After NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors, "Resolution Bucket") and Health
# Validation's XID checks (docs.nvidia.com/health-validation/reference/checks/xid); docs/health.md.
XIDS: dict[int, XidRule] = {
    13: XidRule("graphics engine exception", "app", HealthVerdict.INFO, A.NONE, HOUR),
    31: XidRule("GPU memory page fault (illegal address)", "app", HealthVerdict.INFO, A.NONE, HOUR),
    43: XidRule("GPU stopped processing (channel reset)", "app", HealthVerdict.INFO, A.NONE, HOUR),
    45: XidRule("preemptive cleanup after an earlier error", "app", HealthVerdict.INFO, A.NONE, HOUR),
    48: XidRule("double-bit ECC error", "memory", C, A.RESET_GPU, DAY),
    61: XidRule("internal micro-controller breakpoint", "engine", C, A.RESET_GPU, DAY),
    62: XidRule("internal micro-controller halt", "engine", C, A.RESET_GPU, DAY),
    63: XidRule("row remap / page retirement recorded: reset to apply", "memory", W, A.RESET_GPU, DAY),
    64: XidRule("row remap / page retirement failed", "memory", C, A.SERVICE_REQUEST, WEEK),
    74: XidRule("NVLink error", "nvlink", C, A.RESET_GPU, DAY),
    79: XidRule("GPU has fallen off the bus", "bus", C, A.REBOOT_NODE, DAY),
    92: XidRule("high single-bit ECC error rate", "memory", W, A.WATCH, HOUR),
    94: XidRule("contained ECC error: the affected application was stopped", "memory", W, A.DRAIN, DAY),
    95: XidRule("uncontained ECC error: every application on the GPU affected", "memory", C, A.RESET_GPU, DAY),
    109: XidRule("context switch timeout", "engine", W, A.RESET_GPU, DAY),
    119: XidRule("GSP RPC timeout", "gsp", C, A.RESET_GPU, DAY),
    120: XidRule("GSP error", "gsp", C, A.RESET_GPU, DAY),
    140: XidRule("unrecovered ECC error", "memory", C, A.RESET_GPU, DAY),
}
UNKNOWN_XID = XidRule("unclassified XID", "other", W, A.WATCH, HOUR)
APP_CROSS_GPU_S = 600.0  # app XIDs on another GPU this close to this GPU's last one: the workload's fault
APP_REPEAT_24H = 3  # the same app XID this often on one GPU only, in 24 h: suspect the GPU
FATAL_REPEAT_24H = 5  # a hardware XID this often in 24 h: service request (NVSentinel's rule)
FATAL_REPEAT_7D = 10
BURST_1H = 3  # a hardware XID this often in an hour: the action escalates one step

# Detector findings: (verdict, action, hold in seconds).
FINDINGS: dict[str, tuple[HealthVerdict, HealthAction, float]] = {
    # Graded by headroom (each finding carries its grade; these rows are the defaults): heading for a
    # limit CRITICAL, settling below it WARNING, a trend far from it INFO (docs/health.md, "Severity").
    "thermal_runaway": (C, A.DRAIN, 600.0),
    "thermal_peer": (W, A.DRAIN, 600.0),
    "memory_leak": (C, A.DRAIN, 600.0),
    "memory_wear": (C, A.DRAIN, 600.0),
    "clock_peer": (W, A.WATCH, 600.0),
    "power_peer": (W, A.WATCH, 600.0),
    "ecc_peer": (W, A.WATCH, 600.0),
    "stuck_busy": (W, A.RESET_GPU, 600.0),
    "ecc_sbe_rate": (W, A.WATCH, 600.0),
    "telemetry_collapse": (W, A.DRAIN, 600.0),
    "hst": (HealthVerdict.INFO, A.WATCH, 600.0),
}


def _worse(a: HealthVerdict | None, b: HealthVerdict | None, detector: str) -> HealthVerdict | None:
    default = FINDINGS.get(detector, (HealthVerdict.INFO,))[0]
    return a if VERDICT_RANK[a or default] >= VERDICT_RANK[b or default] else b


@dataclass
class Judgement:
    verdict: HealthVerdict = HealthVerdict.UNKNOWN
    action: HealthAction = HealthAction.UNKNOWN
    reasons: list[str] = field(default_factory=list)

    def add(self, verdict: HealthVerdict, action: HealthAction, reason: str) -> None:
        if VERDICT_RANK[verdict] > VERDICT_RANK[self.verdict]:
            self.verdict = verdict
        if ACTION_RANK[action] > ACTION_RANK[self.action]:
            self.action = action
        self.reasons.append(reason)


def escalate(action: HealthAction) -> HealthAction:
    order = [A.WATCH, A.DRAIN, A.RESET_GPU, A.REBOOT_NODE, A.SERVICE_REQUEST]
    return order[min(order.index(action) + 1, len(order) - 1)] if action in order else action


@dataclass
class GpuVerdict:
    """One GPU's inputs to the verdict and the verdict it holds now."""

    xids: deque = field(default_factory=lambda: deque(maxlen=512))  # (ts, xid), a week at most
    # detector -> (last seen, the grade it gave or None for its FINDINGS row, action, closed)
    findings: dict[str, tuple[float, HealthVerdict | None, HealthAction | None, bool]] = field(default_factory=dict)
    current: Judgement = field(default_factory=Judgement)
    better_since: float | None = None


class NodeVerdicts:
    def __init__(self, n_gpus: int):
        self.gpus = [GpuVerdict() for _ in range(n_gpus)]

    def learn_xid(self, gpu: int, ts: float, xid: int) -> None:
        g = self.gpus[gpu]
        g.xids.append((ts, xid))
        while g.xids and g.xids[0][0] < ts - WEEK:
            g.xids.popleft()

    def learn_finding(self, gpu: int, ts: float, detector: str, verdict: HealthVerdict | None = None,
                      action: HealthAction | None = None, closed: bool = False, lowered: bool = False) -> None:
        """A detector's finding (``verdict``/``action``: its grade, None for its FINDINGS row). While seen it is
        held at the worst grade since it opened, unless the detector ``lowered`` it (a forecast it withdrew: the
        grade it gives now stands, and the verdict follows after ``IMPROVE_AFTER_S``); once ``closed`` its hold runs
        out from then at that grade."""
        findings = self.gpus[gpu].findings
        last = findings.get(detector)
        if closed:
            if last is not None:
                findings[detector] = (ts, last[1], last[2], True)
            return
        if not lowered and last is not None and not last[3] and \
                ts - last[0] <= FINDINGS.get(detector, (None, None, 600.0))[2]:
            verdict = _worse(verdict, last[1], detector)
            action = last[2] if verdict is last[1] and last[2] is not None else action
        findings[detector] = (ts, verdict, action, False)

    def reset(self, gpu: int) -> None:
        """A validated remediation (GPU reset, reboot) clears what the XIDs and findings said."""
        g = self.gpus[gpu]
        g.xids.clear()
        g.findings.clear()
        # A reset device starts afresh: its old verdict is no reason to hold a better one back (the
        # scheduler's validation window is what proves the GPU before it returns to service).
        g.current, g.better_since = Judgement(), None

    def _app_on_others(self, gpu: int, at: float) -> int:
        return sum(1 for i, g in enumerate(self.gpus) if i != gpu and any(
            abs(at - ts) <= APP_CROSS_GPU_S and XIDS.get(x, UNKNOWN_XID).cls == "app" for ts, x in g.xids))

    def _xid_rules(self, gpu: int, now: float, j: Judgement) -> None:
        xids = self.gpus[gpu].xids
        for code in sorted({x for _, x in xids}):
            rule = XIDS.get(code, UNKNOWN_XID)
            times = [ts for ts, x in xids if x == code]
            last = times[-1]
            day = sum(1 for ts in times if now - ts <= DAY)
            if rule.cls == "app":
                if now - last > rule.hold_s and day < APP_REPEAT_24H:
                    continue
                others = self._app_on_others(gpu, last)
                if others:
                    j.add(HealthVerdict.INFO, A.NONE,
                          f"XID {code} ({rule.meaning}) here and on {others} other GPU(s): the workload, not the GPU")
                elif day >= APP_REPEAT_24H:
                    j.add(W, A.DRAIN, f"XID {code} ({rule.meaning}) {day}x in 24 h on this GPU only: suspect the GPU")
                else:
                    j.add(HealthVerdict.INFO, A.NONE, f"XID {code} ({rule.meaning}): restart the application")
                continue
            week = len(times)
            hour = sum(1 for ts in times if now - ts <= HOUR)
            if now - last > rule.hold_s and day < FATAL_REPEAT_24H and week < FATAL_REPEAT_7D:
                continue
            if day >= FATAL_REPEAT_24H or week >= FATAL_REPEAT_7D:
                j.add(C, A.SERVICE_REQUEST, f"XID {code} ({rule.meaning}) {day}x in 24 h, {week}x in 7 days")
            elif hour >= BURST_1H:
                j.add(rule.verdict, escalate(rule.action), f"XID {code} ({rule.meaning}) {hour}x in 1 h")
            else:
                j.add(rule.verdict, rule.action, f"XID {code} ({rule.meaning})")

    def judge(self, gpu: int, now: float, score: float, band: HealthBand, components: dict[str, float],
              lost: bool, seen: bool) -> Judgement:
        """What the GPU's verdict is now (``seen``: it has been read at least once)."""
        j = Judgement()
        if lost:
            j.add(C, A.REBOOT_NODE, "GPU stopped answering (fallen off the bus?)")
        elif not seen:
            return self._settle(gpu, now, Judgement(reasons=["no reading yet"]))
        else:
            if self.gpus[gpu].xids:
                # The XID rules judge XIDs (an application's XID is not the GPU's): the score without
                # its xid component is what the bands judge then.
                score = min(100.0, score + 100.0 - components.get("xid", 100.0))
                components = {c: v for c, v in components.items() if c != "xid"}
                band = band_of(score)
            weak = ", ".join(f"{c} {v:.0f}" for c, v in components.items() if v < 100)
            if band is HealthBand.CRITICAL:
                j.add(C, A.DRAIN, f"health score {score:.0f} (critical; {weak})")
            elif band is HealthBand.DEGRADED:
                j.add(W, A.WATCH, f"health score {score:.0f} (degraded; {weak})")
            elif score < INFO_BELOW:
                j.add(HealthVerdict.INFO, A.WATCH, f"health score {score:.0f} ({weak})")
            else:
                j.add(HealthVerdict.PASS, A.NONE, "all checks pass")
        self._xid_rules(gpu, now, j)
        for detector, (ts, graded, graded_action, closed) in sorted(self.gpus[gpu].findings.items()):
            verdict, action, hold = FINDINGS.get(detector, (HealthVerdict.INFO, A.WATCH, 600.0))
            verdict, action = graded or verdict, graded_action or action
            if now - ts <= hold and verdict is not HealthVerdict.PASS:
                what = "closed" if closed else "seen"
                j.add(verdict, action, f"detector {detector} {what} {now - ts:.0f} s ago")
        if len(j.reasons) > 1 and j.reasons[0] == "all checks pass":
            j.reasons.pop(0)
        return self._settle(gpu, now, j)

    def _settle(self, gpu: int, now: float, j: Judgement) -> Judgement:
        """Worse at once; better only once it has held for IMPROVE_AFTER_S."""
        g = self.gpus[gpu]
        cur = g.current
        worse = (VERDICT_RANK[j.verdict] > VERDICT_RANK[cur.verdict] or ACTION_RANK[j.action] > ACTION_RANK[cur.action]
                 or HealthVerdict.UNKNOWN in (cur.verdict, j.verdict))
        if worse or (j.verdict, j.action) == (cur.verdict, cur.action):
            g.current, g.better_since = j, None
        else:
            g.better_since = now if g.better_since is None else g.better_since
            if now - g.better_since >= IMPROVE_AFTER_S:
                g.current, g.better_since = j, None
        return g.current

    def node(self) -> Judgement:
        """The node's verdict: its worst GPU; half its GPUs or more needing a reset (or lost) -> reboot."""
        j = Judgement()
        for i, g in enumerate(self.gpus):
            c = g.current
            if VERDICT_RANK[c.verdict] > VERDICT_RANK[HealthVerdict.PASS]:
                j.add(c.verdict, c.action, f"gpu {i}: {'; '.join(c.reasons)}")
            elif c.verdict is HealthVerdict.PASS:
                j.add(c.verdict, c.action, "")
        resets = sum(1 for g in self.gpus if ACTION_RANK[g.current.action] >= ACTION_RANK[A.RESET_GPU])
        if len(self.gpus) > 1 and resets * 2 >= len(self.gpus):
            j.add(C, A.REBOOT_NODE, f"{resets} of {len(self.gpus)} GPUs need a reset")
        j.reasons = [r for r in j.reasons if r] or (["all GPUs pass"] if j.verdict is HealthVerdict.PASS else [])
        return j
