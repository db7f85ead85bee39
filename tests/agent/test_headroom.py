"""Severity from headroom: thermal excess graded by where it settles, conditions opened once and closed,
recovering GPUs kept out of the peer median, memory leaks flagged before the framebuffer runs out."""

from __future__ import annotations

import math

from gpuaware.agent.anomaly import MemoryLeak, ThermalRunaway
from gpuaware.agent.headroom import time_to_temp
from gpuaware.agent.peers import NodePeers
from gpuaware.contract.events import HealthVerdict
from tests.support import reading

LINE = 30 + 30 * 300 / 700  # where an H100 at 300 W of 700 W sits on the prior line


def _thermal(extra, n: int = 4, seconds: int = 1500) -> list[tuple[int, int, str, HealthVerdict | None]]:
    """(second, gpu, state, grade) of every thermal_peer finding that is news; ``extra(g, s)``: °C above the line."""
    peers = NodePeers(["H100"] * n, [700.0] * n)
    out, last = [], {}
    for s in range(seconds):
        rs = {g: reading(float(s), power=300.0, temp=round(LINE + extra(g, s), 1)) for g in range(n)}
        for g, f in peers.learn(rs):
            if f.detector == "thermal_peer" and (f.state != "held" or last.get(g) != f.verdict):
                out.append((s, g, f.state, f.verdict))
                last[g] = f.verdict
    return out


def test_a_few_degrees_off_its_line_far_from_every_limit_is_a_trend_not_an_alarm():
    # 4 °C up, approached as a heat sink does (time constant 40 s); its line absorbs it over half an hour.
    found = _thermal(lambda g, s: 4.0 * (1 - math.exp(-(s - 600) / 40)) if g == 1 and s >= 600 else 0.0)
    assert [(g, state, v) for _, g, state, v in found if state != "closed"] == [(1, "open", HealthVerdict.INFO)]


def test_a_fan_settling_well_above_its_peers_is_warning_and_a_drift_to_slowdown_is_critical_before_it():
    fan = _thermal(lambda g, s: min(10.0, (s - 600) * 0.25) if g == 1 and s >= 600 else 0.0)
    assert {v for _, g, _, v in fan if g == 1} == {HealthVerdict.WARNING}  # settles 10 °C up, 40 °C from slowdown
    drift = _thermal(lambda g, s: (s - 600) * 0.05 if g == 2 and s >= 600 else 0.0)
    critical = [s for s, g, _, v in drift if g == 2 and v is HealthVerdict.CRITICAL]
    reaches = 600 + (87 - LINE) / 0.05  # the drift's temperature crosses slowdown here
    assert critical and critical[0] <= reaches - 120


