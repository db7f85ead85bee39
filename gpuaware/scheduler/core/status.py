"""Why a cycle placed a workload or did not: typed reasons (kube-scheduler's ``framework.Status``).

A ``Reason`` is a ``Code``, the plugin (or framework stage) that reported it and the human message
events and decision records carry. Filters declare the one code they report; the framework's own
checks (CPU and memory, the node mask, GPU counts) have theirs. ``reason_label`` turns a failed
decision into the low-cardinality label of ``gpuaware_scheduler_decisions{action="UNSCHEDULABLE"}``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuaware.scheduler.core.framework import Decision


class Code(enum.Enum):
    # What the filter stage rejected: a failed cycle lists these after "0/N nodes available: ".
    RESERVED = "reserved"  # the caller's node mask: held for a higher-priority job, or cordoned / not ready
    INSUFFICIENT_CPU_MEMORY = "insufficient-cpu-memory"
    GPU_MODEL_MISMATCH = "gpu-model-mismatch"
    GPU_CAPABILITIES = "gpu-capabilities"
    UNHEALTHY = "unhealthy"
    FORECAST_HEADROOM = "forecast-headroom"
    INSUFFICIENT_GPU = "insufficient-gpu"  # no single GPU with the compute and memory asked for
    INSUFFICIENT_WHOLE_GPUS = "insufficient-whole-gpus"  # no node with k free whole GPUs
    NO_FEASIBLE_NODE = "no-feasible-node"  # nothing rejected, nothing fits: an empty cluster
    # What happened to the workload as a whole.
    SCHEDULED = "scheduled"
    PREEMPTED = "preempted"
    PREEMPTION_FAILED = "preemption-failed"
    GANG_INCOMPLETE = "gang-incomplete"
    QUOTA = "quota"  # the tenant's quota and borrowing limit leave no room for it

    @property
    def filtered(self) -> bool:
        """A code of the filter stage (rendered into the "0/N nodes available" summary)."""
        return self in _FILTERED


_FILTERED = frozenset({Code.RESERVED, Code.INSUFFICIENT_CPU_MEMORY, Code.GPU_MODEL_MISMATCH, Code.GPU_CAPABILITIES,
                       Code.UNHEALTHY, Code.FORECAST_HEADROOM, Code.INSUFFICIENT_GPU, Code.INSUFFICIENT_WHOLE_GPUS,
                       Code.NO_FEASIBLE_NODE})


@dataclass(frozen=True, slots=True)
class Reason:
    code: Code
    plugin: str  # the plugin's registry name, or the framework stage ("node-resources", "gpu-fit", ...)
    message: str  # what people read: "3 gpu model not allowed", "no node with 4 free GPUs"


def render(why: Iterable[Reason], nodes: int) -> list[str]:
    """The human-readable reasons, as the framework has always written them: the filter stage's
    reasons as one "0/N nodes available: a, b" line, then every other reason as its own line."""
    why = list(why)
    filtered = [r.message for r in why if r.code.filtered]
    rest = [r.message for r in why if not r.code.filtered]
    return [f"0/{nodes} nodes available: " + ", ".join(filtered), *rest] if filtered else rest


# The label of a failed decision: its most telling code's, in the order the live scheduler's substring
# matching of the messages used to rank them (the labels on dashboards stay the same). Codes not listed are "other".
_LABELS: tuple[tuple[Code, str], ...] = (
    (Code.GANG_INCOMPLETE, "gang-incomplete"),
    (Code.INSUFFICIENT_CPU_MEMORY, "cpu-memory"),
    (Code.INSUFFICIENT_WHOLE_GPUS, "gpus"),
    (Code.INSUFFICIENT_GPU, "gpus"),
    (Code.UNHEALTHY, "health"),
    (Code.GPU_MODEL_MISMATCH, "gpu-model"),
    (Code.GPU_CAPABILITIES, "capabilities"),
    (Code.RESERVED, "reservation"),
)


def label_of(code: Code) -> str:
    return next((label for c, label in _LABELS if c is code), "other")


def reason_label(decision: Decision) -> str:
    """The ``reason`` label of an UNSCHEDULABLE decision (low cardinality: no ids, no counts)."""
    codes = {r.code for r in decision.why}
    return next((label for code, label in _LABELS if code in codes), "other")
