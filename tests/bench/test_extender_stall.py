"""The extender stall benchmark runs and reports each case (a small body: the numbers come from a real run)."""

from __future__ import annotations

import asyncio

from gpuaware.bench import extender_stall


def test_the_stall_benchmark_refuses_the_body_at_the_default_cap_and_answers_it_with_the_cap_raised():
    out = asyncio.run(extender_stall.measure(2.5, 1))
    assert out["body_bytes"] > 2.5 * 2**20
    assert out["default_cap"]["status"] == [413] and out["cap_raised"]["status"] == [200]
    for case in ("default_cap", "cap_raised", "reference_orjson_on_a_thread", "reference_json_on_a_thread"):
        assert out[case]["stall_ms_max"] >= 0
