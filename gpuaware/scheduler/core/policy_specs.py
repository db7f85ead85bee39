"""The named policies as data: plugin names and weights, no plugin code.

Kept apart from ``gpuaware.scheduler.core.policies`` (which builds profiles from them) so that the shared
configuration can validate ``scheduler.policy`` without importing the framework and numpy: every
``gpuaware`` process loads the configuration, the agent included (docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass

FILTERS = ("model-affinity", "capabilities", "gpu-health")


@dataclass(frozen=True)
class PolicySpec:
    scores: tuple[tuple[str, float], ...]
    filters: tuple[str, ...] = FILTERS
    whole_gpus_only: bool = False
    with_throughput: tuple[tuple[str, float], ...] = ()  # scores added when a throughput table is given
    tie_order: str = "random"  # framework.Profile.tie_order
    # Scores that read stream signals, by part (signal -> its filter and scores); each is flat without its
    # signal, so a cluster with no stream places as before. ``profile(..., stream=...)`` drops parts.
    stream: tuple[tuple[str, tuple[str, ...], tuple[tuple[str, float], ...]], ...] = ()


# The stream-driven parts of ``gpuaware``, each kept because the dynamic ablation shows it pays
# (docs/scheduling.md "What the stream changes"): signal, filters, scores.
STREAM_PARTS = (
    # forecast-fit's score at 0.1: a tie-breaker among FGD's equals; at 1.0 it outweighed FGD's packing.
    ("forecast", ("forecast-fit",), (("forecast-fit", 0.1),)),
    ("fingerprint", (), (("fingerprint-colocation", 0.5),)),
    ("thermal", (), (("power-headroom", 0.3),)),
)
SIGNALS = ("forecast", "fingerprint", "thermal", "demand")  # demand is the queue's (core/demand.py), no plugin
# The parts the live profile runs: a part is live only where the ablation shows it winning beyond the noise
# (docs/scheduling.md "The ablation"; none does there). thermal stays as a guard: flat on a cool cluster, it
# spreads work only where a GPU nears its power or temperature limit.
LIVE_STREAM = frozenset({"thermal"})

SPECS: dict[str, PolicySpec] = {
    "random": PolicySpec((("random", 1.0),)),
    "k8s-default": PolicySpec((("least-allocated", 1.0),), whole_gpus_only=True),
    "bestfit": PolicySpec((("best-fit", 1.0),)),
    "dotprod": PolicySpec((("dot-product", 1.0),)),
    "packing": PolicySpec((("gpu-packing", 1.0),)),
    "clustering": PolicySpec((("clustering", 1.0),)),
    "fgd": PolicySpec((("fgd", 1.0),)),
    # FGD as the ATC'23 artifact runs it, to the published figures (plugins/fgd_artifact.py).
    "fgd-artifact": PolicySpec((("fgd-artifact", 1.0),), tie_order="node-order"),
    # FGD, and at the same weight two things FGD does not see: the CPU a node's free GPUs will need and a
    # GPU model's share of the demand only it can serve. Measured on the openb traces, part by part
    # (docs/scheduling.md, gpuaware/bench/gpuaware_ablation.py).
    "gpuaware": PolicySpec((("fgd", 1.0), ("cpu_for_gpus", 1.0), ("model_reservation", 1.0)),
                           with_throughput=(("heterogeneity", 0.3),),
                           stream=STREAM_PARTS),
}
POLICIES = tuple(SPECS)


# The queue orders within a priority (``core.queue.queue_order``), here so that settings validate without the core.
ORDERS = ("fair", "fifo", "las", "predicted")
