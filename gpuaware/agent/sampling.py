"""Adaptive sampling: how often a GPU's full sample is taken and published.

Two rates, like DCGM's field watches. A handful of cheap *watch* fields (utilisation, memory,
temperature, power, ECC counters, throttle reasons) are read at the policy's floor so faults are
seen within a second or two. The *full sample* (every field, published on
``gpu.telemetry.v1``) is taken at an interval that moves between floor and ceiling:

- it grows by ``backoff`` after each sample while the watched metrics stay inside their deadbands;
- it snaps to the floor when a watched metric leaves its deadband around the last published
  value (so the published timeline never drifts further than the deadband), or on an anomaly,
  a health-band change or an XID;
- except utilisation and power (with ``light_points``, the default): when only they move, the
  watch read itself is published as a *light point* (utilisation and power, ~5 bytes, beside the
  full samples of ``gpu.telemetry.v1``), with the read before it when that one was not published
  (the end of the plateau, so a line drawn between published points follows a step), and the
  full-sample interval keeps backing off. Bursty inference moves utilisation every few seconds:
  without light points every burst cost two full samples.

A policy arrives from a file admins edit and from the control topic, which is compacted and
replayed at every start: one hostile record must not be able to crash the agent. So the text is
bounded before it is parsed (``MAX_POLICY_BYTES``) and so is its nesting (``MAX_POLICY_DEPTH``,
checked while the YAML is composed, before PyYAML's recursion can exhaust the stack); both are
rejected with a ``PolicyError`` that names the limit, like any other bad policy.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuaware.agent.readings import Reading


class Deadbands(BaseModel):
    model_config = ConfigDict(extra="forbid")

    util_gpu: float = Field(3.0, gt=0, description="percentage points")
    fb_used_pct: float = Field(2.0, gt=0, description="percent of the framebuffer")
    temp_c: float = Field(3.0, gt=0)
    power_pct: float = Field(8.0, gt=0, description="percent of the power limit")


class PolicyOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")

    floor_s: float | None = Field(None, ge=0.1, le=60)
    ceiling_s: float | None = Field(None, ge=0.1, le=3600)
    backoff: float | None = Field(None, gt=1, le=4)


class SamplingPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    floor_s: float = Field(1.0, ge=0.1, le=60, description="fastest full-sample interval; also the watch interval")
    ceiling_s: float = Field(30.0, ge=0.1, le=3600, description="slowest full-sample interval")
    backoff: float = Field(1.5, gt=1, le=4, description="interval growth per stable sample")
    deadbands: Deadbands = Deadbands()
    flush_s: float = Field(5.0, ge=0.1, le=300, description="telemetry batch window")
    light_points: bool = Field(True, description="publish utilisation/power moves as light watch points "
                                                 "instead of full samples")
    nodes: dict[str, PolicyOverride] = Field(default_factory=dict, description="per-node overrides by node name")

    @model_validator(mode="after")
    def _check(self) -> SamplingPolicy:
        if self.floor_s > self.ceiling_s:
            raise ValueError(f"floor_s: {self.floor_s} is above ceiling_s {self.ceiling_s}")
        for node, o in self.nodes.items():
            floor = o.floor_s if o.floor_s is not None else self.floor_s
            ceiling = o.ceiling_s if o.ceiling_s is not None else self.ceiling_s
            if floor > ceiling:
                raise ValueError(f"nodes.{node}.floor_s: {floor} is above ceiling_s {ceiling}")
        return self

    def for_node(self, node: str) -> SamplingPolicy:
        o = self.nodes.get(node)
        if o is None:
            return self
        return self.model_copy(update={k: v for k, v in o.model_dump().items() if v is not None} | {"nodes": {}})


class PolicyError(ValueError):
    """A sampling policy was rejected; the message names the field and the reason."""


# A real policy is a few hundred bytes, or ~200 KiB with an override for each of 4096 nodes.
MAX_POLICY_BYTES = 1 * 2**20
# The schema is four levels deep (nodes -> name -> field); the rest is headroom.
MAX_POLICY_DEPTH = 16


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses to compose nodes nested deeper than ``MAX_POLICY_DEPTH``."""

    _depth = 0

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self._depth >= MAX_POLICY_DEPTH:
            raise PolicyError(f"nested deeper than {MAX_POLICY_DEPTH} levels")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_policy(text: str, source: str = "policy") -> SamplingPolicy:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICY_BYTES:
        raise PolicyError(f"{source}: larger than {MAX_POLICY_BYTES} bytes ({size})")
    try:
        loader = _BoundedLoader(text)  # the reader checks the characters here already
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML: {exc}") from exc
    except PolicyError as exc:
        raise PolicyError(f"{source}: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: top level must be a mapping, not {type(data).__name__}")
    try:
        return SamplingPolicy.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<policy>'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise PolicyError(f"{source}: {problems}") from None


