"""The plugin registry and the policies built from it by name."""

from __future__ import annotations

import pkgutil

import pytest

import gpuaware.scheduler.core.plugins
from gpuaware.scheduler.core.framework import Plugin
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.policy_specs import LIVE_STREAM, POLICIES, SPECS, STREAM_PARTS
from gpuaware.scheduler.core.registry import Handle, Registry, in_tree
from gpuaware.scheduler.core.throughput import ThroughputTable
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix

MIX = WorkloadMix.of([Workload("w", 1000, 1024, 1, 1000), Workload("t4", 1000, 1024, 1, 1000, models=("T4",))])
FULL = Handle(MIX, seed=3, throughput=ThroughputTable({}, {}))


def test_every_plugin_module_is_registered_under_the_name_its_plugin_gives():
    registry = in_tree()
    modules = {m.name for m in pkgutil.iter_modules(gpuaware.scheduler.core.plugins.__path__)}
    built = [registry.build(name, FULL) for name in registry.names()]
    assert {type(p).__module__.rsplit(".", 1)[1] for p in built} == modules  # one plugin per file, all in
    assert [p.name for p in built] == registry.names()
    assert all(isinstance(p, Plugin) for p in built)


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown plugin 'fdg'; known: .*best-fit.*fgd"):
        in_tree().build("fdg", FULL)
    with pytest.raises(ValueError, match=r"unknown policy 'gpu-aware'; known: random, k8s-default"):
        profile("gpu-aware", MIX)


def test_a_name_is_registered_once_and_must_match_its_plugin():
    registry = in_tree()
    with pytest.raises(ValueError, match="already registered"):
        registry.register("fgd", lambda h: None)
    other = Registry({"alias": lambda h: in_tree().build("fgd", h)})
    with pytest.raises(ValueError, match="registered as 'alias' calls itself 'fgd'"):
        other.build("alias", FULL)


def test_factories_say_what_the_handle_lacks():
    with pytest.raises(ValueError, match="'fgd' needs a workload mix"):
        in_tree().build("fgd", Handle())
    with pytest.raises(ValueError, match="'heterogeneity' needs a throughput table"):
        in_tree().build("heterogeneity", Handle(MIX))


def test_factories_build_fresh_plugins_from_the_handle():
    registry = in_tree()
    first, second = registry.build("fgd", FULL), registry.build("fgd", FULL)
    assert first is not second  # FGD caches per-cluster figures: profiles must not share one
    assert registry.build("cpu_for_gpus", FULL).cpu_per_gpu == MIX.cpu_per_gpu()
    assert registry.build("model_reservation", FULL).demand == MIX.model_demand()
    assert registry.build("random", FULL).rng.random() == registry.build("random", Handle(seed=3)).rng.random()


def test_policies_name_the_plugins_and_weights_they_always_had():
    shapes = {name: ([f.name for f in p.filters], [(s.name, w) for s, w in p.scores], p.whole_gpus_only)
              for name in POLICIES for p in [profile(name, MIX)]}
    filters = ["model-affinity", "capabilities", "gpu-health"]
    assert shapes == {
        "random": (filters, [("random", 1.0)], False),
        "k8s-default": (filters, [("least-allocated", 1.0)], True),
        "bestfit": (filters, [("best-fit", 1.0)], False),
        "dotprod": (filters, [("dot-product", 1.0)], False),
        "packing": (filters, [("gpu-packing", 1.0)], False),
        "clustering": (filters, [("clustering", 1.0)], False),
        "fgd": (filters, [("fgd", 1.0)], False),
        "fgd-artifact": (filters, [("fgd-artifact", 1.0)], False),
        "gpuaware": (filters + [f for sig, fs, _ in STREAM_PARTS if sig in LIVE_STREAM for f in fs],
                     [("fgd", 1.0), ("cpu_for_gpus", 1.0), ("model_reservation", 1.0)]
                     + [s for sig, _, ss in STREAM_PARTS if sig in LIVE_STREAM for s in ss], False),
    }
    # The stream parts score flat without their signals (tests/scheduler/core/test_stream_signals.py).
    assert [s for sig, _, ss in STREAM_PARTS for s, _ in ss] == ["forecast-fit", "fingerprint-colocation",
                                                                 "power-headroom"]
    with_table = profile("gpuaware", MIX, throughput=ThroughputTable({}, {}))
    assert ("heterogeneity", 0.3) in [(s.name, w) for s, w in with_table.scores]
    assert all(n in in_tree() for spec in SPECS.values() for n in spec.filters + tuple(s for s, _ in spec.scores))
