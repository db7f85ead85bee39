"""The histogram helper, and the scheduler's and the stream's histograms that use it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuaware.plumbing.metrics import Histogram, histogram_family
from gpuaware.scheduler.metrics import QueueSnapshot, SchedulerCollector, SchedulerStats
from gpuaware.stream.metrics import StreamCollector, StreamStats


def test_buckets_are_cumulative_upper_bounds_with_the_bound_as_written():
    h = Histogram((0.5, 1, 5))
    for v in (0.1, 0.5, 0.7, 1.0, 6.0):
        h.observe(v)
    assert h.buckets() == [("0.5", 2), ("1", 4), ("5", 4), ("+Inf", 5)]  # a value on a bound is in it (le)
    assert (h.count, h.sum) == (5, pytest.approx(8.3))


def test_bounds_must_increase():
    with pytest.raises(ValueError, match="increasing"):
        Histogram((1, 0.5))
    with pytest.raises(ValueError, match="increasing"):
        Histogram((1, 1))


def _samples(collector) -> dict[str, list[tuple[dict, float]]]:
    registry = CollectorRegistry()
    registry.register(collector)
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_a_family_has_one_series_per_label_values_sorted():
    registry = CollectorRegistry()
    a, b = Histogram((1,)), Histogram((1,))
    a.observe(2)
    b.observe(0.5)

    class One:
        def collect(self):
            yield histogram_family("x_seconds", "doc", {("b",): b, ("a",): a}, labels=["k"])

    registry.register(One())
    text = generate_latest(registry).decode()
    assert 'x_seconds_bucket{k="a",le="1"} 0.0' in text and 'x_seconds_bucket{k="a",le="+Inf"} 1.0' in text
    assert text.index('k="a"') < text.index('k="b"')
    assert 'x_seconds_count{k="b"} 1.0' in text and 'x_seconds_sum{k="b"} 0.5' in text


def test_the_scheduler_exports_its_histograms_under_the_same_names_and_buckets():
    stats = SchedulerStats()
    stats.decision_latency.observe(0.003)
    stats.waited("vision", 2, 3.0)
    samples = _samples(SchedulerCollector(stats, QueueSnapshot))
    les = [s[0]["le"] for s in samples["gpuaware_scheduler_queue_wait_seconds_bucket"]]
    assert les == ["0.1", "0.5", "1", "5", "15", "30", "60", "120", "300", "600", "1800", "3600", "7200", "+Inf"]
    assert samples["gpuaware_scheduler_queue_wait_seconds_bucket"][3] == (
        {"tenant": "vision", "priority": "high", "le": "5"}, 1.0)
    for name in ("decision", "pass", "bind"):
        les = [s[0]["le"] for s in samples[f"gpuaware_scheduler_{name}_latency_seconds_bucket"]]
        assert les == ["0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0",
                       "2.5", "+Inf"]
    assert samples["gpuaware_scheduler_decision_latency_seconds_count"] == [({}, 1.0)]


def test_the_stream_exports_its_histogram_under_the_same_name_and_buckets():
    stats = StreamStats()
    for v in (0.05, 0.3, 100.0):
        stats.observe_latency(v)
    samples = _samples(StreamCollector(stats, list, dict))
    buckets = samples["gpuaware_stream_sample_to_state_seconds_bucket"]
    assert [(s[0]["le"], s[1]) for s in buckets] == [
        ("0.05", 1.0), ("0.1", 1.0), ("0.25", 1.0), ("0.5", 2.0), ("1.0", 2.0), ("2.0", 2.0), ("5.0", 2.0),
        ("10.0", 2.0), ("30.0", 2.0), ("+Inf", 3.0)]
    assert samples["gpuaware_stream_sample_to_state_seconds_sum"] == [({}, pytest.approx(100.35))]
