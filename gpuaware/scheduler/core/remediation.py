"""The remediation chain of one GPU, as a state machine: cordoned -> drained -> action requested -> validating
-> back in service (docs/health.md, "The remediation chain").

Pure: the caller (gpuaware.scheduler.kube.quarantine) makes the API calls and passes the time. Each GPU taken out of
service gets a ``Chain``; ``observe`` is fed every state update of that GPU and says what the caller must
do next:

- ``REQUEST``: the GPU is drained and its action needs hands the scheduler does not have (a GPU reset, a
  node reboot, a service request): hand it to the cluster's tooling (a node condition);
- ``VALIDATED``: the GPU reported PASS, with no remediation recommended, for ``validate_s`` after its pods
  left (and after the request, when there was one): return it to service;
- ``ESCALATE``: the GPU now needs a stronger action than the one requested: request that one.

A GPU whose verdict is not PASS restarts its validation window: passing once is not passing a window.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gpuaware.contract.events import HealthAction, HealthVerdict

# What the scheduler cannot do itself: it hands these to the cluster's tooling.
HANDED_OFF = (HealthAction.RESET_GPU, HealthAction.REBOOT_NODE, HealthAction.SERVICE_REQUEST)
STRENGTH = {a: i for i, a in enumerate(HealthAction)}  # the enum is declared mildest first


class Step(enum.StrEnum):
    DRAINING = "draining"  # cordoned; its pods are being moved
    REQUESTED = "requested"  # drained; reset/reboot/service handed off, not yet passing
    VALIDATING = "validating"  # drained (and the action requested); waiting for a window of PASS
    IN_SERVICE = "in-service"  # validated and returned


class Next(enum.StrEnum):
    NOTHING = "nothing"
    REQUEST = "request"
    ESCALATE = "escalate"
    VALIDATED = "validated"


class EvictionMode(enum.StrEnum):
    """What the chain does to a namespace's pods on a GPU taken out of service (GPUQueue ``evictionMode``)."""

    EVICT = "evict"  # evict at once, no checkpoint request
    CHECKPOINT_THEN_EVICT = "checkpoint-then-evict"  # ask a checkpointable pod to checkpoint first (the default)
    NEVER = "never"  # leave it running; the chain waits for it to end before a reset or reboot is requested


DEFAULT_EVICTION_MODE = EvictionMode.CHECKPOINT_THEN_EVICT


def eviction_mode(value: object, where: str) -> EvictionMode:
    """``value`` as an eviction mode, or ValueError naming ``where`` (the field) and the allowed values."""
    if value is None:
        return DEFAULT_EVICTION_MODE
    try:
        return EvictionMode(value)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not an eviction mode (one of "
                         f"{', '.join(m.value for m in EvictionMode)})") from None


def stronger(a: HealthAction, b: HealthAction) -> HealthAction:
    return a if STRENGTH[a] >= STRENGTH[b] else b


@dataclass
class Chain:
    node: str
    gpu: int
    action: HealthAction  # the strongest action recommended since the chain started
    reasons: list[str]
    cordoned_at: float
    validate_s: float
    drained_at: float | None = None
    requested_at: float | None = None
    requested: HealthAction | None = None  # the action handed off
    passing_since: float | None = None
    returned_at: float | None = None
    failed_validations: int = 0  # windows that a non-PASS reading cut short
    history: list[tuple[float, str]] = field(default_factory=list)  # (time, step) for the report

    @property
    def step(self) -> Step:
        if self.returned_at is not None:
            return Step.IN_SERVICE
        if self.drained_at is None:
            return Step.DRAINING
        if self.action in HANDED_OFF and self.passing_since is None:
            return Step.REQUESTED
        return Step.VALIDATING

    def drained(self, now: float) -> None:
        if self.drained_at is None:
            self.drained_at = now
            self.history.append((now, "drained"))

    def observe(self, verdict: HealthVerdict, action: HealthAction, reasons: list[str], now: float) -> Next:
        """One state update of the GPU; what the caller must do now."""
        if self.returned_at is not None:
            return Next.NOTHING
        passing = verdict == HealthVerdict.PASS and STRENGTH.get(action, 0) <= STRENGTH[HealthAction.WATCH]
        if not passing:
            if self.passing_since is not None:
                self.failed_validations += 1
                self.history.append((now, "validation failed"))
            self.passing_since = None
            if STRENGTH.get(action, 0) > STRENGTH[self.action]:
                if action == HealthAction.REBOOT_NODE and self.drained_at is not None:
                    # A reboot takes the whole node: what was drained (one GPU) is not enough any more.
                    self.drained_at = None
                    self.history.append((now, "drain widened to the node"))
                self.action, self.reasons = action, list(reasons)
            elif reasons:
                self.reasons = list(reasons)
        if self.drained_at is None:
            return Next.NOTHING
        if self.action in HANDED_OFF and (self.requested is None or STRENGTH[self.action] > STRENGTH[self.requested]):
            first = self.requested is None
            self.requested, self.requested_at = self.action, now
            self.history.append((now, f"requested {self.action.value.lower()}"))
            return Next.REQUEST if first else Next.ESCALATE
        if not passing:
            return Next.NOTHING
        if self.passing_since is None:
            self.passing_since = now
            self.history.append((now, "validating"))
        if now - self.passing_since >= self.validate_s:
            self.returned_at = now
            self.history.append((now, "in service"))
            return Next.VALIDATED
        return Next.NOTHING

    def repair_s(self) -> float | None:
        """Out of service: from the cordon to the return (an MTTR sample), once returned."""
        return None if self.returned_at is None else self.returned_at - self.cordoned_at
