"""Logging, tracing and metrics setup shared by every component, and trace propagation over Kafka.

One call, ``setup(component, ...)``, at process start. Tracing is always on in-process (so a
span context exists to propagate), and exported only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set: then spans and metrics go over OTLP/HTTP. A sample's trace context travels in the Kafka
record headers (W3C ``traceparent``/``tracestate``), so one trace follows it from the agent's
publish through the stream to the scheduler's decision.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Literal

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

LogFormat = Literal["json", "console"]
KafkaHeaders = list[tuple[str, bytes]]

_RESERVED = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the active trace id so logs join traces."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "component": self.component,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            out["trace_id"] = f"{span.trace_id:032x}"
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(component: str, level: str = "info", fmt: LogFormat = "console") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(component))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)-7s {component} %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def setup(
    component: str,
    *,
    log_level: str = "info",
    log_format: LogFormat = "console",
    span_exporter: SpanExporter | None = None,
) -> TracerProvider:
    """Configure logging, the tracer provider and (with an OTLP endpoint) the meter provider.

    ``span_exporter`` overrides the OTLP exporter, e.g. an in-memory one in tests.
    """
    configure_logging(component, log_level, log_format)
    resource = Resource.create({"service.name": f"gpuaware-{component}", "service.namespace": "gpuaware"})
    provider = TracerProvider(resource=resource)
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if span_exporter is None and endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter()
    if span_exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
    _set_tracer_provider(provider)
    if endpoint:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))
    return provider


def _set_tracer_provider(provider: TracerProvider) -> None:
    # The API allows one global provider per process; tests and `gpuaware up` call setup() more
    # than once, so later calls replace it rather than being silently ignored.
    trace._TRACER_PROVIDER_SET_ONCE = trace.Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    trace.set_tracer_provider(provider)


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


# --------------------------------------------------------------------------- Kafka headers


class _HeaderSetter(Setter[KafkaHeaders]):
    def set(self, carrier: KafkaHeaders, key: str, value: str) -> None:
        carrier[:] = [(k, v) for k, v in carrier if k != key]
        carrier.append((key, value.encode()))


class _HeaderGetter(Getter[Sequence[tuple[str, bytes]]]):
    def get(self, carrier: Sequence[tuple[str, bytes]], key: str) -> list[str] | None:
        found = [v.decode(errors="replace") for k, v in carrier if k == key and v is not None]
        return found or None

    def keys(self, carrier: Sequence[tuple[str, bytes]]) -> list[str]:
        return [k for k, _ in carrier]


_SETTER = _HeaderSetter()
_GETTER = _HeaderGetter()


def inject_headers(headers: Iterable[tuple[str, bytes]] = ()) -> KafkaHeaders:
    """Kafka record headers carrying the current trace context (plus any given)."""
    carrier: KafkaHeaders = list(headers)
    propagate.inject(carrier, setter=_SETTER)
    return carrier


def extract_context(headers: Sequence[tuple[str, bytes]] | None) -> otel_context.Context:
    """The trace context a producer put in a record's headers (an empty context if none)."""
    return propagate.extract(list(headers or ()), getter=_GETTER)
