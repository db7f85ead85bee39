"""The plugin registry: plugin name -> factory (kube-scheduler's ``runtime.Registry``).

A factory builds a plugin from a ``Handle``, what the scheduler knows when it builds a profile:
the workload mix it expects, its seed, the measured GPU throughput. ``in_tree()`` registers every
plugin in ``plugins/`` under its ``name``; ``Registry.profile`` builds a profile from plugin names
and score weights, so a policy is data (``policies.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuaware.scheduler.core.framework import Plugin, Profile
from gpuaware.scheduler.core.plugins.bestfit import BestFit
from gpuaware.scheduler.core.plugins.capabilities import Capabilities
from gpuaware.scheduler.core.plugins.clustering import Clustering
from gpuaware.scheduler.core.plugins.colocation import FingerprintColocation
from gpuaware.scheduler.core.plugins.cpu_for_gpus import CpuForGpus
from gpuaware.scheduler.core.plugins.dotprod import DotProduct
from gpuaware.scheduler.core.plugins.fgd import FragmentationGradient
from gpuaware.scheduler.core.plugins.fgd_artifact import ArtifactFragmentationGradient, typical_pods_of
from gpuaware.scheduler.core.plugins.forecast_fit import ForecastFit
from gpuaware.scheduler.core.plugins.forecast_headroom import ForecastHeadroom
from gpuaware.scheduler.core.plugins.health import HealthFilter
from gpuaware.scheduler.core.plugins.heterogeneity import HeterogeneityAffinity
from gpuaware.scheduler.core.plugins.interference import InterferenceAware
from gpuaware.scheduler.core.plugins.least_allocated import LeastAllocated
from gpuaware.scheduler.core.plugins.model_affinity import ModelAffinity
from gpuaware.scheduler.core.plugins.model_reservation import ModelReservation
from gpuaware.scheduler.core.plugins.packing import GpuPacking
from gpuaware.scheduler.core.plugins.power_headroom import PowerHeadroom
from gpuaware.scheduler.core.plugins.random_score import RandomScore
from gpuaware.scheduler.core.plugins.thermal import ThermalSpread
from gpuaware.scheduler.core.throughput import ThroughputTable
from gpuaware.scheduler.core.workload_mix import WorkloadMix

FGD_TASK_TYPES = 64  # FGD reads the mix's most common shapes only, as the FGD artifact keeps only typical pods


@dataclass(frozen=True)
class Handle:
    """What factories build plugins from (kube's ``framework.Handle``)."""

    mix: WorkloadMix | None = None  # the pod shapes expected to keep arriving
    seed: int = 0
    throughput: ThroughputTable | None = None
    workload_classes: dict[str, str] = field(default_factory=dict)  # placed workload id -> Gavel class

    def need_mix(self, plugin: str) -> WorkloadMix:
        if self.mix is None:
            raise ValueError(f"plugin {plugin!r} needs a workload mix")
        return self.mix

    def need_throughput(self, plugin: str) -> ThroughputTable:
        if self.throughput is None:
            raise ValueError(f"plugin {plugin!r} needs a throughput table")
        return self.throughput


Factory = Callable[[Handle], Plugin]


class Registry:
    def __init__(self, factories: dict[str, Factory] | None = None):
        self._factories: dict[str, Factory] = {}
        for name, factory in (factories or {}).items():
            self.register(name, factory)

    def register(self, name: str, factory: Factory) -> None:
        if name in self._factories:
            raise ValueError(f"plugin {name!r} is already registered")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def build(self, name: str, handle: Handle) -> Plugin:
        factory = self._factories.get(name)
        if factory is None:
            raise ValueError(f"unknown plugin {name!r}; known: {', '.join(self.names())}")
        plugin = factory(handle)
        if plugin.name != name:
            raise ValueError(f"plugin registered as {name!r} calls itself {plugin.name!r}")
        return plugin

    def profile(self, name: str, filters: Iterable[str], scores: Iterable[tuple[str, float]], handle: Handle,
                whole_gpus_only: bool = False, tie_order: str = "random") -> Profile:
        """A profile of the named filters and the named scores at their weights, each plugin built anew."""
        return Profile(name, [self.build(f, handle) for f in filters],
                       [(self.build(s, handle), weight) for s, weight in scores], whole_gpus_only, tie_order)


def in_tree() -> Registry:
    """Every plugin in ``plugins/``."""
    return Registry({
        ModelAffinity.name: lambda h: ModelAffinity(),
        Capabilities.name: lambda h: Capabilities(),
        HealthFilter.name: lambda h: HealthFilter(),
        ForecastHeadroom.name: lambda h: ForecastHeadroom(),
        RandomScore.name: lambda h: RandomScore(h.seed),
        LeastAllocated.name: lambda h: LeastAllocated(),
        BestFit.name: lambda h: BestFit(),
        DotProduct.name: lambda h: DotProduct(),
        GpuPacking.name: lambda h: GpuPacking(),
        Clustering.name: lambda h: Clustering(),
        ThermalSpread.name: lambda h: ThermalSpread(),
        FragmentationGradient.name:
            lambda h: FragmentationGradient(h.need_mix(FragmentationGradient.name).task_types(top=FGD_TASK_TYPES)),
        ArtifactFragmentationGradient.name: lambda h: ArtifactFragmentationGradient(
            typical_pods_of(h.need_mix(ArtifactFragmentationGradient.name).counts.items())),
        CpuForGpus.name: lambda h: CpuForGpus(h.need_mix(CpuForGpus.name).cpu_per_gpu()),
        ModelReservation.name: lambda h: ModelReservation(h.need_mix(ModelReservation.name).model_demand()),
        HeterogeneityAffinity.name:
            lambda h: HeterogeneityAffinity(h.need_throughput(HeterogeneityAffinity.name)),
        InterferenceAware.name:
            lambda h: InterferenceAware(h.need_throughput(InterferenceAware.name), h.workload_classes),
        ForecastFit.name: lambda h: ForecastFit(),
        FingerprintColocation.name: lambda h: FingerprintColocation(h.throughput),
        PowerHeadroom.name: lambda h: PowerHeadroom(),
    })
