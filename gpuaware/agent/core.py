"""The agent's per-node loop, free of I/O timing: ``tick(now)`` reads, detects, scores and samples.

The live agent calls ``tick`` from an asyncio loop; the sampling evaluation and the tests call it
with a simulated clock. Both run exactly this code.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuaware.agent.anomaly import Finding, GpuDetectors
from gpuaware.agent.collectors.base import Collector
from gpuaware.agent.health_score import HealthScorer
from gpuaware.agent.peers import NodePeers
from gpuaware.agent.readings import (
    CRITICAL_XIDS,
    POWER_THROTTLE_MASK,
    THERMAL_THROTTLE_MASK,
    GpuDevice,
    GpuLost,
    Reading,
)
from gpuaware.agent.sampling import AdaptiveSampler, SamplingPolicy
from gpuaware.agent.verdict import FINDINGS, Judgement, NodeVerdicts
from gpuaware.contract.events import (
    EventKind,
    GpuEvent,
    GpuInfo,
    GpuSample,
    HealthBand,
    HealthVerdict,
    Severity,
    TelemetryBatch,
    WatchPoint,
)

log = logging.getLogger(__name__)


@dataclass
class GpuTrack:
    device: GpuDevice
    sampler: AdaptiveSampler
    detectors: GpuDetectors
    health: HealthScorer
    seq: int = 0
    last_watch: Reading | None = None
    last_sample: Reading | None = None
    lost: bool = False
    throttle: int = 0
    last_xid: int | None = None
    cordoned: bool = False
    events: dict[str, int] = field(default_factory=dict)
    xids: dict[int, int] = field(default_factory=dict)  # XID code -> times reported (alerts tell app XIDs apart)
    verdict: Judgement = field(default_factory=Judgement)


@dataclass
class TickOutput:
    samples: list[tuple[int, int, Reading]] = field(default_factory=list)  # (gpu index, seq, reading)
    points: list[tuple[int, Reading]] = field(default_factory=list)  # (gpu index, watch read): light points
    events: list[GpuEvent] = field(default_factory=list)


class AgentCore:
    def __init__(self, collector: Collector, policy: SamplingPolicy, clock: Callable[[], float] = time.time):
        self.collector = collector
        self.node = collector.node
        self.clock = clock
        self.policy = policy.for_node(self.node)
        self.devices = collector.devices()
        self.tracks = [
            GpuTrack(d, AdaptiveSampler(self.policy, d.fb_total_mib, d.power_limit_w or 300.0),
                     GpuDetectors(d, seed=d.index), HealthScorer(d.slowdown_temp_c or 87.0))
            for d in self.devices
        ]
        self.verdicts = NodeVerdicts(len(self.tracks))
        self.peers = NodePeers([d.model for d in self.devices], [d.power_limit_w or 300.0 for d in self.devices],
                               slowdown_c=[d.slowdown_temp_c or 87.0 for d in self.devices])
        self.watch_reads = 0
        self.samples_taken = 0
        self.points_taken = 0
        self.applied_caps: dict[int, int] = {}  # GPU index -> power cap (W) NVML accepted; acknowledged on the Node
        self.next_watch = 0.0
        self._event_ids = itertools.count()

    def set_policy(self, policy: SamplingPolicy) -> None:
        self.policy = policy.for_node(self.node)
        for t in self.tracks:
            t.sampler.set_policy(self.policy)

    def set_cordoned(self, indices: set[int]) -> list[int]:
        """The GPUs the node's ``gpuaware.io/cordoned-gpus`` annotation names: sampled at the floor
        while they drain and are looked at (the scheduler places nothing on them). Returns the GPUs
        whose state changed."""
        changed = []
        for track in self.tracks:
            cordoned = track.device.index in indices
            if cordoned != track.cordoned:
                track.cordoned = track.sampler.pinned = cordoned
                changed.append(track.device.index)
                if cordoned:
                    track.sampler.snap()
        return changed

    # ------------------------------------------------------------------ events

    def _event(self, out: TickOutput, track: GpuTrack, ts: float, kind: EventKind, severity: Severity,
               message: str, metric: str | None = None, value: float | None = None, score: float | None = None,
               **attributes: str) -> None:
        ev = GpuEvent(
            event_id=f"{self.node}-{uuid.uuid4().hex[:12]}", ts_ms=int(ts * 1000), node=self.node,
            gpu_uuid=track.device.uuid, kind=kind, severity=severity, metric=metric, value=value, score=score,
            message=message, attributes=attributes,
        )
        track.events[kind] = track.events.get(kind, 0) + 1
        out.events.append(ev)

    def _judge(self, track: GpuTrack, ts: float) -> bool:
        """Re-judge the GPU's verdict; True when its verdict or action changed."""
        before = (track.verdict.verdict, track.verdict.action)
        track.verdict = self.verdicts.judge(track.device.index, ts, track.health.score, track.health.band,
                                            track.health.components(), track.lost, track.last_watch is not None)
        after = (track.verdict.verdict, track.verdict.action)
        # The first judgement of a healthy GPU is no news: no event per GPU at every start.
        return after != before and not (before[0] is HealthVerdict.UNKNOWN and after[0] is HealthVerdict.PASS)

    def _health_events(self, out: TickOutput, track: GpuTrack, ts: float) -> None:
        """One HEALTH_CHANGE event when the band or the verdict changed; it carries both (docs/health.md)."""
        change = track.health.update_band()
        judged = self._judge(track, ts)
        if change is None and not judged:
            return
        old, new = change or (track.health.band, track.health.band)
        v = track.verdict
        severity = {HealthBand.CRITICAL: Severity.CRITICAL, HealthBand.DEGRADED: Severity.WARNING}.get(
            new, Severity.INFO)
        if v.verdict is HealthVerdict.CRITICAL:
            severity = Severity.CRITICAL
        elif v.verdict is HealthVerdict.WARNING and severity is Severity.INFO:
            severity = Severity.WARNING
        parts = ", ".join(f"{c}={v:.0f}" for c, v in track.health.components().items() if v < 100)
        head = f"health {old.value.lower()} -> {new.value.lower()}" if change else f"verdict {v.verdict.value}"
        self._event(out, track, ts, EventKind.HEALTH_CHANGE, severity,
                    f"{head} (score {track.health.score:.0f}; {parts}); {v.verdict.value}, action "
                    f"{v.action.value.lower()}: {'; '.join(v.reasons)}",
                    metric="health_score", value=track.health.score, old_band=old.value, new_band=new.value,
                    verdict=v.verdict.value, action=v.action.value, reasons="\n".join(v.reasons),
                    **{f"component.{c}": f"{v:.1f}" for c, v in track.health.components().items()})
        track.sampler.snap()

    def _throttle_events(self, out: TickOutput, track: GpuTrack, r: Reading) -> None:
        now = r.throttle_reasons or 0
        before = track.throttle
        for mask, start, stop, what in (
            (POWER_THROTTLE_MASK, EventKind.POWER_THROTTLE_START, EventKind.POWER_THROTTLE_STOP, "power"),
            (THERMAL_THROTTLE_MASK, EventKind.THERMAL_THROTTLE_START, EventKind.THERMAL_THROTTLE_STOP, "thermal"),
        ):
            if now & mask and not before & mask:
                self._event(out, track, r.ts, start, Severity.WARNING, f"{what} throttling started",
                            metric="throttle_reasons", value=float(now), reasons=hex(now))
                track.sampler.snap()
            elif before & mask and not now & mask:
                self._event(out, track, r.ts, stop, Severity.INFO, f"{what} throttling stopped",
                            metric="throttle_reasons", value=float(now))
        track.throttle = now

    # ------------------------------------------------------------------ the loop

    def tick(self, now: float | None = None) -> TickOutput:
        now = self.clock() if now is None else now
        out = TickOutput()
        for index in self.collector.gpu_resets():
            self.gpu_reset(index)
        for x in self.collector.xid_events():
            track = self.tracks[x.gpu_index]
            track.health.learn_xid(x.ts, x.xid)
            self.verdicts.learn_xid(track.device.index, x.ts, x.xid)
            track.last_xid = x.xid
            track.xids[x.xid] = track.xids.get(x.xid, 0) + 1
            critical = x.xid in CRITICAL_XIDS
            self._event(out, track, x.ts, EventKind.XID, Severity.CRITICAL if critical else Severity.WARNING,
                        f"XID {x.xid}", metric="xid", value=float(x.xid), xid=str(x.xid))
            track.sampler.snap()
            self._health_events(out, track, x.ts)
        if now + 1e-9 < self.next_watch:
            return out
        self.next_watch = now + self.policy.floor_s
        reads = self._watch_round(out, now)
        full = {t.device.index: t.last_sample for t in self.tracks if t.last_sample is not None}
        peer_findings: dict[int, list[Finding]] = {}
        for index, finding in self.peers.learn(reads, full):
            peer_findings.setdefault(index, []).append(finding)
        for index, watch in reads.items():
            track = self.tracks[index]
            found = track.detectors.learn_one(watch, track.last_sample) + peer_findings.get(index, [])
            for f in found:  # every sighting keeps its verdict held; only news makes an event
                self.verdicts.learn_finding(index, watch.ts, f.detector, f.verdict, f.action,
                                            closed=f.state == "closed", lowered=f.state == "lowered")
            self._after_watch(out, track, watch, [f for f in found if track.detectors.learn_finding(f, watch.ts)])
        return out

    def gpu_reset(self, index: int) -> None:
        """GPU ``index`` was reset: what its XIDs, findings and score said was the old device state's; it is
        judged afresh from its next reads."""
        track = self.tracks[index]
        d = track.device
        track.health = HealthScorer(d.slowdown_temp_c or 87.0)
        track.detectors = GpuDetectors(d, seed=d.index)
        track.last_xid = None
        self.verdicts.reset(index)  # its next watch read emits the fresh verdict
        track.sampler.snap()

    def _watch_round(self, out: TickOutput, now: float) -> dict[int, Reading]:
        """One watch read of every GPU still answering (a GPU that stopped is marked lost), timed."""
        reads = {}
        for track in self.tracks:
            if track.lost:
                continue
            started = time.perf_counter()
            try:
                watch = self.collector.read(track.device.index, full=False)
            except GpuLost as exc:
                track.lost = True
                track.health.learn_lost(now)
                self._judge(track, now)
                v = track.verdict
                self._event(out, track, now, EventKind.HEALTH_CHANGE, Severity.CRITICAL, str(exc),
                            metric="health_score", value=0.0, old_band=track.health.band.value, new_band="CRITICAL",
                            verdict=v.verdict.value, action=v.action.value, reasons="\n".join(v.reasons))
                track.health.band = HealthBand.CRITICAL
                continue
            if watch.read_s is None:
                watch.read_s = time.perf_counter() - started
            self.watch_reads += 1
            track.last_watch = watch
            reads[track.device.index] = watch
        return reads

    def _after_watch(self, out: TickOutput, track: GpuTrack, watch: Reading, found: list[Finding]) -> None:
        """Events, health, verdict and (when due) the full sample, from one watch read and its findings."""
        self._throttle_events(out, track, watch)
        for f in found:
            kind = EventKind.ECC_SBE if f.detector == "ecc_sbe_rate" else EventKind.ANOMALY
            grade = f.verdict or FINDINGS.get(f.detector, (HealthVerdict.INFO,))[0]
            # A trend (INFO) or a condition closing is a dashboard mark, not an alarm: no penalty, no page.
            alarm = grade in (HealthVerdict.WARNING, HealthVerdict.CRITICAL)
            if kind is EventKind.ANOMALY and alarm and f.state != "lowered":  # a withdrawn forecast is no new alarm
                track.health.learn_anomaly(watch.ts, f.detector)
            severity = Severity.CRITICAL if grade is HealthVerdict.CRITICAL else (
                Severity.WARNING if alarm else Severity.INFO)
            self._event(out, track, watch.ts, kind, severity, f.message, metric=f.metric,
                        value=f.value, score=f.score, detector=f.detector, condition=f.state)
            track.sampler.snap()
        dbe_before = track.health._last_dbe
        track.health.learn_one(watch)
        if dbe_before is not None and (watch.ecc_dbe_volatile or 0) > dbe_before:
            self._event(out, track, watch.ts, EventKind.ECC_DBE, Severity.CRITICAL,
                        f"{watch.ecc_dbe_volatile - dbe_before} new double-bit ECC error(s)",
                        metric="ecc_dbe_volatile", value=float(watch.ecc_dbe_volatile))
            track.sampler.snap()
        self._health_events(out, track, watch.ts)
        sampled = False
        if track.sampler.due(watch):
            moved = track.sampler.urgent or (track.sampler.moved is not None and not track.sampler.light_move())
            try:
                sample = self.collector.read(track.device.index, full=True)
            except GpuLost:
                return  # seen as lost on the next watch read
            track.seq += 1
            self.samples_taken += 1
            track.sampler.taken(sample, moved)
            track.last_sample = sample
            out.samples.append((track.device.index, track.seq, sample))
            sampled = True
        points = track.sampler.light(watch, sampled)
        self.points_taken += len(points)
        out.points.extend((track.device.index, p) for p in points)


