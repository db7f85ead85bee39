"""`gpuaware bench` as a user runs it: the agent benchmark prints its figures as JSON."""

from __future__ import annotations

import json

import pytest

from tests.support import run


@pytest.mark.broker
def test_bench_agent_prints_the_figures_as_json():
    result = run("bench", "agent", "--seconds", "3", "--gpus", "2", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for key in ("cpu_percent_of_core", "rss_mib", "bytes_per_gpu_sample", "dcgm_text_bytes_per_gpu"):
        assert figures[key] > 0, key
    assert figures["gpus"] == 2 and figures["spool_dropped"] == 0


def test_bench_pipeline_on_apache_kafka_joins_groups_with_a_session_it_accepts():
    # The 2 s session the embedded broker's benches use made every worker's group join fail
    # (InvalidSessionTimeoutError) on Apache Kafka, whose minimum is 6 s.
    from gpuaware.cli.bench import APACHE_MIN_SESSION_TIMEOUT_MS, apache_client_settings
    from plumbing.kafka_settings import KafkaSettings

    class Broker:
        def kafka_settings(self, **overrides):
            return KafkaSettings(bootstrap_servers="127.0.0.1:9092", **overrides)

    assert apache_client_settings(Broker()).session_timeout_ms >= APACHE_MIN_SESSION_TIMEOUT_MS
