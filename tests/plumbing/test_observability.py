"""Trace context crosses Kafka in record headers; logs carry the trace id."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuaware.contract import events, topics
from gpuaware.plumbing import kafka_admin as admin
from gpuaware.plumbing import observability


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = observability.setup("test", span_exporter=exporter)
    yield exporter
    provider.shutdown()


def test_headers_carry_the_w3c_trace_context(spans):
    tracer = observability.tracer("t")
    with tracer.start_as_current_span("publish") as span:
        headers = observability.inject_headers([("source", b"agent")])
    assert headers[0] == ("source", b"agent")
    traceparent = dict(headers)["traceparent"].decode()
    assert traceparent.split("-")[1] == f"{span.get_span_context().trace_id:032x}"
    ctx = observability.extract_context(headers)
    assert trace.get_current_span(ctx).get_span_context().span_id == span.get_span_context().span_id
    # No headers, or foreign ones, give an empty context rather than an error.
    assert not trace.get_current_span(observability.extract_context(None)).get_span_context().is_valid
    assert not trace.get_current_span(
        observability.extract_context([("traceparent", b"\xff\xfegarbage")])).get_span_context().is_valid


@pytest.mark.broker
async def test_one_trace_follows_a_record_through_the_broker(kafka_settings, spans, unique):
    topic = f"test.trace.{unique}"
    await admin.ensure_topics(kafka_settings, [topics.TopicSpec(topic, 1, "delete", None, "k", "test")])
    tracer = observability.tracer("pipeline")
    producer = AIOKafkaProducer(**kafka_settings.producer_kwargs())
    await producer.start()
    try:
        with tracer.start_as_current_span("agent.publish"):
            record = events.GpuEvent("e", 1, "n", "GPU-1", events.EventKind.ANOMALY, events.Severity.INFO)
            await producer.send_and_wait(topic, events.encode(record), headers=observability.inject_headers())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, **kafka_settings.consumer_kwargs(f"g-{unique}"))
    await consumer.start()
    try:
        async with asyncio.timeout(20):
            msg = await consumer.getone()
    finally:
        await consumer.stop()
    with tracer.start_as_current_span("scheduler.decide", context=observability.extract_context(msg.headers)):
        pass
    trace.get_tracer_provider().force_flush()
    by_name = {s.name: s for s in spans.get_finished_spans()}
    publish, decide = by_name["agent.publish"], by_name["scheduler.decide"]
    assert decide.context.trace_id == publish.context.trace_id
    assert decide.parent.span_id == publish.context.span_id


def test_json_logs_carry_component_fields_and_trace_id(spans, capsys):
    observability.configure_logging("agent", "info", "json")
    with observability.tracer("t").start_as_current_span("work") as span:
        logging.getLogger("agent.sampler").info("interval changed", extra={"gpu": "GPU-1", "interval_s": 5.0})
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["component"] == "agent" and line["msg"] == "interval changed"
    assert line["gpu"] == "GPU-1" and line["interval_s"] == 5.0
    assert line["trace_id"] == f"{span.get_span_context().trace_id:032x}"
