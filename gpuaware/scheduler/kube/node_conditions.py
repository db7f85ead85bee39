"""What a node's GPU remediation chains say on the Node: two conditions and one taint (docs/health.md).

The convention is Node Problem Detector's, as AKS uses it for GPUs (``GPUMissing``, ``XIDErrors``,
``NVLinkStatusInactive``): a condition named after the problem, ``True`` while the problem is there,
with a CamelCase reason and a message for people; ``False`` (with its own reason) once it is gone,
rather than deleted, so ``kubectl describe node`` shows that it was looked at.

- ``GPUUnhealthy``: some GPU of the node is out of service for its health (cordoned, drained, waiting
  for its action or validating); the reason names the strongest action, the message each GPU, its
  step and its reasons.
- ``GPUMaintenanceRequired``: the hand-off. ``True`` while a drained GPU waits for an action the
  scheduler cannot take (reason ``GPUResetRequired``, ``NodeRebootRequired`` or ``GPUServiceRequired``;
  message ``<action>: GPU <i>,<j>``); the cluster's tooling acts on it (e.g. a Medik8s NodeHealthCheck
  ``unhealthyConditions`` entry for a reboot). It turns ``False`` once the GPU reads PASS again.
- taint ``gpuaware.io/gpu-unhealthy=<action>``: ``NoSchedule`` when the node is to be rebooted (nothing
  new may land), else ``PreferNoSchedule`` (the node's other GPUs still serve; gpuaware's own pods are
  kept off the cordoned GPU by the GPU cordon). Lifted when the last chain of the node returns to service.

Pure: the caller writes what ``desired`` returns when it differs from what it wrote last. The condition
is also the chains' record: a new leader takes over the chains ``open_chains`` reads from it (a GPU
cordon that no condition explains, an operator's, is left alone).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from gpuaware.contract.events import HealthAction
from gpuaware.scheduler.core.remediation import STRENGTH, Chain, Step
from gpuaware.scheduler.kube.objects import HEALTH_TAINT_KEY

GPU_UNHEALTHY = "GPUUnhealthy"
GPU_MAINTENANCE = "GPUMaintenanceRequired"
CONDITION_TYPES = (GPU_UNHEALTHY, GPU_MAINTENANCE)
TAINT_KEY = HEALTH_TAINT_KEY

UNHEALTHY_REASON = {HealthAction.DRAIN: "GPUDrained", HealthAction.RESET_GPU: "GPUResetRecommended",
                    HealthAction.REBOOT_NODE: "NodeRebootRecommended",
                    HealthAction.SERVICE_REQUEST: "GPUServiceRecommended"}
MAINTENANCE_REASON = {HealthAction.RESET_GPU: "GPUResetRequired", HealthAction.REBOOT_NODE: "NodeRebootRequired",
                      HealthAction.SERVICE_REQUEST: "GPUServiceRequired"}
HEALTHY = ("GPUsHealthy", "no GPU of this node is out of service for its health")
NO_MAINTENANCE = ("NoMaintenanceRequired", "no GPU of this node waits for a reset, reboot or service")


def _strongest(actions: Iterable[HealthAction]) -> HealthAction:
    return max(actions, key=lambda a: STRENGTH[a])


def desired(chains: Iterable[Chain]) -> tuple[dict[str, tuple[str, str, str]], dict[str, Any] | None]:
    """({condition type: (status, reason, message)}, taint or None) for a node's chains."""
    active = sorted((c for c in chains if c.step != Step.IN_SERVICE), key=lambda c: c.gpu)
    conditions = {GPU_UNHEALTHY: ("False", *HEALTHY), GPU_MAINTENANCE: ("False", *NO_MAINTENANCE)}
    if not active:
        return conditions, None
    worst = _strongest(c.action for c in active)
    message = "; ".join(f"GPU {c.gpu} {c.step.value} ({c.action.value.lower()}): "
                        f"{' / '.join(c.reasons) or 'no reason given'}" for c in active)
    conditions[GPU_UNHEALTHY] = ("True", UNHEALTHY_REASON.get(worst, "GPUDrained"), message[:1024])
    waiting = [c for c in active if c.step == Step.REQUESTED and c.requested is not None]
    if waiting:
        requested = _strongest(c.requested for c in waiting if c.requested is not None)
        gpus = ",".join(str(c.gpu) for c in waiting)
        conditions[GPU_MAINTENANCE] = ("True", MAINTENANCE_REASON[requested], f"{requested.value.lower()}: GPU {gpus}")
    effect = "NoSchedule" if worst == HealthAction.REBOOT_NODE else "PreferNoSchedule"
    return conditions, {"key": TAINT_KEY, "value": worst.value.lower(), "effect": effect}


_OPEN = re.compile(r"GPU (\d+) (?:draining|requested|validating) \((\w+)\): (.*?)(?=; GPU \d+ |$)")


def open_chains(node: Mapping[str, Any]) -> tuple[dict[int, tuple[HealthAction, list[str]]], float | None]:
    """The chains a node's ``GPUUnhealthy`` condition says are open ({GPU index: (action, reasons)}) and when
    it turned True (unix s): what a new leader takes over from the last one. Empty when it is not True."""
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == GPU_UNHEALTHY and c.get("status") == "True":
            found = {int(g): (HealthAction[a.upper()], reasons.split(" / "))
                     for g, a, reasons in _OPEN.findall(c.get("message") or "")
                     if a.upper() in HealthAction.__members__}
            try:
                since = datetime.fromisoformat(c.get("lastTransitionTime") or "").timestamp()
            except ValueError:
                since = None
            return found, since
    return {}, None


_REQUESTED = re.compile(r"^(\w+): GPU ([\d,]+)$")


def requested(node: Mapping[str, Any]) -> tuple[HealthAction, list[int]] | None:
    """What a node's ``GPUMaintenanceRequired`` condition asks the cluster's tooling for: (action, GPU indices),
    or None when it asks nothing (the message ``desired`` writes)."""
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == GPU_MAINTENANCE and c.get("status") == "True":
            m = _REQUESTED.match(c.get("message") or "")
            if m and m.group(1).upper() in HealthAction.__members__:
                return HealthAction[m.group(1).upper()], [int(g) for g in m.group(2).split(",")]
    return None


def condition_objects(want: Mapping[str, tuple[str, str, str]], node: Mapping[str, Any] | None,
                      now: str) -> list[dict[str, Any]]:
    """The conditions to write: a type whose status is unchanged keeps its lastTransitionTime."""
    have = {c.get("type"): c for c in ((node or {}).get("status") or {}).get("conditions") or []}
    out = []
    for type_, (status, reason, message) in want.items():
        old = have.get(type_)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        out.append({"type": type_, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now[:19] + "Z", "lastTransitionTime": since or now[:19] + "Z"})
    return out