def test_one_condition_one_open_event_then_closed_with_hysteresis():
    # Hovering either side of the threshold (2.5 °C) for a minute, then back on the line: one
    # condition, opened once; it closes only below half the threshold.
    found = _thermal(lambda g, s: (3.5 if (s // 6) % 2 else 1.9) if g == 0 and 600 <= s < 660 else 0.0)
    states = [state for _, g, state, _ in found if g == 0]
    assert states[0] == "open" and states.count("open") == 1 and states[-1] == "closed"


def test_a_recovering_gpu_is_nobodys_peer_and_too_few_peers_is_no_comparison():
    # GPU 0 ran 10 °C hot for five minutes; its line learnt part of it, so it reads cold as it recovers.
    # With two peers the median is their mean: it would make GPU 1 and GPU 2 look hot.
    def extra(g, s):
        if g == 0 and 600 <= s < 900:
            return 10.0
        return -4.0 if g == 0 and 900 <= s < 1300 else 0.0

    found = _thermal(extra, n=3)
    assert {g for _, g, _, _ in found} == {0}
    # Two of a model: one peer cannot tell the GPU from the room or its workload; 6 °C up, far from
    # slowdown, is no finding at all.
    assert _thermal(lambda g, s: 6.0 * (1 - math.exp(-(s - 600) / 40)) if g == 1 and s >= 600 else 0.0, n=2) == []


def test_the_runaway_rule_grades_by_where_the_heat_sink_settles():
    def run(start: float) -> HealthVerdict | None:
        tr = ThermalRunaway()
        for s in range(10):
            r = reading(float(s), temp=start + 1.0 * s, power=300.0)
            f = tr.score_one(r, 700.0, 87.0)
            tr.learn_one(r)
            if f is not None:
                return f.verdict
        return None

    assert run(30.0) is HealthVerdict.WARNING  # 1 °C/s settles ~40 °C up: below 87 °C from 30 °C
    assert run(50.0) is HealthVerdict.CRITICAL
    assert time_to_temp(80.0, 0.1, 87.0) is None and time_to_temp(60.0, 1.0, 87.0) > 0


def test_a_steady_leak_is_critical_before_exhaustion_and_a_ramp_that_stops_is_nothing():
    total = 80000.0
    leak = MemoryLeak(total)
    flagged = None
    for s in range(5000):
        used = 20000.0 + (15.0 * (s - 900) if s >= 900 else 0.0)
        f = leak.learn_one(_mem(s, used))
        if f is not None and f.verdict is HealthVerdict.CRITICAL and flagged is None:
            flagged = s
    exhausted = 900 + (0.95 * total - 20000.0) / 15.0
    assert flagged is not None and flagged <= exhausted - 120
    ramp = MemoryLeak(total)
    # A job growing to its footprint for five minutes, after the warm-up, then flat.
    assert not any(ramp.learn_one(_mem(s, 20000.0 + 150.0 * min(max(s - 700, 0), 300))) for s in range(3000))


def _mem(s: int, used: float):
    r = reading(float(s))
    r.fb_used_mib = used
    return r


def test_memory_wear_reads_time_to_the_remap_limit_from_the_counts_trend():
    from gpuaware.agent.anomaly import MemoryWear
    from gpuaware.agent.readings import Reading
    from gpuaware.contract.events import HealthAction, HealthVerdict

    def run(step_s, per_step, start, field="remapped_rows_correctable", n=40):
        wear, out = MemoryWear(), None
        for i in range(n):
            r = Reading(ts=1000.0 + i * step_s)
            setattr(r, field, int(start + per_step * i))
            out = wear.learn_one(r)
        return out

    # 10 rows a minute, at 465 of 512 after 400 s of it: ~5 min left -> CRITICAL + DRAIN, saying when.
    f = run(10.0, 10 / 6, 400)
    assert (f.verdict, f.action) == (HealthVerdict.CRITICAL, HealthAction.DRAIN)
    assert "of 512 rows remapped" in f.message and "limit reached in ~" in f.message
    # The same rate with ~200 rows left: a trend (INFO + WATCH), not an alarm.
    f = run(10.0, 10 / 6, 250)
    assert (f.verdict, f.action) == (HealthVerdict.INFO, HealthAction.WATCH)
    # Pages retired before Ampere: 64 at most, so 3 a minute at 59 is CRITICAL.
    f = run(10.0, 0.5, 40, field="retired_pages_sbe")
    assert f.verdict is HealthVerdict.CRITICAL and "of 64 pages retired" in f.message
    # A row or two in a board's life is no stream; a flat count is nothing.
    assert run(10.0, 0.0, 2) is None
    assert run(10.0, 0.05, 2) is None


def test_a_fan_that_just_stopped_is_flagged_by_its_rate_since_it_began_not_averaged_with_the_seconds_before():
    # A fan stopping adds 0.2 °C/s that settles 8 °C up (a heat sink, 40 s): half-way over the threshold
    # ~7 s in, rising to settle over twice it. The 20 s rate then still counts 13 flat seconds before the
    # onset and reads a third of the rate (flagged 12 s in); the rate since it began flags it by 10 s
    # (3 reads in a row from 7 s).
    found = _thermal(lambda g, s: 8.0 * (1 - math.exp(-(s - 600) / 40)) if g == 3 and s >= 600 else 0.0, seconds=700)
    opened = [s for s, g, state, _ in found if g == 3 and state == "open"]
    assert opened and opened[0] - 600 <= 10
    assert all(g == 3 for _, g, _, _ in found)


def test_a_healthy_gpu_whose_peer_turns_faulty_in_a_warming_room_reads_no_heating_from_the_change_of_peers():
    # Three H100s at 600 W in a room warming 12 °C over ten minutes (their lines have not learnt it yet);
    # GPU 0's fan fails near the end. GPU 1 and 2 are then left with one quiet peer each: their excess is
    # taken against their own lines, a step of the room's unlearnt degrees, which read as a rate made them
    # heading for slowdown (CRITICAL, drained) although they are no warmer than a second before.
    line = 30 + 30 * 600 / 700
    peers = NodePeers(["H100"] * 3, [700.0] * 3)
    flagged = set()
    for s in range(2100):
        room = min(12.0, max(0.0, (s - 1200) * 0.02))
        fan = 9.5 * (1 - math.exp(-(s - 1700) / 40)) if s >= 1700 else 0.0
        rs = {g: reading(float(s), power=600.0, temp=round(line + room + (fan if g == 0 else 0.0), 1))
              for g in range(3)}
        flagged |= {(g, f.verdict) for g, f in peers.learn(rs) if f.detector == "thermal_peer" and f.state != "closed"}
    assert flagged and {g for g, _ in flagged} == {0}


def _heat_sink(target, seconds: int) -> list[float]:
    """A GPU's excess each second, as a heat sink (time constant 40 s) follows ``target(s)``, where it settles."""
    e, out = 0.0, []
    for s in range(seconds):
        e += (target(s) - e) / 40
        out.append(e)
    return out


def _graded(excess: list[float], power: float = 650.0) -> list[tuple[int, str, HealthVerdict | None]]:
    """(second, state, grade) of GPU 1's thermal_peer news among four H100s at ``power`` (slowdown 87 °C)."""
    line = 30 + 30 * power / 700
    peers = NodePeers(["H100"] * 4, [700.0] * 4)
    out = []
    for s, x in enumerate(excess):
        rs = {g: reading(float(s), power=power, temp=round(line + (x if g == 1 else 0.0), 1)) for g in range(4)}
        out += [(s, f.state, f.verdict) for g, f in peers.learn(rs)
                if g == 1 and f.detector == "thermal_peer" and f.state != "held"]
    return out


def test_a_fan_failing_to_settle_at_slowdown_is_critical_once_and_not_lowered_before_it_crosses():
    # At 650 W (~58 °C) a fan failing at once adds 30 °C: the GPU settles at ~88 °C, a degree over its 87 °C slowdown,
    # crossing it ~136 s in. Its settle point, estimated within a degree of slowdown, stops rising well before: a
    # forecast lowered there (WARNING) is raised again as the GPU crosses, two pages for one condition.
    for ramp in (0, 10, 30):
        fan = _graded(_heat_sink(lambda s, r=ramp: 30.0 * min(1.0, max(0.0, (s - 600) / r)) if r else
                                 (30.0 if s >= 600 else 0.0), 800))
        assert [v for _, state, v in fan if state == "updated"] == [HealthVerdict.CRITICAL]
        assert all(state != "lowered" for _, state, _ in fan)


def test_a_fan_spinning_down_over_a_minute_is_critical_while_it_looks_like_a_drift_and_lowered_once_it_settles():
    # At 650 W (~58 °C) a fan spinning down over a minute adds 26 °C: for that minute its settle point rises
    # 0.43 °C/s toward slowdown, as a drift's does (CRITICAL: nothing tells them apart yet), then stops 3 °C
    # below it. The forecast is withdrawn (one condition, lowered to WARNING) once the settle point has stopped
    # rising; the same rise going on (a drift) keeps its CRITICAL until and after it crosses slowdown.
    fan = _graded(_heat_sink(lambda s: 26.0 * min(1.0, max(0.0, (s - 600) / 60)), 1200))
    assert [state for _, state, _ in fan].count("open") == 1 and HealthVerdict.CRITICAL in {v for _, _, v in fan}
    lowered = [s for s, state, v in fan if state == "lowered"]
    assert len(lowered) == 1 and fan[-1][1:] == ("lowered", HealthVerdict.WARNING)
    drift = _graded(_heat_sink(lambda s: 0.43 * max(0.0, s - 600), 720))
    assert HealthVerdict.CRITICAL in {v for _, _, v in drift} and all(state != "lowered" for _, state, _ in drift)
