"""Fuzzing what other parties write (issue 17, item 14): GPUQueue objects as the scheduler's informer hands
them over, Kafka headers and traceparent values as the stream and the scheduler's feed read them, and pod
names that become Prometheus label values. Bad input gets a clear error (or is ignored with one); nothing
else is raised, and label values round-trip through the text exposition format."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuaware.agent.collectors.sim import Scenario, SimCluster
from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentCollector, AgentStats, render
from gpuaware.agent.podresources import PodRef
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract.identity import NODE_TOKEN_HEADER, node_token
from gpuaware.plumbing import observability
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.queues import Queue, QueueSpecError
from gpuaware.stream.identity import IdentityRejected, NodeVerifier
from tests.support import FUZZ, json_values, printable_text

header_values = st.one_of(st.none(), st.binary(max_size=80), st.text(max_size=40).map(str.encode))
headers = st.lists(st.tuples(st.one_of(st.sampled_from(["traceparent", "tracestate", "baggage", NODE_TOKEN_HEADER]),
                                       printable_text), header_values), max_size=6)


@FUZZ
@given(st.dictionaries(st.sampled_from(["tenant", "namespaces", "weight", "quota", "borrowing", "priorityClasses"]),
                       json_values, max_size=6), json_values)
def test_any_gpuqueue_object_is_read_or_ignored_with_its_name(spec, metadata_extra):
    obj = {"metadata": {"name": "q", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": spec}
    if isinstance(metadata_extra, dict):
        obj["metadata"].update({k: v for k, v in metadata_extra.items() if k not in ("name",)})
    try:
        Queue.of(obj)
    except QueueSpecError as exc:
        assert "GPUQueue 'q'" in str(exc)
    cache = ClusterCache()
    cache.queue_event("ADDED", obj)  # never raises: a bad queue is logged and left out
    cache.sync_queues([obj, {"metadata": {"name": "ok"}, "spec": {"namespaces": ["a"]}}])
    assert "ok" in cache.tenancy.queues


@FUZZ
@given(headers)
def test_any_kafka_headers_give_a_trace_context_and_a_node_verdict_never_a_crash(hs):
    hs = [(k, v) for k, v in hs]
    observability.extract_context(hs)
    node_token(hs)
    StateView().learn(object(), hs)  # unknown records are ignored, headers or not

    def review(token: str):
        return None

    async def check():
        with contextlib.suppress(IdentityRejected):
            await NodeVerifier(review).check("n", hs)

    asyncio.run(check())


@FUZZ
@given(st.one_of(st.text(max_size=80), st.from_regex(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", fullmatch=True)))
def test_any_traceparent_value_is_parsed_or_ignored(value):
    from opentelemetry import trace

    ctx = observability.extract_context([("traceparent", value.encode())])
    span = trace.get_current_span(ctx).get_span_context()
    if span.is_valid:  # only a well-formed, non-zero W3C traceparent becomes a parent
        assert value.startswith("00-") and len(value) == 55


@pytest.fixture(scope="module")
def one_gpu_core() -> AgentCore:
    scenario = Scenario(name="fuzz", seed=3, duration_s=60, nodes=1, gpus_per_node=1, models=["H100"])
    (collector,) = SimCluster(scenario).collectors()
    core = AgentCore(collector, SamplingPolicy())
    core.tick(1.0)
    return core


class OnePod:
    """PodResources naming one pod on every GPU (a dedicated GPU: its series carry the pod's labels)."""

    def __init__(self, ref: PodRef):
        self.ref = ref

    def pods(self, uuid: str) -> list[PodRef]:
        return [self.ref]

    def uid_of_pid(self, pid: int) -> str | None:
        return None


@FUZZ
@given(st.text(max_size=60), st.text(max_size=60), st.text(max_size=60))
def test_pod_names_of_any_text_are_exported_as_label_values_that_round_trip(one_gpu_core, pod, namespace, container):
    registry = CollectorRegistry()
    registry.register(AgentCollector([one_gpu_core], AgentStats(), OnePod(PodRef(pod, namespace, container))))
    text = render(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (sample,) = families["DCGM_FI_DEV_GPU_UTIL"].samples
    # Empty labels are left out, as dcgm-exporter does; every other text comes back as it went in.
    expected = {k: v for k, v in (("pod", pod), ("namespace", namespace), ("container", container)) if v}
    assert {k: v for k, v in sample.labels.items() if k in ("pod", "namespace", "container")} == expected
