"""The extender /filter benchmark: both request forms answered, the share of nodes named, the handler's CPU."""

from __future__ import annotations

import asyncio

from gpuaware.bench import extender_bench


def test_a_request_names_the_asked_share_of_the_nodes_and_the_handlers_cpu_is_reported():
    out = asyncio.run(extender_bench.measure(20, 2, images=0, asked=0.5))
    assert out["nodes"] == 20 and out["nodes_asked"] == 10
    for form in ("nodeCacheCapable=false", "nodeCacheCapable=true"):
        assert out[form]["kept_nodes"] == 10  # a one-GPU pod fits every node named
    assert out["filter_handler_cpu_ms_mean"] > 0
