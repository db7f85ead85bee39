"""Fleet-level peer comparison: a GPU whose temperature at its power, SM clock under load, power at its
utilisation, or single-bit ECC errors over the last 10 minutes deviate from the same model's fleet
(docs/health.md, "Peer comparison").

The agent compares a GPU with the GPUs of its own node (gpuaware/agent/peers.py); a node whose GPUs all run hot
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
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpuaware.stream.gpu_state import NO_STRIKES, SBE_WINDOW_MS
from gpuaware.stream.readings import CAPPED, CLOCK, FRESH, MODEL, POWER, SBE, TEMP, UTIL, gather

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
    sbe_min: int = 5  # single-bit ECC errors in the tracker's window (gpuaware.stream.gpu_state.SBE_WINDOW_MS)
    sbe_floor: float = 1.0


def _robust(values: np.ndarray, floor: float) -> tuple[float, float]:
    """(median, spread): the MAD scaled to a standard deviation, at least ``floor``."""
    med = float(np.median(values))
    return med, max(floor, MAD_TO_SIGMA * float(np.median(np.abs(values - med))))


def _bins(keys: Sequence[int] | np.ndarray, members: np.ndarray) -> list[np.ndarray]:
    """``members`` (row indexes) grouped by their ``keys``, each group in row order."""
    if not len(members):
        return []
    k = np.asarray(keys, dtype=np.int64)
    order = np.argsort(k, kind="stable")
    return np.split(members[order], np.flatnonzero(np.diff(k[order])) + 1)


# uuid, power W, temp °C, util %, SM MHz, power-capped, single-bit ECC errors in the window (None: not reported)
Row = (tuple[str, float, float, float, float | None, bool]
       | tuple[str, float, float, float, float | None, bool, int | None])


def outliers(gpus: Sequence[Row], s: FleetPeerSettings) -> dict[str, list[tuple[str, str]]]:
    """For one model's GPUs: uuid -> [(kind, reason)] for the checks it fails now (before the strikes rule)."""
    rows = [(*g[:6], g[6] if len(g) > 6 else None) for g in gpus]
    return {rows[i][0]: reasons for i, reasons in judge(rows, s).items()}


def judge(rows: list[tuple], s: FleetPeerSettings) -> dict[int, list[tuple[str, str]]]:
    """``outliers`` by row index, over rows with every field (``Row`` with the SBE count, None where not reported)."""
    if not rows:
        return defaultdict(list)
    _, power, temp, util, clock, capped, sbe = zip(*rows, strict=True)
    return judge_columns(np.asarray(power, dtype=float), np.asarray(temp, dtype=float),
                         np.asarray(util, dtype=float),
                         np.asarray([math.nan if v is None else v for v in clock], dtype=float),
                         np.asarray(capped, dtype=bool),
                         np.asarray([math.nan if v is None else v for v in sbe], dtype=float), s)


def power_bins(power: np.ndarray, step: float) -> np.ndarray:
    """Each power's bin, ``int(math.log(max(p, 1.0)) / step)``, over the column: numpy's log may differ from
    ``math.log`` in the last bit, which moves a value only at a bin's edge, so the values within a hair of one are
    binned by ``math.log`` itself (a loop over every GPU in Python was a third of the check)."""
    with np.errstate(invalid="ignore"):
        ratio = np.log(np.maximum(power, 1.0)) / step
        bins = np.floor(ratio)
        edge = ~(np.abs(ratio - np.rint(ratio)) > 1e-9)  # (NaN included: the scalar rule raises for it, as before)
    out = bins.astype(np.int64)
    for i in np.flatnonzero(edge).tolist():
        out[i] = int(math.log(max(float(power[i]), 1.0)) / step)
    return out


