"""What the stream knows about one GPU, and when it says so.

``GpuTracker`` is pure (no Kafka, no Faust): it learns samples and edge events, keeps smoothed
metrics, one-minute history, health, recent events, the workload fingerprint and per-horizon
forecasters, renders a ``GpuState`` record, and decides when that record is worth publishing
(on change, at most every ``min_interval_ms``, at least every ``max_interval_ms``).

Its snapshot (``to_dict``) is what the Faust table's changelog stores; the processor stores the minute
history apart from the rest, which changes with every sample (gpuaware.stream.processor). Forecasters are not
serialised: they are rebuilt by replaying the retained minute history, which reproduces their
windows and most of their loss and residual statistics (measured in tests/stream/test_gpu_state.py). In memory the
forecasters are two rows of the worker's ``ForecastColumns`` (gpuaware.stream.forecast_columns), and the history is
its minutes here and its values in those rows (docs/stream.md, "Memory").
Duplicate samples (an agent replaying its spool after an outage, or the stream re-reading after a
crash) are recognised by the per-GPU ``seq`` and timestamp and applied once.

Clocks. A sample's timestamp is the agent's clock; freshness is also judged on arrival, the
worker's clock. A sample stamped more than ``max_clock_skew_ms`` ahead of its arrival is
rejected (counted by the processor): applied, it would make every genuine sample after it look
like a duplicate and the GPU never look stale. A stored stamp that far ahead (learned before
this check, or by a worker whose clock was off) is forgotten on the next sample. The state's
``sample_ts_ms`` is never later than the arrival of the sample it describes, so a fast agent
clock within the tolerance cannot make data look fresher than it is.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import struct
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpuaware.contract.events import (
    EventKind,
    Forecast,
    GpuEvent,
    GpuInfo,
    GpuSample,
    GpuState,
    HealthAction,
    HealthBand,
    HealthVerdict,
    WatchPoint,
)
from gpuaware.stream.fingerprint import WorkloadFingerprint
from gpuaware.stream.forecast_columns import ColumnForecaster, ForecastColumns
from gpuaware.stream.forecast_many import METRICS, ClosedMinutes, check_packed, label_columns, unpack
from gpuaware.stream.readings import (
    CAPPED,
    CLOCK,
    FB,
    FRESH,
    MODEL,
    NAMES,
    POWER,
    READINGS,
    SBE,
    SW_POWER_CAP,
    UTIL,
    WIDTH,
    Readings,
)
from gpuaware.stream.state_codec import KeptForecasts

log = logging.getLogger(__name__)

MINUTE_MS = 60_000
SBE_WINDOW_MS = 600_000  # the fleet peer check's single-bit ECC window (gpuaware.stream.fleet_peers)
SMOOTHING = 0.3
HISTORY_MINUTES = 60
RECENT_EVENTS = 8


class _Shared(dict):
    """An empty dict every tracker shares until it has something of its own to keep, which it assigns: changing it in
    place is refused."""

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a shared empty dict: assign a new one")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _refuse  # type: ignore[assignment]


NO_STRIKES: Mapping[str, int] = _Shared()  # what a GPU with no fleet outlier strikes holds
UNKNOWN_VERDICT = HealthVerdict.UNKNOWN.value  # read once per state otherwise (an enum value is a descriptor call)
BAND_VERDICT = {HealthBand.HEALTHY.value: (HealthVerdict.PASS, HealthAction.NONE),
                HealthBand.DEGRADED.value: (HealthVerdict.WARNING, HealthAction.WATCH),
                HealthBand.CRITICAL.value: (HealthVerdict.CRITICAL, HealthAction.DRAIN)}


@dataclass(frozen=True)
class TrackerSettings:
    horizons_min: tuple[int, ...] = (1, 5, 15)
    min_interval_ms: int = 1000
    max_interval_ms: int = 30_000
    util_change: float = 5.0  # percentage points that count as a change worth publishing
    # A state for every new full sample (at most every min_interval_ms): the agent's adaptive sampling already
    # sends a stable GPU's samples only every 30 s, so without it a sample that moves nothing past the steps
    # would reach the scheduler only with the refresh, up to max_interval_ms late (docs/stream.md).
    every_sample: bool = True
    fb_change_share: float = 0.05
    max_clock_skew_ms: int = 30_000  # a sample stamped further ahead of its arrival is rejected
    rehome_after_ms: int = 600_000  # a GPU may appear on another node once its node is silent this long
    # Errors each forecast horizon keeps (the exported MAE's): an hour, what a restarted worker rebuilds from the
    # minute history, at a third of the 200 that were a third of a GPU's forecaster memory (docs/stream.md, "Memory").
    forecast_errors: int = HISTORY_MINUTES


_COLUMNS: dict[tuple[tuple[int, ...], int], ForecastColumns] = {}


def forecast_columns(settings: TrackerSettings) -> ForecastColumns:
    """The rows of every tracker's forecasters with ``settings``' horizons, in this process: one array for all the
    GPUs a worker holds, not objects per GPU (gpuaware.stream.forecast_columns)."""
    key = (settings.horizons_min, settings.forecast_errors)
    columns = _COLUMNS.get(key)
    if columns is None:
        columns = _COLUMNS[key] = ForecastColumns(settings.horizons_min, residuals=settings.forecast_errors)
        assert columns.span >= HISTORY_MINUTES, "the forecasters' values are the minute history"
    return columns


class Learned(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    AHEAD = "ahead"  # stamped beyond the clock skew allowed: rejected


# Slots: a tracker per GPU, and its attribute dict was ~1.5 KiB of each (docs/stream.md, "Memory").
@dataclass(slots=True)
class GpuTracker:
    uuid: str
    node: str = ""
    model: str = ""
    index: int = 0
    fb_total_mib: int = 0
    samples: int = 0
    duplicates: int = 0
    last_seq: int = -1
    sample_ts_ms: int = 0
    arrived_ms: int = 0  # the worker's clock when the newest applied sample arrived
    # The smoothed readings and what the fleet check reads live in a row of ``readings`` (gpuaware.stream.readings):
    # the check reads every GPU's in one numpy call; ``smoothed`` is a read-only view.
    readings: Readings = field(default=READINGS, compare=False, repr=False)
    slot: int = field(init=False, compare=False, repr=False)
    minute: int | None = None
    bucket: list[float] = field(default_factory=lambda: [0.0, 0.0, 0])  # util sum, fb sum, count
    # The minutes of the minute history (``history``), oldest first: its values are the forecasters' last ones. 32-bit:
    # minutes since 1970 fit until the year 6053, and a batch stamped before 1970 is refused (processor.check_batch).
    minutes: array = field(default_factory=lambda: array("i"))
    health_score: float = 100.0
    health_band: str = HealthBand.HEALTHY.value
    health_components: dict[str, float] = field(default_factory=dict)
    verdict: str = HealthVerdict.UNKNOWN.value
    # Empty containers are shared, () or NO_STRIKES, until a GPU has something to keep (most never do): an empty list
    # or dict of each per GPU was ~370 bytes of every GPU (docs/stream.md, "Memory").
    verdict_reasons: list[str] | tuple[str, ...] = ()
    recommended_action: str = HealthAction.UNKNOWN.value
    # The last RECENT_EVENTS events. Lists, not deques, here and in ``sbe_window``: an empty deque takes 760 bytes, a
    # list 56, and most GPUs have no event and no SBE count to keep.
    recent_events: list | tuple = ()
    fingerprint: WorkloadFingerprint = field(default_factory=WorkloadFingerprint)
    _packed: bytes = b""  # ``packed_forecasts``
    last_published_ms: int = 0
    # The time of its entry in its processor's heap of states published (None: none).
    queued_ms: int | None = field(default=None, compare=False)
    last_point_ms: int = 0
    published_signature: tuple | None = None
    published_band: tuple[str, str] | None = None
    published_sample_ms: int = 0  # the newest sample's time in the last state published (0 after a restore)
    settings: TrackerSettings = field(default_factory=TrackerSettings)
    # Fleet peer comparison (gpuaware.stream.fleet_peers), recomputed by every check; not in the snapshot.
    throttle_reasons: int = 0  # the newest sample's NVML clocks event reasons
    fleet_strikes: Mapping[str, int] = field(default_factory=lambda: NO_STRIKES)
    fleet_reasons: list[str] | tuple[str, ...] = ()
    # (newest sample ms, volatile SBE count) per run of reads of one count, over the fleet's window
    sbe_window: list | tuple = ()
    sbe_in_window: int | None = None  # errors over it (None: never reported), what the check reads of every GPU
    # Minutes closed since the stored history was read (those of a snapshot's ``closed`` count: they are not in the
    # stored history): tells the processor when to write it.
    history_changes: int = 0
    # Something the publishing signature reads may have moved since the last state went out (a sample, a watch
    # point, an event, a fleet verdict); False lets the heartbeat pass over the GPU without building the
    # signature, which at fleet size was most of its cost (docs/performance.md). True after a restore.
    changed: bool = True
    # Where a tracker whose ``changed`` goes True registers itself (the processor's GPUs the heartbeat looks at: at
    # 50,000 GPUs looking at every GPU every second was ~7 % of a worker's logic); None: held by nobody.
    unsettled: dict | None = field(default=None, compare=False, repr=False)
    _forecasters: dict[str, ColumnForecaster] | None = None  # per metric, every horizon
    # Where a closed minute waits to be learned with its take's (None: at once), and the minute waiting (util, fb).
    closed: ClosedMinutes | None = field(default=None, compare=False, repr=False)
    waiting: tuple[float, float] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.slot = self.readings.new()

    def __del__(self) -> None:
        # (A deep copy holds the same slot in a copy of the store: copy.deepcopy copies the store with the tracker.)
        with contextlib.suppress(AttributeError):  # (no row: made without ``__post_init__``)
            self.readings.release(self.slot)

    def __copy__(self) -> GpuTracker:
        raise TypeError("a GpuTracker cannot be copied shallowly: the copy would share its row of readings")

    # ------------------------------------------------------------------ learning

    def learn_sample(self, node: str, info: GpuInfo, sample: GpuSample, ts_ms: int, now_ms: int) -> Learned:
        """Fold one sample that arrived at ``now_ms`` in; nothing changes unless it is APPLIED."""
        horizon = now_ms + self.settings.max_clock_skew_ms
        if ts_ms > horizon:
            return Learned.AHEAD
        if self.sample_ts_ms > horizon:
            log.warning("GPU %s: forgetting a sample time %d s ahead of this worker's clock", self.uuid,
                        (self.sample_ts_ms - now_ms) // 1000)
            self.sample_ts_ms, self.last_seq = 0, -1
            if self.minute is not None and self.minute * MINUTE_MS > horizon:
                self.minute, self.bucket = None, [0.0, 0.0, 0]
        if sample.seq <= self.last_seq and ts_ms <= self.sample_ts_ms:
            self.duplicates += 1
            return Learned.DUPLICATE
        self.node, self.model, self.index, self.fb_total_mib = node, info.model, info.index, info.fb_total_mib
        self.last_seq = sample.seq
        self.sample_ts_ms = max(self.sample_ts_ms, ts_ms)
        self.arrived_ms = now_ms
        self.samples += 1
        util, fb, power = float(sample.util_gpu), float(sample.fb_used_mib), sample.power_dw / 10.0
        util_mem = float(sample.util_mem)
        r, at = self.readings.values, self.slot * WIDTH
        # Runs for every sample: the row's numbers one by one (NaN: none yet, the one value unequal to itself).
        for i, v in enumerate((util, util_mem, fb, power, float(sample.temp_c)), at):
            prev = r[i]
            r[i] = v if prev != prev else prev + SMOOTHING * (v - prev)
        if sample.sm_clock_mhz is not None:  # the fleet peer check compares clocks under load
            clock = float(sample.sm_clock_mhz)
            prev = r[at + CLOCK]
            r[at + CLOCK] = clock if prev != prev else prev + SMOOTHING * (clock - prev)
        self.throttle_reasons = sample.throttle_reasons or 0
        r[at + CAPPED] = self.throttle_reasons & SW_POWER_CAP
        if sample.ecc_sbe is not None:  # the fleet peer check compares SBE counts over a window
            w, sbe = self.sbe_window, sample.ecc_sbe
            if not w:
                w = self.sbe_window = []
            elif sbe < w[-1][1]:
                w.clear()  # the volatile counter started again (a GPU reset, a driver reload)
            # One entry per count, not per sample: a run of reads of the same count, with the newest time of its reads
            # (a read inside the window keeps its count there; the count is all the check reads). A GPU's 10 minutes
            # of samples were a tuple each, its steady count the same in all of them (docs/stream.md, "Memory").
            if w and sbe == w[-1][1]:
                if ts_ms > w[-1][0]:
                    w[-1] = (ts_ms, sbe)
            else:
                w.append((ts_ms, sbe))
            while len(w) > 1 and w[0][0] < ts_ms - SBE_WINDOW_MS:
                del w[0]
            self.sbe_in_window = w[-1][1] - w[0][1]
            r[at + SBE] = self.sbe_in_window
        r[at + FRESH] = self.fresh_ms
        r[at + MODEL] = self.readings.model(self.model)
        self.fingerprint.learn_one(ts_ms, util, util_mem, fb, float(info.fb_total_mib), power)
        self._bucket(ts_ms // MINUTE_MS, util, fb)
        self.mark_changed()
        return Learned.APPLIED

    def learn_point(self, point: WatchPoint, ts_ms: int, now_ms: int) -> bool:
        """Fold a light watch point (utilisation and power between full samples) in; True when applied.

        Only after a full sample taught the GPU's identity; a point at or before the last one applied
        (a replayed batch) is skipped."""
        if not self.samples or ts_ms <= self.last_point_ms or ts_ms > now_ms + self.settings.max_clock_skew_ms:
            return False
        self.last_point_ms = ts_ms
        self.mark_changed()
        r, at = self.readings.values, self.slot * WIDTH
        for i, v in ((at + UTIL, float(point.util_gpu)), (at + POWER, point.power_dw / 10.0)):
            prev = r[i]
            r[i] = v if prev != prev else prev + SMOOTHING * (v - prev)
        self._bucket(ts_ms // MINUTE_MS, float(point.util_gpu), self.util_fb()[1])
        return True

    def mark_changed(self) -> None:
        """Something the publishing signature reads may have moved: the GPU is looked at by the next heartbeat."""
        self.changed = True
        if self.unsettled is not None:
            self.unsettled[self.uuid] = self

    def _bucket(self, minute: int, util: float, fb: float) -> None:
        if self.minute is not None and minute > self.minute and self.bucket[2]:
            count = self.bucket[2]
            closed = (self.minute, self.bucket[0] / count, self.bucket[1] / count)
            self._models()
            self._close(*closed)
            self.bucket = [0.0, 0.0, 0]
        if self.minute is None or minute >= self.minute:
            self.minute = minute
            self.bucket[0] += util
            self.bucket[1] += fb
            self.bucket[2] += 1

    def _models(self) -> dict[str, ColumnForecaster]:
        if self._forecasters is None:
            self._forecasters = {}
            columns = forecast_columns(self.settings)
            for metric in METRICS:
                upper = 100.0 if metric == "util_gpu" else float(self.fb_total_mib or 1e12)
                self._forecasters[metric] = ColumnForecaster(columns, upper_bound=upper)
        return self._forecasters

    def _close(self, minute: int, util: float, fb: float, render: bool = True) -> None:
        """A closed minute joins the history: its minute here, its values in the forecasters, which keep the last
        ``HISTORY_MINUTES`` of them (and learn from them), at once or, held in ``closed``, with the take's others."""
        self.settle()  # (a minute already waiting: learned first)
        minutes = self.minutes
        minutes.append(minute)
        if len(minutes) > HISTORY_MINUTES:
            del minutes[0]
        self.history_changes += 1
        if render and self.closed is not None:
            self.waiting = (util, fb)
            self.closed.trackers.append(self)
        else:
            self._learn_minute(util, fb, render)

    def settle(self) -> None:
        """Learn the minute waiting in ``closed``, with the others there: what reads the forecasters calls it first."""
        if self.waiting is not None:
            self.closed.learn()

    def last_minutes(self, n: int) -> list[tuple[int, float, float]]:
        """The last ``n`` closed minutes of ``history`` (a snapshot's ``closed``), made alone: a node entry carries
        a minute or two of its GPUs, and the whole hour made for them was ~5 % of a worker's logic."""
        return self._last(min(n, len(self.minutes))) if n > 0 else []

    @property
    def history(self) -> list[tuple[int, float, float]]:
        """The last ``HISTORY_MINUTES`` closed minutes, oldest first: (minute, mean utilisation, mean framebuffer
        used). Made from the minutes and the forecasters' values: a tuple of three boxed numbers per minute was ~9 KiB
        of every GPU's hour (docs/stream.md, "Memory")."""
        return self._last(len(self.minutes))

    def _last(self, n: int) -> list[tuple[int, float, float]]:
        """The last ``n`` (at most ``len(minutes)``) closed minutes, oldest first."""
        if not n:
            return []
        self.settle()
        models = self._models()
        minutes = self.minutes[len(self.minutes) - n:]
        return list(zip(minutes, models["util_gpu"].values(n), models["fb_used_mib"].values(n), strict=True))

    def _learn_minute(self, util: float, fb: float, render: bool = True) -> None:
        """The forecasters learn a closed minute; with ``render``, the GPU's forecasts are made again (rounded to two
        decimals, packed: ``forecasts`` renders them)."""
        out: list[float] = []
        for metric, model in self._models().items():
            y = util if metric == "util_gpu" else fb
            if not render:
                model.learn_one(y)
                continue
            for f in model.learn_forecast(y).values():
                out += (round(f.mean, 2), round(f.lower, 2), round(f.upper, 2))
        if render:
            self._packed = struct.pack(f"<{len(out)}d", *out)

    @property
    def packed_forecasts(self) -> bytes:
        """The rendered forecasts' numbers (mean, lower, upper per metric and horizon, as ``forecasts`` lists them),
        packed doubles: a new object once a minute, never changed in place (what encoders and the demand sum key
        on)."""
        self.settle()
        return self._packed

    @packed_forecasts.setter
    def packed_forecasts(self, packed: bytes) -> None:
        self._packed = packed

    @property
    def forecasts(self) -> KeptForecasts:
        """The forecasts, per metric and horizon, rendered from ``packed_forecasts``, what the GPU keeps of them (the
        records were ~1.3 KiB of each GPU; the encoder keeps their bytes: gpuaware.stream.state_codec)."""
        return self._rendered(self.packed_forecasts)

    def _rendered(self, packed: bytes) -> KeptForecasts:
        if not packed:
            return KeptForecasts((), packed)
        metrics, seconds = label_columns(self.settings.horizons_min)
        check_packed(packed, len(metrics))
        numbers = unpack(len(packed) // 8)(packed)
        return KeptForecasts(map(Forecast, metrics, seconds, numbers[0::3], numbers[1::3], numbers[2::3]), packed)

    @property
    def forecasting(self) -> bool:
        """Its forecasters are built: at its first closed minute (the costliest part of meeting a GPU), or on load."""
        return self._forecasters is not None

    def forecast_abs_errors(self) -> dict[tuple[str, int], float]:
        """Mean absolute error of the recent chosen forecasts, per (metric, horizon in minutes)."""
        if self._forecasters is None:
            return {}
        self.settle()
        return {(metric, h): error for metric, m in self._forecasters.items() for h, error in m.abs_errors().items()}

    def learn_event(self, event: GpuEvent) -> None:
        self.mark_changed()
        events = self.recent_events
        if not events:
            events = self.recent_events = []
        events.append((event.ts_ms, event.kind.value, event.severity.value, event.message[:160]))
        if len(events) > RECENT_EVENTS:
            del events[0]
        if event.kind == EventKind.HEALTH_CHANGE:
            if event.value is not None:
                self.health_score = float(event.value)
            band = event.attributes.get("new_band")
            if band in HealthBand.__members__:
                self.health_band = band
            components = {k.removeprefix("component."): v for k, v in event.attributes.items()
                          if k.startswith("component.")}
            parsed = {}
            for k, v in components.items():
                try:
                    value = float(v)
                except ValueError:
                    continue
                if math.isfinite(value):
                    parsed[k] = value
            if parsed:
                self.health_components = parsed
            verdict, action = event.attributes.get("verdict"), event.attributes.get("action")
            if verdict in HealthVerdict.__members__ and action in HealthAction.__members__:
                self.verdict, self.recommended_action = verdict, action
                self.verdict_reasons = [r[:200] for r in event.attributes.get("reasons", "").split("\n") if r][:8]
        if not self.node:
            self.node = event.node

    # ------------------------------------------------------------------ output

    @property
    def smoothed(self) -> Mapping[str, float]:
        """The smoothed readings learned so far, by name (``readings.NAMES``): a read-only view of the GPU's row."""
        return MappingProxyType(self._smoothed())

    def _smoothed(self) -> dict[str, float]:
        at = self.slot * WIDTH
        values = self.readings.values[at:at + len(NAMES)].tolist()
        total = sum(values)
        if total == total:  # no NaN: every reading (what most GPUs send)
            return dict(zip(NAMES, values, strict=True))
        return {name: v for name, v in zip(NAMES, values, strict=True) if v == v}

    def util_fb(self) -> tuple[float, float]:
        """The smoothed utilisation and framebuffer used, 0 for none yet (what a node's headroom sums)."""
        r, at = self.readings.values, self.slot * WIDTH
        util, fb = r[at + UTIL], r[at + FB]
        return 0.0 if util != util else util, 0.0 if fb != fb else fb

    def _readings(self) -> list[float]:
        """Utilisation, memory utilisation, framebuffer used, power and temperature, 0 for none yet."""
        at = self.slot * WIDTH
        return [v if v == v else 0.0 for v in self.readings.values[at:at + CLOCK]]

    def state_parts(self, now_ms: int) -> tuple:
        """The state's fields in ``GpuState``'s order as the tracker holds them: its band a string, its components
        not copied, its forecasts packed (``packed_forecasts``, labelled by ``label_columns``). ``state`` makes the
        record of them; the publisher writes them straight to bytes (``GpuStateCodec.encode_parts``): made for nearly
        every sample, the record and its ``Forecast`` objects were most of a state's cost."""
        util, util_mem, fb, power, temp = self._readings()
        cls, confidence = self.fingerprint.predict_one()
        verdict, reasons, action = self._verdict()
        return (self.uuid, self.node, self.model, self.fresh_ms, now_ms, round(util, 2), round(util_mem, 2),
                round(fb, 1), self.fb_total_mib, round(power, 1), round(temp, 1), round(self.health_score, 1),
                self.health_band, self.health_components, self.packed_forecasts, cls, confidence, self.samples,
                verdict, reasons, action)

    def state(self, now_ms: int) -> GpuState:
        parts = list(self.state_parts(now_ms))  # (band, components, forecasts: made a record's here)
        parts[12:15] = HealthBand(parts[12]), dict(parts[13]), self._rendered(parts[14])
        return GpuState(*parts)

    def _verdict(self) -> tuple[HealthVerdict, list[str], HealthAction]:
        """The agent's last verdict; before any (a healthy GPU's first is not sent), the band's. A fleet peer
        outlier (gpuaware.stream.fleet_peers) adds its reason and makes a passing verdict WARNING / watch."""
        if self.verdict != UNKNOWN_VERDICT or not self.samples:
            verdict, reasons = HealthVerdict(self.verdict), list(self.verdict_reasons)
            action = HealthAction(self.recommended_action)
        else:
            verdict, action = BAND_VERDICT.get(self.health_band, (HealthVerdict.UNKNOWN, HealthAction.UNKNOWN))
            reasons = [f"health band {self.health_band.lower()}"]
        if self.fleet_reasons:
            reasons = [*reasons, *self.fleet_reasons]
            if verdict in (HealthVerdict.PASS, HealthVerdict.INFO):
                verdict = HealthVerdict.WARNING
            if action in (HealthAction.NONE, HealthAction.UNKNOWN):
                action = HealthAction.WATCH
        return verdict, reasons, action

    @property
    def fresh_ms(self) -> int:
        """How fresh the data is: the newest sample's time, but never later than its arrival."""
        return min(self.sample_ts_ms, self.arrived_ms) if self.arrived_ms else self.sample_ts_ms

    def _signature(self) -> tuple:
        util, fb = self.util_fb()
        fb_step = max(self.fb_total_mib * self.settings.fb_change_share, 1.0)
        return (
            round(util / self.settings.util_change),
            round(fb / fb_step),
            self.health_band, self.fingerprint.last_class, len(self.minutes), self.minute,
            self.verdict, self.recommended_action, tuple(sorted(self.fleet_strikes)) if self.fleet_reasons else (),
        )

    def due(self, now_ms: int, behind: bool = False) -> bool:
        """Publish now? On a health band change, on a new sample or another meaningful change (rate-limited), or
        when the last one is getting old. ``behind``: the record comes from a log the worker is catching up on, so
        newer records of the GPU follow and a state on change would be stale on arrival: only health
        changes go at once, the rest at the heartbeat's rate until the worker is caught up."""
        since = now_ms - self.last_published_ms
        if since >= self.settings.max_interval_ms:
            return True
        if not self.changed:  # (a band or verdict comes with an event, which sets it)
            return False
        if self.published_band is not None and (self.health_band, self.verdict) != self.published_band:
            return True  # a health band or verdict change is what the scheduler acts on: never held back
        if behind or since < self.settings.min_interval_ms:
            return False
        if self.settings.every_sample and self.sample_ts_ms > self.published_sample_ms:
            return True
        if self._signature() != self.published_signature:
            return True
        self.changed = False  # what moved since the last state is below the signature's steps
        return False

    def mark_published(self, now_ms: int) -> None:
        self.changed = False
        self.last_published_ms = now_ms
        self.published_sample_ms = self.sample_ts_ms
        self.published_signature = self._signature()
        self.published_band = (self.health_band, self.verdict)

    # ------------------------------------------------------------------ snapshot

    def to_dict(self, history: bool = True) -> dict:
        """The snapshot; ``history=False`` leaves the minute history out (the processor stores it apart)."""
        data = {
            "uuid": self.uuid, "node": self.node, "model": self.model, "index": self.index,
            "fb_total_mib": self.fb_total_mib, "samples": self.samples, "duplicates": self.duplicates,
            "last_seq": self.last_seq, "sample_ts_ms": self.sample_ts_ms, "arrived_ms": self.arrived_ms,
            "smoothed": self._smoothed(),
            "minute": self.minute, "bucket": self.bucket,
            "health_score": self.health_score, "health_band": self.health_band,
            "health_components": self.health_components, "verdict": self.verdict,
            "verdict_reasons": list(self.verdict_reasons), "recommended_action": self.recommended_action,
            "recent_events": list(self.recent_events),
            "fingerprint": self.fingerprint.to_dict(), "last_published_ms": self.last_published_ms,
            "last_point_ms": self.last_point_ms,
        }
        if history:
            data["history"] = list(self.history)
        return data

    @classmethod
    def from_dict(cls, data: dict, settings: TrackerSettings | None = None,
                  history: list | None = None, readings: Readings = READINGS, carried: bool = True) -> GpuTracker:
        """``history``: the minute history stored apart from ``data`` (None: ``data``'s own); ``readings``: the store
        its row is taken from; ``carried``: the minutes ``data`` carries (``closed``) follow ``history`` (False: a
        newer history holds them)."""
        t = cls(uuid=data["uuid"], settings=settings or TrackerSettings(), readings=readings)
        for name in ("node", "model", "index", "fb_total_mib", "samples", "duplicates", "last_seq", "sample_ts_ms",
                     "minute", "bucket", "health_score", "health_band", "health_components", "last_published_ms"):
            setattr(t, name, data[name])
        t.arrived_ms = data.get("arrived_ms", t.sample_ts_ms)  # absent from snapshots written before it
        r, at = t.readings.values, t.slot * WIDTH
        smoothed = data["smoothed"]
        for i, name in enumerate(NAMES, at):
            if name in smoothed:
                r[i] = float(smoothed[name])
        if t.samples:  # what the fleet check reads (learn_sample writes it with each sample)
            r[at + FRESH] = t.fresh_ms
            r[at + MODEL] = t.readings.model(t.model)
        t.last_point_ms = data.get("last_point_ms", 0)
        # Absent from snapshots written before the verdicts (docs/health.md).
        t.verdict = data.get("verdict", HealthVerdict.UNKNOWN.value)
        t.verdict_reasons = list(data.get("verdict_reasons", ())) or ()
        t.recommended_action = data.get("recommended_action", HealthAction.UNKNOWN.value)
        t.recent_events = [tuple(e) for e in data["recent_events"]][-RECENT_EVENTS:] or ()
        t.fingerprint = WorkloadFingerprint.from_dict(data["fingerprint"])
        # The forecasters rebuilt from the retained history (after a restart or a rebalance), and the minutes closed
        # since it was stored, which the snapshot carries (``closed``).
        closed = list(data.get("closed", ())) if carried else []
        kept = [*(data["history"] if history is None else history), *closed][-HISTORY_MINUTES:]
        if kept:
            t._models()
            for i, (minute, util, fb) in enumerate(kept):
                t._close(minute, util, fb, render=i == len(kept) - 1)
        t.history_changes = len(closed)
        return t
