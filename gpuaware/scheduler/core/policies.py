"""The named policies the simulator compares, all on the same framework: plugin names and weights."""

from __future__ import annotations

from gpuaware.scheduler.core.framework import Profile
from gpuaware.scheduler.core.policy_specs import LIVE_STREAM, POLICIES, SPECS
from gpuaware.scheduler.core.registry import Handle, Registry, in_tree
from gpuaware.scheduler.core.throughput import ThroughputTable
from gpuaware.scheduler.core.workload_mix import WorkloadMix

_REGISTRY = in_tree()


def profile(name: str, mix: WorkloadMix, seed: int = 0, throughput: ThroughputTable | None = None,
            registry: Registry = _REGISTRY, stream: frozenset[str] | None = None) -> Profile:
    """``mix``: the pod shapes expected to keep arriving; FGD reads its 64 most common shapes, as the FGD
    artifact keeps only typical pods, and ``gpuaware`` also the CPU per GPU and the demand only some GPU
    models may serve. With a ``throughput`` table ``gpuaware`` also weighs each workload's speed on each
    GPU model (workloads without a ``gavel_class`` label score the same everywhere). ``stream``: the stream
    parts to keep (signal names; default all), for the ablation."""
    spec = SPECS.get(name)
    if spec is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    scores = spec.scores + (spec.with_throughput if throughput is not None else ())
    filters = spec.filters
    for signal, part_filters, part_scores in spec.stream:
        if signal in (LIVE_STREAM if stream is None else stream):
            filters, scores = filters + part_filters, scores + part_scores
    return registry.profile(name, filters, scores, Handle(mix, seed, throughput), spec.whole_gpus_only,
                            spec.tie_order)