def judge_columns(power: np.ndarray, temp: np.ndarray, util: np.ndarray, clock: np.ndarray, capped: np.ndarray,
                  sbe: np.ndarray, s: FleetPeerSettings) -> dict[int, list[tuple[str, str]]]:
    """``judge`` over one model's columns: power W, temperature °C, utilisation %, SM clock MHz (NaN: not reported),
    power-capped, single-bit ECC errors in the window (NaN: not reported). A power-capped
    GPU is judged on its temperature only: its clocks and power are the cap's, not a fault.

    Like operating points are bins (power in steps of ``power_window``, utilisation in steps of
    ``util_window``), so a check costs one sort per bin, not a comparison of every pair: the median and
    MAD barely move for the one outlier they include. The bins, medians and tests run over numpy columns: at
    50,000 GPUs the check in Python, every 5 s, was an eighth of a worker's main thread (docs/performance.md, the
    stream's "Where the time went", item 9)."""
    out: dict[int, list[tuple[str, str]]] = defaultdict(list)
    n = len(power)
    if not n:
        return out
    for group in _bins(power_bins(power, math.log1p(s.power_window)), np.arange(n)):
        if len(group) - 1 < s.min_peers:
            continue
        values = temp[group]
        med, spread = _robust(values, s.temp_floor_c)
        excess = values - med
        for i in np.flatnonzero((excess >= s.temp_excess_c) & (excess / spread >= s.z)):
            e = float(excess[i])
            out[int(group[i])].append(("temperature", f"fleet peers: {e:+.1f} °C against {len(group) - 1} "
                                                          f"GPUs of its model at the same power (robust z "
                                                          f"{e / spread:.1f})"))
    with np.errstate(invalid="ignore"):  # NaN clocks (not reported) are never busy
        busy = np.flatnonzero(~np.isnan(clock) & (util >= s.busy_util) & ~capped)
    if len(busy) - 1 >= s.min_peers:
        values = clock[busy]
        med, spread = _robust(values, s.clock_floor_mhz)
        if med > 0:
            deficit = med - values
            for i in np.flatnonzero((deficit / med >= s.clock_deficit) & (deficit / spread >= s.z)):
                d = float(deficit[i])
                out[int(busy[i])].append(("clock", f"fleet peers: SM clock {float(values[i]):.0f} MHz, "
                                                       f"{d / med:.0%} below {len(busy) - 1} busy GPUs of its model "
                                                       f"(robust z {d / spread:.1f})"))
    free = np.flatnonzero(~capped)
    for group in _bins(np.floor_divide(util[free], s.util_window), free):  # the same ufunc as one scalar's //
        if len(group) - 1 < s.min_peers:
            continue
        values = power[group]
        med, spread = _robust(values, s.power_floor_w)
        if med <= 0:
            continue
        off = values - med
        for i in np.flatnonzero((np.abs(off) / med >= s.power_deviation) & (np.abs(off) / spread >= s.z)):
            o = float(off[i])
            out[int(group[i])].append(("power", f"fleet peers: power {float(values[i]):.0f} W, {o / med:+.0%} "
                                                    f"against {len(group) - 1} GPUs of its model at the same "
                                                    f"utilisation (robust z {abs(o) / spread:.1f})"))
    counted = np.flatnonzero(~np.isnan(sbe))
    if len(counted) - 1 >= s.min_peers:
        counts = sbe[counted]
        med, spread = _robust(counts, s.sbe_floor)
        excess = counts - med
        for i in np.flatnonzero((counts >= s.sbe_min) & (excess / spread >= s.z)):
            out[int(counted[i])].append(("ecc", f"fleet peers: {int(counts[i])} single-bit ECC errors in "
                                                    f"{SBE_WINDOW_MS // 60_000} min against a median of {med:.0f} on "
                                                    f"{len(counted) - 1} GPUs of its model (robust z "
                                                    f"{float(excess[i]) / spread:.1f})"))
    return out


def check(trackers: Iterable, now_ms: int, s: FleetPeerSettings) -> None:
    """Judge every fresh tracker (gpuaware.stream.gpu_state.GpuTracker) against its model's fleet; sets each one's
    ``fleet_strikes`` and ``fleet_reasons`` (the reasons of outliers that lasted ``strikes`` checks)."""
    trackers = trackers if isinstance(trackers, list) else list(trackers)
    if not trackers:
        return
    # Their rows in one call (gpuaware.stream.readings); a walk over the trackers building a row of each was most of
    # a check at 50,000 GPUs. The trackers of one processor share its store.
    rows = gather(trackers)
    # Fresh: GpuTracker.fresh_ms (the newest sample's time, never later than its arrival) at least ``oldest``; a
    # tracker without samples has none (NaN), nor one without a model.
    with np.errstate(invalid="ignore"):
        fresh = (rows[:, FRESH] >= now_ms - s.fresh_ms) & ~np.isnan(rows[:, MODEL]) & ~np.isnan(rows[:, POWER])
    struck = []
    for t, ok in zip(trackers, fresh.tolist(), strict=True):  # (most GPUs have no strikes: the test is all they cost)
        if t.fleet_strikes:
            if ok:
                struck.append(t)
            else:
                if t.fleet_reasons:  # a reason dropped: the next state says so
                    t.mark_changed()
                t.fleet_strikes, t.fleet_reasons = NO_STRIKES, ()
    index = np.flatnonzero(fresh)
    rows = rows[index]
    # A reading none has sent yet reads as 0, as it did from the tracker's readings
    temp, util = np.nan_to_num(rows[:, TEMP]), np.nan_to_num(rows[:, UTIL])
    power, clock, capped, sbe = rows[:, POWER], rows[:, CLOCK], rows[:, CAPPED] > 0, rows[:, SBE]
    found: dict[int, tuple] = {id(t): (t, ()) for t in struck}  # tracker -> (it, its reasons now)
    for group in _bins(rows[:, MODEL].astype(np.int64), np.arange(len(index))):
        for i, reasons in judge_columns(power[group], temp[group], util[group], clock[group], capped[group],
                                        sbe[group], s).items():
            t = trackers[int(index[group[i]])]
            found[id(t)] = (t, reasons)
    # Only outliers now or before have anything to count (most GPUs neither: no dict or list made for them).
    for t, reasons in found.values():
        now = dict(reasons)
        had = t.fleet_reasons
        t.fleet_strikes = {k: t.fleet_strikes.get(k, 0) + 1 for k in now}
        t.fleet_reasons = [now[k] for k in sorted(now) if t.fleet_strikes[k] >= s.strikes]
        if had or t.fleet_reasons:  # the signature reads the strikes while there are reasons
            t.mark_changed()