def _q(x: float | None, scale: float = 1.0) -> int | None:
    return None if x is None else round(x * scale)


class BatchBuilder:
    """Collects one node's samples into a ``TelemetryBatch`` per flush window."""

    def __init__(self, node: str, devices: list[GpuDevice]):
        self.node = node
        self.devices = {d.index: d for d in devices}
        self.batch_seq = 0
        self.pending: list[tuple[int, int, Reading]] = []
        self.pending_points: list[tuple[int, Reading]] = []

    def add(self, samples: list[tuple[int, int, Reading]], points: list[tuple[int, Reading]] | None = None) -> None:
        self.pending.extend(samples)
        self.pending_points.extend(points or ())

    def __len__(self) -> int:
        return len(self.pending) + len(self.pending_points)

    def build(self) -> TelemetryBatch | None:
        if not self.pending and not self.pending_points:
            return None
        pending, self.pending = self.pending, []
        points, self.pending_points = self.pending_points, []
        self.batch_seq += 1
        base_ms = int(min([r.ts for _, _, r in pending] + [r.ts for _, r in points]) * 1000)
        order = sorted({i for i, _, _ in pending} | {i for i, _ in points})
        slot = {idx: n for n, idx in enumerate(order)}
        gpus = [GpuInfo(self.devices[i].uuid, i, self.devices[i].model, self.devices[i].fb_total_mib) for i in order]
        samples = [
            GpuSample(
                gpu=slot[i], seq=seq, dt_ms=int(r.ts * 1000) - base_ms,
                util_gpu=_q(r.util_gpu) or 0, util_mem=_q(r.util_mem) or 0, fb_used_mib=_q(r.fb_used_mib) or 0,
                power_dw=_q(r.power_w, 10) or 0, temp_c=_q(r.temp_c) or 0, sm_clock_mhz=r.sm_clock_mhz,
                mem_temp_c=_q(r.mem_temp_c), ecc_sbe=r.ecc_sbe_volatile, ecc_dbe=r.ecc_dbe_volatile,
                throttle_reasons=r.throttle_reasons, pcie_replays=r.pcie_replays, energy_mj=r.energy_mj,
                sm_active_pm=_q(r.prof_sm_active, 1000), tensor_active_pm=_q(r.prof_tensor_active, 1000),
                dram_active_pm=_q(r.prof_dram_active, 1000),
            )
            for i, seq, r in pending
        ]
        light = [WatchPoint(slot[i], int(r.ts * 1000) - base_ms, _q(r.util_gpu) or 0, _q(r.power_w, 10) or 0)
                 for i, r in points]
        return TelemetryBatch(self.node, self.batch_seq, base_ms, gpus, samples, light)