def load_policy(path: str | Path) -> SamplingPolicy:
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_POLICY_BYTES + 1)  # never more than the bound into memory
    except OSError as exc:
        raise PolicyError(f"{p}: cannot read: {exc.strerror}") from exc
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(f"{p}: larger than {MAX_POLICY_BYTES} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{p}: not UTF-8: {exc}") from None
    return parse_policy(text, str(p))


LIGHT = ("util_gpu", "power")


class AdaptiveSampler:
    """Per-GPU interval state. ``due(reading)`` says whether to take a full sample now."""

    def __init__(self, policy: SamplingPolicy, fb_total_mib: float, power_limit_w: float):
        self.policy = policy
        self.fb_total_mib = fb_total_mib or 1.0
        self.power_limit_w = power_limit_w or 1.0
        self.interval = policy.floor_s
        self.next_due = 0.0
        self.last: Reading | None = None
        self.urgent = False
        self.moved: str | None = None  # why the last due() fired early, if it did
        self.ref: Reading | None = None  # the last published utilisation and power (full sample or light point)
        self.prev: Reading | None = None  # the previous watch read, and whether it was published
        self.prev_published = False
        self.pinned = False  # a cordoned GPU is watched at the floor until it is released

    def set_policy(self, policy: SamplingPolicy) -> None:
        self.policy = policy
        self.interval = min(max(self.interval, policy.floor_s), policy.ceiling_s)
        self.next_due = min(self.next_due, (self.last.ts if self.last else 0.0) + self.interval)

    def snap(self) -> None:
        """An anomaly, health change or XID: sample now and at the floor after."""
        self.urgent = True

    def outside_deadband(self, r: Reading) -> str | None:
        """The first watched metric out of its deadband: a full-sample one first, then a light one."""
        last = self.last
        if last is None:
            return "first"
        ref = self.ref if self.ref is not None and self.policy.light_points else last
        d = self.policy.deadbands
        checks = (
            ("fb_used", r.fb_used_mib, last.fb_used_mib, d.fb_used_pct * self.fb_total_mib / 100),
            ("temp", r.temp_c, last.temp_c, d.temp_c),
            ("util_gpu", r.util_gpu, ref.util_gpu, d.util_gpu),
            ("power", r.power_w, ref.power_w, d.power_pct * self.power_limit_w / 100),
        )
        if (r.ecc_sbe_volatile, r.ecc_dbe_volatile, r.throttle_reasons) != (
                last.ecc_sbe_volatile, last.ecc_dbe_volatile, last.throttle_reasons):
            return "counters"
        for name, now, before, band in checks:
            if now is not None and before is not None and abs(now - before) > band:
                return name
        return None

    def light_move(self) -> bool:
        return self.policy.light_points and self.moved in LIGHT

    def due(self, watch: Reading) -> bool:
        moved = self.moved = self.outside_deadband(watch)
        if self.urgent or (moved is not None and not self.light_move()):
            self.interval = self.policy.floor_s
            return True
        return watch.ts >= self.next_due

    def light(self, watch: Reading, sampled: bool) -> list[Reading]:
        """The watch reads to publish as light points after ``watch`` (``sampled``: it became a full sample)."""
        out: list[Reading] = []
        if not sampled and self.light_move():
            if self.prev is not None and not self.prev_published and (self.last is None or self.prev.ts > self.last.ts):
                out.append(self.prev)
            out.append(watch)
            self.ref = watch
        self.prev, self.prev_published = watch, sampled or bool(out)
        return out

    def taken(self, sample: Reading, changed: bool) -> float:
        """Record a full sample; ``changed`` is whether it was taken because something moved."""
        if changed or self.urgent or self.pinned:
            self.interval = self.policy.floor_s
        else:
            self.interval = min(self.policy.ceiling_s, self.interval * self.policy.backoff)
        self.urgent = False
        self.last = self.ref = sample
        self.next_due = sample.ts + self.interval
        return self.interval
