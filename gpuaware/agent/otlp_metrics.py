"""The agent's GPU metrics over OTLP/HTTP (``agent.otlp_metrics_endpoint``), beside ``/metrics``; off by default.

The OpenTelemetry SDK's MeterProvider with a PeriodicExportingMetricReader and the OTLP/HTTP metric exporter.
Every instrument is observable: its callback reads the values ``/metrics`` reads, through
:meth:`gpuaware.agent.dcgm.DcgmFamilies.value` (the newest watch read or the last full sample of each GPU),
so there is no second sampling path and a flush reports what a scrape at the same moment shows.

Names follow the OpenTelemetry semantic conventions for hardware where they define one (docs/hardware/gpu.md,
common.md and temperature.md of open-telemetry/semantic-conventions, main after v1.44.0 at commit 00c5325a;
status Development): the GPU's ``hw.*`` series carry ``hw.id`` (the GPU UUID), ``hw.type`` ``gpu``,
``hw.name``, ``hw.vendor``, ``hw.model``, ``hw.driver_version`` and ``dcgm.field``, the DCGM field the value
comes from. A field without a convention keeps its DCGM name (as the configured schema writes it) as the
metric name, lower-cased as the SDK writes instrument names (``dcgm_fi_dev_sm_clock``), with the exact name in
``dcgm.field`` and the value ``/metrics`` gives it. Resource: ``service.name`` ``gpuaware-agent``,
``host.name`` and ``k8s.node.name`` (with several simulated nodes in one agent, ``k8s.node.name`` goes on
each point instead).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import requests
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from gpuaware.agent.core import AgentCore, GpuTrack
from gpuaware.agent.dcgm import ATTRS, DcgmFamilies, pod_usage
from gpuaware.agent.podresources import PodAttribution, PodRef
from gpuaware.agent.settings import AgentSettings, otlp_metrics_url
from gpuaware.contract.dcgm import FAMILIES, LEGACY, Schema, family_name

log = logging.getLogger(__name__)

SEMCONV = "open-telemetry/semantic-conventions docs/hardware (main after v1.44.0, commit 00c5325a)"
MIB = float(2**20)


@dataclass(frozen=True)
class Convention:
    """One DCGM field exported under a semantic-conventions name."""

    name: str
    kind: str  # "gauge", "counter" or "updown", the convention's instrument type
    unit: str  # UCUM, as the convention gives it
    scale: float  # the agent's reading (legacy DCGM unit) * scale = the convention's unit
    attributes: dict[str, str] = field(default_factory=dict)


# DCGM field -> its convention. gpu.md: hw.gpu.utilization (Gauge, 1, hw.gpu.task general/encoder/decoder),
# hw.gpu.memory.usage (UpDownCounter, By), hw.errors (Counter, {error}, error.type corrected/uncorrected);
# common.md: hw.power (Gauge, W), hw.energy (Counter, J), hw.type required; temperature.md: hw.temperature
# (Gauge, Cel) of a sensor (hw.type temperature, hw.parent the GPU). hw.errors takes the volatile ECC counts only:
# the aggregate ones count the same errors again over the GPU's life and keep their DCGM names.
CONVENTIONS: dict[str, Convention] = {
    "DCGM_FI_DEV_GPU_UTIL": Convention("hw.gpu.utilization", "gauge", "1", 0.01, {"hw.gpu.task": "general"}),
    "DCGM_FI_DEV_ENC_UTIL": Convention("hw.gpu.utilization", "gauge", "1", 0.01, {"hw.gpu.task": "encoder"}),
    "DCGM_FI_DEV_DEC_UTIL": Convention("hw.gpu.utilization", "gauge", "1", 0.01, {"hw.gpu.task": "decoder"}),
    "DCGM_FI_DEV_FB_USED": Convention("hw.gpu.memory.usage", "updown", "By", MIB),
    "DCGM_FI_DEV_POWER_USAGE": Convention("hw.power", "gauge", "W", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": Convention("hw.energy", "counter", "J", 1e-3),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": Convention("hw.errors", "counter", "{error}", 1.0, {"error.type": "corrected"}),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": Convention("hw.errors", "counter", "{error}", 1.0,
                                                {"error.type": "uncorrected"}),
    "DCGM_FI_DEV_GPU_TEMP": Convention("hw.temperature", "gauge", "Cel", 1.0, {"sensor": "gpu"}),
    "DCGM_FI_DEV_MEMORY_TEMP": Convention("hw.temperature", "gauge", "Cel", 1.0, {"sensor": "memory"}),
}
# The DCGM help texts' units in UCUM, for the fields that keep their DCGM name.
UCUM = {"%": "%", "ratio 0-1": "1", "MiB": "MiBy", "MHz": "MHz", "Hz": "Hz", "C": "Cel", "W": "W", "mJ": "mJ",
        "J": "J", "KiB": "KiBy", "bytes/s": "By/s", "": "1"}


# A GPU several pods share: each pod's part, as /metrics' per-pod DCGM_FI_DEV_GPU_UTIL / _FB_USED series, under
# names of their own: on the hw.gpu.* names they would add to the device's own point wherever a backend sums by
# hw.id. name -> (unit, per-process reading, scale).
PER_POD = {"gpuaware.pod.gpu.utilization": ("1", "sm_util", 0.01),
           "gpuaware.pod.gpu.memory.usage": ("By", "used_mib", MIB)}


def pod_attributes(pod: PodRef) -> dict[str, str]:
    """The OpenTelemetry k8s.* attributes of a pod (semantic-conventions registry: k8s.pod.name, ...)."""
    attrs = {"k8s.pod.name": pod.name, "k8s.namespace.name": pod.namespace, "k8s.container.name": pod.container,
             "k8s.pod.uid": pod.uid}
    return {k: v for k, v in attrs.items() if v}


class GpuMetricsOtlp:
    """Observable instruments over the agent's cores, on a MeterProvider of their own (not the global one)."""

    def __init__(self, cores: Sequence[AgentCore], reader: MetricReader, schema: Schema = LEGACY,
                 host_name: str | None = None, pods: PodAttribution | None = None):
        self.cores = list(cores)
        self.schema = schema
        self.pods = pods
        nodes = sorted({c.node for c in self.cores})
        attrs = {"service.name": "gpuaware-agent", "service.namespace": "gpuaware",
                 "host.name": host_name or socket.gethostname()}
        self.node_on_points = len(nodes) > 1
        if len(nodes) == 1:
            attrs["k8s.node.name"] = nodes[0]
        self.provider = MeterProvider(resource=Resource.create(attrs), metric_readers=[reader])
        meter = self.provider.get_meter("gpuaware.agent.gpu")
        by_name: dict[str, list[str]] = {}
        for dcgm_name, conv in CONVENTIONS.items():
            by_name.setdefault(conv.name, []).append(dcgm_name)
        for name, fields in by_name.items():
            conv = CONVENTIONS[fields[0]]
            self._instrument(meter, conv.kind, name, conv.unit, self._conventional(fields))
        self._instrument(meter, "updown", "hw.gpu.memory.limit", "By", self._memory(limit=True))
        self._instrument(meter, "gauge", "hw.gpu.memory.utilization", "1", self._memory(limit=False))
        for name, (unit, attr, scale) in PER_POD.items():
            self._instrument(meter, "gauge", name, unit, self._per_pod(attr, scale))
        for dcgm_name in ATTRS:
            if dcgm_name not in CONVENTIONS:
                fam = FAMILIES[dcgm_name]
                unit = fam.base_unit if schema != LEGACY and fam.base_unit else fam.unit
                self._instrument(meter, "counter" if fam.type == "counter" else "gauge",
                                 family_name(dcgm_name, False, schema), UCUM.get(unit, "1"), self._dcgm(dcgm_name))

    @staticmethod
    def _instrument(meter, kind: str, name: str, unit: str, callback: Callable) -> None:
        make = {"gauge": meter.create_observable_gauge, "counter": meter.create_observable_counter,
                "updown": meter.create_observable_up_down_counter}[kind]
        make(name, callbacks=[callback], unit=unit)

    def _gpus(self) -> Iterable[tuple[AgentCore, GpuTrack, dict[str, str]]]:
        for core in self.cores:
            for track in core.tracks:
                d = track.device
                attrs = {"hw.id": d.uuid, "hw.type": "gpu", "hw.name": f"gpu{d.index}", "hw.vendor": "NVIDIA",
                         "hw.model": d.model, "hw.driver_version": d.driver_version}
                if self.node_on_points:
                    attrs["k8s.node.name"] = core.node
                pods = self.pods.pods(d.uuid) if self.pods is not None else []
                if len(pods) == 1:  # the GPU's one holder, as /metrics labels it; a shared GPU: per pod below
                    attrs.update(pod_attributes(pods[0]))
                yield core, track, attrs

    def _conventional(self, fields: list[str]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            out = []
            for _core, track, attrs in self._gpus():
                for dcgm_name in fields:
                    conv = CONVENTIONS[dcgm_name]
                    v = DcgmFamilies.value(track, ATTRS[dcgm_name])
                    if v is None:
                        continue
                    point = {**attrs, **conv.attributes, "dcgm.field": dcgm_name}
                    if conv.name == "hw.temperature":  # a sensor on the GPU (temperature.md)
                        sensor = point.pop("sensor")
                        point.update({"hw.id": f"{attrs['hw.id']}/{sensor}", "hw.type": "temperature",
                                      "hw.parent": attrs["hw.id"], "hw.name": f"{attrs['hw.name']} {sensor}"})
                    out.append(Observation(v * conv.scale, point))
            return out
        return observe

    def _memory(self, limit: bool) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            out = []
            for _core, track, attrs in self._gpus():
                total = track.device.fb_total_mib
                if limit:
                    out.append(Observation(total * MIB, {**attrs, "dcgm.field": "DCGM_FI_DEV_FB_TOTAL"}))
                    continue
                used = DcgmFamilies.value(track, "fb_used_mib")
                if used is not None and total:
                    out.append(Observation(used / total, {**attrs, "dcgm.field": "DCGM_FI_DEV_FB_USED"}))
            return out
        return observe

    def _per_pod(self, attr: str, scale: float) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            if self.pods is None:
                return []
            out = []
            for _core, track, attrs in self._gpus():
                holders = self.pods.pods(track.device.uuid)
                if len(holders) > 1:
                    out += [Observation(v * scale, {**attrs, **pod_attributes(pod)})
                            for pod, v in pod_usage(track, holders, self.pods, attr)]
            return out
        return observe

    def _dcgm(self, dcgm_name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        scale = FAMILIES[dcgm_name].scale(self.schema)

        def observe(_: CallbackOptions) -> Iterable[Observation]:
            out = []
            for _core, track, attrs in self._gpus():
                v = DcgmFamilies.value(track, ATTRS[dcgm_name])
                if v is not None:
                    out.append(Observation(v * scale, {**attrs, "dcgm.field": dcgm_name}))
            return out
        return observe

    def force_flush(self, timeout_ms: float = 10_000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        self.provider.shutdown()


@dataclass(frozen=True)
class Tls:
    """The PEM files of an https:// receiver: ``ca`` verifies it (None: the system's CAs); ``cert`` and ``key``
    answer a receiver that asks for a client certificate."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @classmethod
    def of(cls, settings: AgentSettings) -> Tls:
        return cls(settings.otlp_metrics_certificate, settings.otlp_metrics_client_certificate,
                   settings.otlp_metrics_client_key)

    def check(self) -> None:
        """A file that cannot be read fails the start, naming the setting (not an SSL error at each export)."""
        for setting, path in (("otlp_metrics_certificate", self.ca), ("otlp_metrics_client_certificate", self.cert),
                              ("otlp_metrics_client_key", self.key)):
            if path is not None and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise ValueError(f"agent.{setting}: {path!r} is not a readable file")


class _CaSession(requests.Session):
    """A requests Session whose own CA bundle wins over ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE``: requests lets
    those override a session's ``verify`` on every request (its ``merge_environment_settings``), so an image that
    sets them (many Python base images with a corporate CA do) would ignore ``agent.otlp_metrics_certificate``."""

    def merge_environment_settings(self, url, proxies, stream, verify, cert):  # type: ignore[no-untyped-def]
        merged = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None:  # the request did not choose: the session's CA, not the environment's
            merged["verify"] = self.verify
        return merged


def start(cores: Sequence[AgentCore], endpoint: str, interval_s: float, schema: Schema = LEGACY,
          exporter: MetricExporter | None = None, host_name: str | None = None, tls: Tls = Tls(),
          pods: PodAttribution | None = None) -> GpuMetricsOtlp:
    """Export the cores' GPU metrics to ``endpoint`` every ``interval_s`` (``exporter`` replaces the OTLP one).
    Headers (an API key) come from the SDK's ``OTEL_EXPORTER_OTLP_METRICS_HEADERS``, which it reads itself."""
    url = otlp_metrics_url(endpoint)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        tls.check()
        exporter = OTLPMetricExporter(endpoint=url, timeout=10, certificate_file=tls.ca,
                                      client_certificate_file=tls.cert, client_key_file=tls.key,
                                      session=_CaSession() if tls.ca else None)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=interval_s * 1000)
    otlp = GpuMetricsOtlp(cores, reader, schema, host_name, pods)
    log.info("exporting GPU metrics over OTLP/HTTP to %s every %gs (names: %s)", url, interval_s, SEMCONV)
    return otlp
