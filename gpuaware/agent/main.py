"""Assemble and run the agent from configuration: collectors, runtime, /metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gpuaware.agent.collectors.base import Collector
from gpuaware.agent.collectors.sim import SimCluster, SimCollector, load_scenario
from gpuaware.agent.cordons import CordonWatcher
from gpuaware.agent.exporter import AgentCollector, serve
from gpuaware.agent.identity import NodeToken
from gpuaware.agent.pod_uids import PodUids
from gpuaware.agent.podresources import PodAttribution, PodResourcesWatcher
from gpuaware.agent.resource_slices import publish_until_done
from gpuaware.agent.runtime import AgentRuntime
from gpuaware.agent.sampling import SamplingPolicy, load_policy
from gpuaware.agent.settings import AgentSettings
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.plumbing.signals import stop_on_signals

if TYPE_CHECKING:
    from gpuaware.agent.otlp_metrics import GpuMetricsOtlp

log = logging.getLogger(__name__)


def node_name(settings: AgentSettings) -> str:
    return settings.node_name or os.environ.get("NODE_NAME") or socket.gethostname()


def build_collectors(settings: AgentSettings) -> list[Collector]:
    if settings.collector == "nvml":
        from gpuaware.agent.collectors.capper_client import CapperClient
        from gpuaware.agent.collectors.nvml import NvmlCollector

        capper = CapperClient(settings.power_capper_socket) if settings.power_capper_socket else None
        return [NvmlCollector(node_name(settings), capper=capper)]
    scenario = load_scenario(settings.scenario)
    updates = {k: v for k, v in (("nodes", settings.sim_nodes), ("gpus_per_node", settings.sim_gpus_per_node))
               if v is not None}
    if updates:
        scenario = scenario.model_validate({**scenario.model_dump(), **updates})
    return list(SimCluster(scenario).collectors())


def metrics_collector(runtime: AgentRuntime, pods: PodAttribution | None, s: AgentSettings) -> AgentCollector:
    """What /metrics renders: its series keep ``metrics_labels_on_page`` labels at most, so that with what the
    scrape adds they stay within ``metrics_label_budget`` where they are stored."""
    return AgentCollector(runtime.cores, runtime.stats, pods, s.metrics_schema, s.dcgm_exporter == "beside",
                          s.metrics_labels_on_page, s.metrics_pod_labels)


def serve_metrics(runtime: AgentRuntime, host: str, port: int, pods: PodAttribution | None = None,
                  settings: AgentSettings | None = None) -> None:
    if port:
        s = settings or AgentSettings()
        registry = CollectorRegistry()
        registry.register(metrics_collector(runtime, pods, s))
        serve(registry, host, port)
        log.info("serving /metrics on %s:%d (schema %s, DCGM families %s)", host, port, s.metrics_schema,
                 "as gpuaware_dcgm_*" if s.dcgm_exporter == "beside" else "as DCGM_*")


def export_otlp_metrics(runtime: AgentRuntime, settings: AgentSettings,
                        pods: PodAttribution | None = None) -> GpuMetricsOtlp | None:
    """``agent.otlp_metrics_endpoint``: the GPU metrics over OTLP/HTTP too (off when unset), with the pods that
    hold each GPU as /metrics has them."""
    if not settings.otlp_metrics_endpoint:
        return None
    from gpuaware.agent import otlp_metrics

    return otlp_metrics.start(runtime.cores, settings.otlp_metrics_endpoint, settings.otlp_metrics_interval_s,
                              settings.metrics_schema, tls=otlp_metrics.Tls.of(settings), pods=pods)


def follow_pod_uids(settings: AgentSettings, pods: PodResourcesWatcher, attribution: PodAttribution,
                    api=None) -> PodUids | None:
    """The pod informer (``agent.pod_uids``, or pod labels in ``agent.metrics_pod_labels``), on the cordon watcher's
    ``api`` when there is one; only for the kubelet's PodResources (the simulator knows its pods' UIDs)."""
    if not (settings.pod_uids or settings.metrics_pod_labels) or attribution is not pods:
        return None
    return PodUids.from_settings(pods, node_name(settings), settings.api_server, api)


def publish_slices(settings: AgentSettings, runtime: AgentRuntime, stop: asyncio.Event) -> asyncio.Task | None:
    """``agent.resource_slices``: the node's GPUs as DRA ResourceSlices, in the background (docs/dra.md)."""
    if not settings.resource_slices:
        return None
    from kubernetes.config import ConfigException

    from gpuaware.plumbing.kube.api import connect
    from gpuaware.plumbing.kube.resource_slices import SlicePublisher

    try:
        api = connect(settings.api_server, pool_size=2)
    except ConfigException as exc:
        raise ValueError(f"agent.resource_slices: no Kubernetes API to publish to ({exc}); set agent.api_server "
                         "or run the agent in a pod") from None
    return asyncio.create_task(publish_until_done(SlicePublisher(api), runtime.cores, stop,
                                                  settings.resource_slices_retry_s,
                                                  settings.resource_slices_shareable))


async def run_agent(settings: AgentSettings, kafka: KafkaSettings, metrics_host: str, metrics_port: int,
                    duration_s: float | None, stop: asyncio.Event) -> AgentRuntime:
    policy = load_policy(settings.policy_path) if settings.policy_path else SamplingPolicy()
    collectors = build_collectors(settings)
    Path(settings.spool_dir).mkdir(parents=True, exist_ok=True)
    runtime = AgentRuntime(collectors, kafka, policy, settings.spool_dir, settings.policy_path,
                           spool_max_bytes=settings.spool_max_mib * 2**20)
    if settings.node_token_path:
        runtime.publisher.identity = NodeToken(settings.node_token_path).headers
    runtime.cordons = CordonWatcher.from_settings(runtime.cores, runtime.stats, settings.api_server,
                                                  settings.cordon_poll_s)
    pods = PodResourcesWatcher(settings.pod_resources_socket).start()
    if pods.available:
        log.info("mapping GPUs to pods through %s", settings.pod_resources_socket)
        if runtime.cordons is not None:
            runtime.cordons.pods = pods
    # The simulator is its own kubelet: pods on the GPUs its scenario marks shared.
    sims = {c.cluster for c in collectors if isinstance(c, SimCollector)}
    attribution: PodAttribution = sims.pop().attribution() if sims else pods
    uids = follow_pod_uids(settings, pods, attribution, runtime.cordons.api if runtime.cordons else None)
    slices = publish_slices(settings, runtime, stop)
    serve_metrics(runtime, metrics_host, metrics_port, attribution, settings)
    otlp = export_otlp_metrics(runtime, settings, attribution)
    log.info("agent running: %d node(s), %d GPU(s), collector %s", len(runtime.cores),
             sum(len(c.devices) for c in runtime.cores), settings.collector)
    try:
        await runtime.run(stop, duration_s)
    finally:
        if otlp:
            otlp.shutdown()  # exports once more, then stops the reader's thread
        if slices:
            slices.cancel()
        if uids:
            uids.stop()
        pods.stop()
        for c in collectors:
            c.close()
    return runtime


def serve_agent(settings: AgentSettings, kafka: KafkaSettings, metrics_host: str, metrics_port: int,
                duration_s: float | None) -> AgentRuntime:
    """`gpuaware agent`: run the agent until ``duration_s`` passes or SIGINT/SIGTERM arrives."""

    async def main() -> AgentRuntime:
        return await run_agent(settings, kafka, metrics_host, metrics_port, duration_s, stop_on_signals())

    return asyncio.run(main())
