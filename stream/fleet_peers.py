"""Fleet-level peer comparison: a GPU whose temperature at its power, SM clock under load, power at its
utilisation, or single-bit ECC errors over the last 10 minutes deviate from the same model's fleet
(docs/health.md, "Peer comparison").

The agent compares a GPU with the GPUs of its own node (agent/peers.py); a node whose GPUs all run hot
together, or a node with one GPU of a model, has no peers there. The stream sees many nodes. For each GPU
with enough same-model peers in a like operating point, the deviation from the peers' median is judged
against their spread (median absolute deviation, scaled to a standard deviation, with a floor so a fleet
of identical simulated boards does not make every tenth of a degree an outlier). An outlier must be both
far in absolute terms and far in robust z, in ``strikes`` checks in a row, before its reason is shown:
DCGM 4.5's "deviation from the system mean" check, done over the fleet with robust statistics.

The fleet is what one worker holds (its partitions of ``gpu.telemetry``, keyed by node): with several
workers each judges against its share, still hundreds of GPUs of a model in a large fleet. The share is a
uniform sample of whole nodes (the partitioner hashes the node's name, blind to its health), so its median
and spread estimate the fleet's; only the peer count shrinks, and below ``min_peers`` a model is not judged
on that worker (docs/health.md, "In the fleet"). Pure: the caller passes the trackers.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stream.gpu_state import SBE_WINDOW_MS

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class FleetPeerSettings:
    min_peers: int = 8  # same-model GPUs at a like operating point, this one not counted
    strikes: int = 3  # consecutive checks an outlier must last
    fresh_ms: int = 120_000  # peers whose data is older are left out
    power_window: float = 0.15  # peers for temperature: the same power bin (steps of this share)
    temp_excess_c: float = 8.0
    temp_floor_c: float = 1.0  # spread floor
    busy_util: float = 50.0  # clock comparison among GPUs at least this busy
    clock_deficit: float = 0.15  # SM clock this share below the peers' median
    clock_floor_mhz: float = 15.0
    util_window: float = 10.0  # peers for power: the same utilisation bin (steps of this many points)
    power_deviation: float = 0.25  # power this share off the peers' median, either way
    power_floor_w: float = 5.0
    z: float = 4.0
    sbe_min: int = 5  # single-bit ECC errors in the tracker's window (stream.gpu_state.SBE_WINDOW_MS)
    sbe_floor: float = 1.0


def _robust(values: Sequence[float], floor: float) -> tuple[float, float]:
    """(median, spread): the MAD scaled to a standard deviation, at least ``floor``."""
    med = statistics.median(values)
    return med, max(floor, MAD_TO_SIGMA * statistics.median(abs(v - med) for v in values))


# uuid, power W, temp °C, util %, SM MHz, power-capped, single-bit ECC errors in the window (None: not reported)
Row = (tuple[str, float, float, float, float | None, bool]
       | tuple[str, float, float, float, float | None, bool, int | None])
SW_POWER_CAP = 0x4  # NVML clocks event reason: an operator's or the scheduler's power cap holds the clocks


def outliers(gpus: Sequence[Row], s: FleetPeerSettings) -> dict[str, list[tuple[str, str]]]:
    """For one model's GPUs: uuid -> [(kind, reason)] for the checks it fails now (before the strikes rule).
    A power-capped GPU is judged on its temperature only: its clocks and power are the cap's, not a fault.

    Like operating points are bins (power in steps of ``power_window``, utilisation in steps of
    ``util_window``), so a check costs one sort per bin, not a comparison of every pair: the median and
    MAD barely move for the one outlier they include."""
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    by_power: dict[int, list] = defaultdict(list)
    by_util: dict[int, list] = defaultdict(list)
    for g in gpus:
        by_power[int(math.log(max(g[1], 1.0)) / math.log1p(s.power_window))].append(g)
        if not g[5]:
            by_util[int(g[3] // s.util_window)].append(g)
    busy = [g for g in gpus if g[4] is not None and g[3] >= s.busy_util and not g[5]]
    for group in by_power.values():
        if len(group) - 1 < s.min_peers:
            continue
        med, spread = _robust([g[2] for g in group], s.temp_floor_c)
        for uuid, _, temp, *_ in group:
            excess = temp - med
            if excess >= s.temp_excess_c and excess / spread >= s.z:
                out[uuid].append(("temperature", f"fleet peers: {excess:+.1f} °C against {len(group) - 1} GPUs of "
                                                 f"its model at the same power (robust z {excess / spread:.1f})"))
    if len(busy) - 1 >= s.min_peers:
        med, spread = _robust([float(g[4]) for g in busy if g[4] is not None], s.clock_floor_mhz)
        for uuid, _, _, _, clock, *_ in busy:
            deficit = med - float(clock or 0.0)
            if med > 0 and deficit / med >= s.clock_deficit and deficit / spread >= s.z:
                out[uuid].append(("clock", f"fleet peers: SM clock {clock:.0f} MHz, {deficit / med:.0%} below "
                                           f"{len(busy) - 1} busy GPUs of its model (robust z {deficit / spread:.1f})"))
    for group in by_util.values():
        if len(group) - 1 < s.min_peers:
            continue
        med, spread = _robust([g[1] for g in group], s.power_floor_w)
        for uuid, power, *_ in group:
            off = power - med
            if med > 0 and abs(off) / med >= s.power_deviation and abs(off) / spread >= s.z:
                out[uuid].append(("power", f"fleet peers: power {power:.0f} W, {off / med:+.0%} against "
                                           f"{len(group) - 1} GPUs of its model at the same utilisation "
                                           f"(robust z {abs(off) / spread:.1f})"))
    counted = [(g[0], g[6]) for g in gpus if len(g) > 6 and g[6] is not None]
    if len(counted) - 1 >= s.min_peers:
        med, spread = _robust([float(c) for _, c in counted], s.sbe_floor)
        for uuid, count in counted:
            excess = count - med
            if count >= s.sbe_min and excess / spread >= s.z:
                out[uuid].append(("ecc", f"fleet peers: {count} single-bit ECC errors in "
                                         f"{SBE_WINDOW_MS // 60_000} min against a median of {med:.0f} on "
                                         f"{len(counted) - 1} GPUs of its model (robust z {excess / spread:.1f})"))
    return out


def check(trackers: Iterable, now_ms: int, s: FleetPeerSettings) -> None:
    """Judge every fresh tracker (stream.gpu_state.GpuTracker) against its model's fleet; sets each one's
    ``fleet_strikes`` and ``fleet_reasons`` (the reasons of outliers that lasted ``strikes`` checks)."""
    by_model: dict[str, list] = defaultdict(list)
    oldest = now_ms - s.fresh_ms
    for t in trackers:
        if t.model and t.samples and t.fresh_ms >= oldest and "power_w" in t.smoothed:
            by_model[t.model].append(t)
        elif t.fleet_strikes:
            t.changed |= bool(t.fleet_reasons)  # a reason dropped: the next state says so
            t.fleet_strikes, t.fleet_reasons = {}, []
    for group in by_model.values():
        rows = []
        for t in group:
            sm = t.smoothed
            window = t.sbe_window
            rows.append((t.uuid, sm["power_w"], sm.get("temp_c", 0.0), sm.get("util_gpu", 0.0), sm.get("sm_clock_mhz"),
                         bool(t.throttle_reasons & SW_POWER_CAP), window[-1][1] - window[0][1] if window else None))
        now = outliers(rows, s)
        for t in group:
            found = now.get(t.uuid)
            if found is None and not t.fleet_strikes:
                continue  # no outlier now or before: nothing to count (most GPUs; no dict or list made per GPU)
            found = dict(found or ())
            had = t.fleet_reasons
            t.fleet_strikes = {k: t.fleet_strikes.get(k, 0) + 1 for k in found}
            t.fleet_reasons = [found[k] for k in sorted(found) if t.fleet_strikes[k] >= s.strikes]
            t.changed |= bool(had or t.fleet_reasons)  # the signature reads the strikes while there are reasons
