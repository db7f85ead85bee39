"""The dashboards: fleet, GPU health, one GPU, forecasts and capacity, pipeline health, scheduler and tenants.

Queries use the dcgm-exporter names the agent exports (existing DCGM dashboards keep working)
and the ``gpuaware_*`` metrics of the agent, the stream workers and the scheduler. ``$cluster``
matches the ``cluster`` label the PodMonitors set (deploy/base/monitoring); targets without it
match the "All" value. They are written once, for the legacy schema without prefix;
:func:`variant` rewrites them for the others (``gpuaware.contract.dcgm.translate``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from gpuaware.contract.dcgm import LEGACY, Schema, translate
from gpuaware.dashboards.model import Annotation, Dashboard, Link, Panel, Target, Variable

# Whole GPUs only: not a MIG instance's series (GPU_I_ID) nor a pod's share of a shared GPU (pod_uid).
GPU = 'cluster=~"$cluster", Hostname=~"$node", modelName=~"$model", GPU_I_ID="", pod_uid=""'
SCHED = 'cluster=~"$cluster"'
CL = SCHED  # the stream workers' and agents' own families
ONE_GPU = 'cluster=~"$cluster", Hostname=~"$node", gpu=~"$gpu", GPU_I_ID="", pod_uid=""'
TENANT = 'cluster=~"$cluster", tenant=~"$tenant"'
EVENTS = f"gpuaware_agent_events_total{{{GPU}}}"

CLUSTER = Variable("cluster", "label_values(up, cluster)", "Cluster")
VARIABLES = [
    CLUSTER,
    Variable("node", 'label_values(DCGM_FI_DEV_GPU_UTIL{cluster=~"$cluster"}, Hostname)', "Node"),
    Variable("model", 'label_values(DCGM_FI_DEV_GPU_UTIL{cluster=~"$cluster"}, modelName)', "GPU model"),
]
GPU_VARIABLES = [
    CLUSTER,
    Variable("node", 'label_values(DCGM_FI_DEV_GPU_UTIL{cluster=~"$cluster"}, Hostname)', "Node"),
    Variable("gpu", 'label_values(DCGM_FI_DEV_GPU_UTIL{cluster=~"$cluster", Hostname=~"$node"}, gpu)', "GPU"),
]
# Drill-down: a series of one GPU opens the GPU dashboard on it; an aggregate opens it on the same selection.
TO_GPU = Link("GPU ${__field.labels.Hostname}/${__field.labels.gpu}",
              "/d/gpuaware-gpu/gpuaware-gpu?var-cluster=${__field.labels.cluster}&var-node=${__field.labels.Hostname}"
              "&var-gpu=${__field.labels.gpu}&${__url_time_range}")
TO_GPUS = Link("GPUs of this selection", "/d/gpuaware-gpu/gpuaware-gpu?${__all_variables}&${__url_time_range}")
# Throttle reasons that are heat or power (0x4 software power cap, 0x8 hardware slowdown, 0x20/0x40 software and
# hardware thermal, 0x80 power brake), not idle (0x1), application clocks (0x2), sync boost (0x10) or display (0x100).
THROTTLE = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"


def heat_or_power(selector: str) -> str:
    r = f"{THROTTLE}{{{selector}}}"
    return f"((floor({r} / 4) % 4 > 0) or (floor({r} / 32) % 8 > 0))"


def drill(dashboard: Dashboard) -> Dashboard:
    """Every panel linked to the GPU dashboard: series of one GPU (their legend names it) to that GPU."""
    for panel in dashboard.panels:
        panel.links = [TO_GPU if all("{{gpu}}" in t.legend for t in panel.targets) else TO_GPUS]
    return dashboard
# The scheduler's decisions for a pod: its last decision per pod (leader only) is a series whose history in
# Prometheus is the pod's sequence of decisions; per-pod series link to the scheduler dashboard on that pod.
POD_DECISION = "gpuaware_scheduler_pod_decision_timestamp_seconds"
POD = 'cluster=~"$cluster", namespace=~"$namespace", pod=~"$pod"'
SCHEDULER_VARIABLES = [
    CLUSTER, Variable("tenant", "label_values(gpuaware_scheduler_tenant_gpus, tenant)", "Tenant"),
    Variable("namespace", f'label_values({POD_DECISION}{{cluster=~"$cluster"}}, namespace)', "Namespace"),
    Variable("pod", f'label_values({POD_DECISION}{{cluster=~"$cluster", namespace=~"$namespace"}}, pod)', "Pod"),
]
TO_POD = Link("Scheduler decisions for ${__field.labels.namespace}/${__field.labels.pod}",
              "/d/gpuaware-scheduler/gpuaware-scheduler?var-cluster=${__field.labels.cluster}"
              "&var-namespace=${__field.labels.namespace}&var-pod=${__field.labels.pod}&${__url_time_range}")


def fleet_overview() -> Dashboard:
    return drill(Dashboard("gpuaware-fleet", "gpuaware / Fleet overview",
                     "GPUs by model and node, how busy they are, and how much of what is allocated is used.", [
        Panel("GPUs by model", [Target(f"count by (modelName) (DCGM_FI_DEV_GPU_UTIL{{{GPU}}})", "{{modelName}}")],
              kind="bargauge", width=8),
        Panel("Mean GPU utilization", [Target(f"avg(DCGM_FI_DEV_GPU_UTIL{{{GPU}}})")], kind="stat", unit="percent",
              width=4, thresholds=[(None, "red"), (30, "orange"), (60, "green")]),
        Panel("Idle GPUs holding memory", [Target(
            f"count((DCGM_FI_DEV_GPU_UTIL{{{GPU}}} < 5) and (DCGM_FI_DEV_FB_USED{{{GPU}}} > 1024))")],
              kind="stat", width=4, description="Busy under 5% with more than 1 GiB allocated: reclaim candidates.",
              thresholds=[(None, "green"), (1, "orange"), (10, "red")]),
        Panel("GPU busy share of allocated time", [Target(
            f"avg(gpuaware_scheduler_allocated_busy_ratio{{{SCHED}}})")], kind="stat", unit="percentunit", width=4,
              min=0, max=1, thresholds=[(None, "red"), (0.4, "orange"), (0.7, "green")],
              description="Utilisation of the GPUs the scheduler has allocated, weighted by the share allocated."),
        Panel("Power draw", [Target(f"sum(DCGM_FI_DEV_POWER_USAGE{{{GPU}}})")], kind="stat", unit="watt", width=4),
        Panel("Energy in the range", [Target(
            f"sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{GPU}}}[$__range])) / 3.6e9")],
              kind="stat", unit="kwatth", width=4),
        Panel("Utilization heatmap", [Target(f"DCGM_FI_DEV_GPU_UTIL{{{GPU}}}", "{{Hostname}}/{{gpu}}")],
              kind="heatmap", unit="percent", width=24, height=10),
        Panel("Utilization by model", [Target(f"avg by (modelName) (DCGM_FI_DEV_GPU_UTIL{{{GPU}}})",
                                              "{{modelName}}")], unit="percent", min=0, max=100),
        Panel("Framebuffer used by model", [Target(
            f"sum by (modelName) (DCGM_FI_DEV_FB_USED{{{GPU}}}) * 1048576", "{{modelName}}")], unit="bytes"),
        Panel("Power by node", [Target(f"sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE{{{GPU}}})", "{{Hostname}}")],
              unit="watt"),
        Panel("Temperature (max per node)", [Target(f"max by (Hostname) (DCGM_FI_DEV_GPU_TEMP{{{GPU}}})",
                                                    "{{Hostname}}")], unit="celsius",
              thresholds=[(None, "green"), (80, "orange"), (87, "red")]),
    ], VARIABLES))


def gpu_health() -> Dashboard:
    return drill(Dashboard("gpuaware-health", "gpuaware / GPU health",
                     "Explainable health scores from the agents, and the error signals behind them.", [
        Panel("GPUs per health band", [Target(f"sum by (band) (gpuaware_gpu_health_band{{{GPU}}})", "{{band}}")],
              kind="bargauge", width=8),
        Panel("Lowest health score", [Target(f"min(gpuaware_gpu_health_score{{{GPU}}})")], kind="stat", width=4,
              thresholds=[(None, "red"), (50, "orange"), (80, "green")], min=0, max=100),
        Panel("Lost GPUs", [Target(f"sum(gpuaware_gpu_lost{{{GPU}}})")], kind="stat", width=4,
              thresholds=[(None, "green"), (1, "red")]),
        Panel("Edge events per minute", [Target(
            f"sum by (kind) (rate(gpuaware_agent_events_total{{{GPU}}}[5m])) * 60", "{{kind}}")], width=8),
        Panel("GPUs per verdict (docs/health.md)", [Target(
            f"sum by (verdict) (gpuaware_gpu_health_verdict{{{GPU}}})", "{{verdict}}")], kind="bargauge", width=8),
        Panel("Recommended actions (not none)", [Target(
            f'gpuaware_gpu_health_verdict{{{GPU}, action!="none"}}', "{{Hostname}}/{{gpu}} {{verdict}}: {{action}}")],
              kind="table", width=16),
        Panel("Health score per GPU (lowest 20)", [Target(
            f"bottomk(20, gpuaware_gpu_health_score{{{GPU}}})", "{{Hostname}}/{{gpu}}")], min=0, max=100,
              thresholds=[(None, "red"), (50, "orange"), (80, "green")], width=24),
        Panel("Health components below 100", [Target(
            f"gpuaware_gpu_health_component{{{GPU}}} < 100", "{{Hostname}}/{{gpu}} {{component}}")],
              min=0, max=100),
        Panel("Edge detector scores, highest 10", [Target(f"topk(10, gpuaware_gpu_anomaly_score{{{GPU}}})",
                                                          "{{Hostname}}/{{gpu}} {{detector}}")]),
        Panel("ECC errors (volatile)", [
            # by cluster too: the link to the GPU dashboard names the clicked series' cluster
            Target(f"sum by (cluster, Hostname, gpu) (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{GPU}}})",
                   "SBE {{Hostname}}/{{gpu}}"),
            Target(f"sum by (cluster, Hostname, gpu) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GPU}}})",
                   "DBE {{Hostname}}/{{gpu}}")]),
        Panel("Last XID", [Target(f"DCGM_FI_DEV_XID_ERRORS{{{GPU}}} > 0", "{{Hostname}}/{{gpu}}")]),
        Panel("Throttled GPUs (thermal or power)", [Target(
            f"count by (modelName) {heat_or_power(GPU)}", "{{modelName}}")],
              description="Throttle reasons 0x4, 0x8, 0x20, 0x40, 0x80 (power cap, slowdown, thermal, power brake); "
                          "not idle, application clocks or sync boost."),
        Panel("Temperature, hottest 10", [Target(f"topk(10, DCGM_FI_DEV_GPU_TEMP{{{GPU}}})",
                                                 "{{Hostname}}/{{gpu}}")], unit="celsius",
              thresholds=[(None, "green"), (80, "orange"), (87, "red")]),
        Panel("GPUs in remediation by step", [Target(
            f"max by (step) (gpuaware_scheduler_remediation_gpus{{{SCHED}}})", "{{step}}")], kind="bargauge",
              width=8, description="Cordoned and draining, waiting for the reset/reboot the node condition "
                                   "GPUMaintenanceRequired asks for, or validating (docs/health.md)."),
        Panel("Lemon nodes (5+ remediations in 7 days)", [Target(
            f"count(max by (node) (gpuaware_scheduler_lemon_node{{{SCHED}}}) == 1) or vector(0)", "lemon nodes")],
              kind="stat", width=8, description="The series exists only for a lemon node, so the count falls back "
                                                "to 0; alert GpuLemonNode names each one (docs/runbooks.md)."),
        Panel("MTTR and MTBI (p50 over 7 days)", [
            Target(f"histogram_quantile(0.5, sum by (le) (increase("
                   f"gpuaware_scheduler_remediation_mttr_seconds_bucket{{{SCHED}}}[7d])))", "MTTR"),
            Target(f"histogram_quantile(0.5, sum by (le) (increase("
                   f"gpuaware_scheduler_remediation_mtbi_seconds_bucket{{{SCHED}}}[7d])))", "MTBI")],
              kind="stat", unit="s", width=8,
              description="MTTR: a GPU's cordon to its validated return to service. MTBI: time between two "
                          "remediations on the same node."),
    ], VARIABLES, annotations=[Annotation(
        # An event counter is born at 1 (no increase to see): a series new in the last minute counts too.
        "Edge events", f"(sum by (Hostname, gpu, kind) (increase({EVENTS}[1m])) > 0) or (sum by (Hostname, gpu, kind) "
                       f"({EVENTS}) unless sum by (Hostname, gpu, kind) ({EVENTS} offset 1m))",
        "{{kind}} on {{Hostname}}/{{gpu}}")]))


def gpu_detail() -> Dashboard:
    """One GPU (NVIDIA's 12239 has ``$gpu``): where the fleet and health panels lead."""
    events = f"gpuaware_agent_events_total{{{ONE_GPU}}}"
    return Dashboard("gpuaware-gpu", "gpuaware / GPU",
                     "One GPU's load, memory, heat and power, health score and verdict, errors and events.", [
        Panel("Health score", [Target(f"gpuaware_gpu_health_score{{{ONE_GPU}}}", "{{Hostname}}/{{gpu}}")],
              min=0, max=100, thresholds=[(None, "red"), (50, "orange"), (80, "green")], width=8),
        Panel("Verdict and recommended action", [Target(
            f"gpuaware_gpu_health_verdict{{{ONE_GPU}}}", "{{Hostname}}/{{gpu}} {{verdict}}: {{action}}")],
              kind="table", width=16),
        Panel("Utilization", [Target(f"DCGM_FI_DEV_GPU_UTIL{{{ONE_GPU}}}", "{{Hostname}}/{{gpu}}")], unit="percent",
              min=0, max=100),
        Panel("Framebuffer used", [Target(f"DCGM_FI_DEV_FB_USED{{{ONE_GPU}}} * 1048576", "{{Hostname}}/{{gpu}}")],
              unit="bytes"),
        Panel("Temperature", [Target(f"DCGM_FI_DEV_GPU_TEMP{{{ONE_GPU}}}", "{{Hostname}}/{{gpu}}")], unit="celsius",
              thresholds=[(None, "green"), (80, "orange"), (87, "red")]),
        Panel("Power draw", [Target(f"DCGM_FI_DEV_POWER_USAGE{{{ONE_GPU}}}", "{{Hostname}}/{{gpu}}")], unit="watt"),
        Panel("Health components", [Target(f"gpuaware_gpu_health_component{{{ONE_GPU}}}",
                                           "{{Hostname}}/{{gpu}} {{component}}")], min=0, max=100),
        Panel("Throttled for heat or power", [Target(heat_or_power(ONE_GPU), "{{Hostname}}/{{gpu}}")],
              description="Throttle reasons 0x4, 0x8, 0x20, 0x40, 0x80 set (value: the reasons bitmask)."),
        Panel("XID errors by code (1 h)", [Target(
            f"sum by (Hostname, gpu, xid) (increase(gpuaware_agent_xid_errors_total{{{ONE_GPU}}}[1h]))",
            "{{Hostname}}/{{gpu}} XID {{xid}}")],
              description="13, 31 and 43 are the application's faults; alert GpuXidBurst leaves them out."),
        Panel("ECC errors (volatile)", [
            Target(f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{ONE_GPU}}}", "SBE {{Hostname}}/{{gpu}}"),
            Target(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{ONE_GPU}}}", "DBE {{Hostname}}/{{gpu}}")]),
        Panel("PCIe throughput", [
            Target(f"DCGM_FI_PROF_PCIE_TX_BYTES{{{ONE_GPU}}}", "TX {{Hostname}}/{{gpu}}"),
            Target(f"DCGM_FI_PROF_PCIE_RX_BYTES{{{ONE_GPU}}}", "RX {{Hostname}}/{{gpu}}")], unit="Bps",
              description="Bytes per second over the GPU's PCIe link, headers included."),
        Panel("Edge events per minute", [Target(
            f"sum by (Hostname, gpu, kind) (rate({events}[5m])) * 60", "{{Hostname}}/{{gpu}} {{kind}}")]),
        Panel("Sampling interval", [Target(f"gpuaware_agent_sampling_interval_seconds{{{ONE_GPU}}}",
                                           "{{Hostname}}/{{gpu}}")], unit="s"),
    ], GPU_VARIABLES)


def forecasts() -> Dashboard:
    # max by (cluster, model): for a moment after a rebalance two workers may both export a forecast.
    demand = 'max by (cluster, model) (gpuaware_cluster_demand_gpus{cluster=~"$cluster", horizon_s="%s", bound="%s"})'
    capacity = 'max by (cluster, model) (gpuaware_cluster_capacity_gpus{cluster=~"$cluster"})'
    return Dashboard("gpuaware-forecasts", "gpuaware / Forecasts and capacity",
                     "Per-model GPU demand forecast by the stream workers, with its 80% interval, against capacity.", [
        Panel("Demand forecast, 5 min ahead (busy GPUs)", [
            Target(demand % (300, "mean"), "{{cluster}} {{model}} forecast"),
            Target(demand % (300, "upper"), "{{cluster}} {{model}} upper 80%"),
            Target(demand % (300, "lower"), "{{cluster}} {{model}} lower 80%"),
            Target(capacity, "{{cluster}} {{model}} capacity")], width=24, height=10),
        Panel("Actual busy GPUs by model", [Target(
            'sum by (cluster, modelName) (DCGM_FI_DEV_GPU_UTIL{cluster=~"$cluster", GPU_I_ID="", pod_uid=""}) / 100',
            "{{cluster}} {{modelName}}")], width=12),
        Panel("Forecast headroom (capacity - upper bound, 15 min)", [Target(
            f"{capacity} - on (cluster, model) {demand % (900, 'upper')}", "{{cluster}} {{model}}")], width=12),
        Panel("Forecast error (MAE) per horizon", [Target(
            'avg by (cluster, metric, horizon_minutes) (gpuaware_stream_forecast_mae{cluster=~"$cluster"})',
            "{{cluster}} {{metric}} {{horizon_minutes}} min")], width=12),
        Panel("GPUs per workload class", [Target(
            'sum by (cluster, class) (gpuaware_stream_workload_class_gpus{cluster=~"$cluster"})',
            "{{cluster}} {{class}}")], kind="bargauge", width=12),
    ], [CLUSTER])


def pipeline_health() -> Dashboard:
    def rate(name: str) -> str:
        return f"rate({name}{{{CL}}}[5m])"

    latency = "gpuaware_stream_sample_to_state_seconds_bucket"
    return Dashboard("gpuaware-pipeline", "gpuaware / Pipeline health",
                     "Agents' sampling and cost, the Kafka path, and the stream workers.", [
        Panel("Samples/s (agents)", [Target(f"sum({rate('gpuaware_agent_samples_total')})")], kind="stat", width=6,
              unit="ops"),
        Panel("Bytes/s to Kafka (agents)", [Target(f"sum({rate('gpuaware_agent_bytes_sent_total')})")], kind="stat",
              width=6, unit="Bps"),
        Panel("Spooled records", [Target(f"sum(gpuaware_agent_spool_depth{{{CL}}})")], kind="stat", width=6,
              thresholds=[(None, "green"), (1, "orange"), (10000, "red")]),
        Panel("Dead-lettered records (1 h)", [Target(f"sum(increase(gpuaware_stream_dlq_total{{{CL}}}[1h]))")],
              kind="stat", width=6, thresholds=[(None, "green"), (1, "orange")]),
        Panel("Sampling interval per GPU", [Target(f"gpuaware_agent_sampling_interval_seconds{{{GPU}}}",
                                                   "{{Hostname}}/{{gpu}}")], unit="s"),
        Panel("Samples and watch reads per second", [
            Target(f"sum by (Hostname) ({rate('gpuaware_agent_samples_total')})", "samples {{Hostname}}"),
            Target(f"sum by (Hostname) ({rate('gpuaware_agent_watch_reads_total')})", "watch reads {{Hostname}}")]),
        Panel("Publish errors and spool drops", [
            Target(f"sum({rate('gpuaware_agent_publish_errors_total')})", "publish errors/s"),
            Target(f"sum({rate('gpuaware_agent_spool_dropped_total')})", "spool drops/s")]),
        Panel("Stream records/s by topic", [Target(
            f"sum by (topic) ({rate('gpuaware_stream_records_total')})", "{{topic}}")], unit="ops"),
        Panel("Consumer lag by topic", [Target(f"sum by (topic) (gpuaware_stream_consumer_lag{{{CL}}})",
                                               "{{topic}}")]),
        Panel("Consumer lag in seconds by topic", [Target(
            f"max by (topic) (gpuaware:stream_lag_seconds:by_topic{{{CL}}})", "{{topic}}")], unit="s",
              description="Records behind over the rate they are read at (alert GpuawareStreamLag)."),
        Panel("Sample to state latency (p50, p99)", [
            Target(f"histogram_quantile(0.5, sum by (le) ({rate(latency)}))", "p50"),
            Target(f"histogram_quantile(0.99, sum by (le) ({rate(latency)}))", "p99")], unit="s"),
        Panel("Derived records/s by topic", [Target(
            f"sum by (topic) ({rate('gpuaware_stream_published_total')})", "{{topic}}")], unit="ops"),
        Panel("Duplicate samples applied once (/s)", [Target(
            f"sum({rate('gpuaware_stream_duplicate_samples_total')})", "duplicates/s")]),
    ], VARIABLES)


def scheduler_tenants() -> Dashboard:
    wait = f"gpuaware_scheduler_queue_wait_seconds_bucket{{{TENANT}}}"
    return Dashboard("gpuaware-scheduler", "gpuaware / Scheduler and tenants",
                     "Queues, waits, quota use and fairness per tenant; what the scheduler decided and how fast.", [
        Panel("Pending pods", [Target(f"sum(gpuaware_scheduler_pending_pods{{{TENANT}}})")], kind="stat", width=4,
              thresholds=[(None, "green"), (10, "orange"), (100, "red")]),
        Panel("Oldest pending pod", [Target(f"max(gpuaware_scheduler_oldest_pending_seconds{{{TENANT}}})")],
              kind="stat", unit="s", width=4, thresholds=[(None, "green"), (300, "orange"), (1800, "red")]),
        Panel("Jain's fairness index", [Target(f"min(gpuaware_scheduler_jain_fairness{{{SCHED}}})")], kind="stat",
              width=4, min=0, max=1, thresholds=[(None, "red"), (0.8, "orange"), (0.95, "green")],
              description="Over tenants' GPU use divided by their weights: 1 when every tenant gets its share."),
        Panel("Allocated share of GPU capacity", [Target(
            f"max(gpuaware_scheduler_allocated_gpu_ratio{{{SCHED}}})")], kind="stat", unit="percentunit", width=4,
              min=0, max=1),
        Panel("Scheduling leader", [Target(f"sum(gpuaware_scheduler_leader{{{SCHED}}})")], kind="stat", width=4,
              thresholds=[(None, "red"), (1, "green"), (2, "red")],
              description="Replicas holding the Lease: exactly 1 is healthy."),
        Panel("Stale / cordoned GPUs", [
            Target(f"max(gpuaware_scheduler_stale_gpus{{{SCHED}}})", "stale"),
            Target(f"max(gpuaware_scheduler_cordoned_gpus{{{SCHED}}})", "cordoned")], kind="stat", width=4),
        Panel("Queue depth by tenant and priority", [Target(
            f"sum by (tenant, priority) (gpuaware_scheduler_pending_pods{{{TENANT}}})", "{{tenant}} {{priority}}")],
              width=12),
        Panel("Queue wait p95 by tenant and priority", [Target(
            f"histogram_quantile(0.95, sum by (le, tenant, priority) (rate({wait}[5m])))",
            "{{tenant}} {{priority}}")], unit="s", width=12),
        Panel("Decisions per minute by action and reason", [Target(
            f"sum by (action, reason) (rate(gpuaware_scheduler_decisions_total{{{SCHED}}}[5m])) * 60",
            "{{action}} {{reason}}")], width=12,
              description="PLACE, UNSCHEDULABLE, PREEMPT, MIGRATE, THROTTLE, CORDON, each with a reason class."),
        Panel("Placements, preemptions, migrations, throttles per minute", [Target(
            f"sum by (action) (rate(gpuaware_scheduler_decisions_total{{{SCHED}}}[5m])) * 60", "{{action}}")],
              width=12),
        Panel("GPUs used vs quota by tenant", [
            Target(f"sum by (tenant) (gpuaware_scheduler_tenant_gpus{{{TENANT}}})", "{{tenant}} used"),
            Target(f"sum by (tenant) (gpuaware_scheduler_tenant_quota_gpus{{{TENANT}}})", "{{tenant}} quota")],
              width=12),
        Panel("Borrowed GPUs by tenant", [Target(
            f"sum by (tenant) (gpuaware_scheduler_tenant_borrowed_gpus{{{TENANT}}})", "{{tenant}}")], width=12,
              description="Use beyond quota, out of other tenants' idle quota; reclaimed when an owner waits."),
        Panel("Decision latency (p50, p99)", [
            Target("histogram_quantile(0.5, sum by (le) (rate(gpuaware_scheduler_decision_latency_seconds_bucket"
                   f"{{{SCHED}}}[5m])))", "p50"),
            Target("histogram_quantile(0.99, sum by (le) (rate(gpuaware_scheduler_decision_latency_seconds_bucket"
                   f"{{{SCHED}}}[5m])))", "p99")], unit="s", width=12),
        Panel("Bind latency p99 and API errors/s", [
            Target("histogram_quantile(0.99, sum by (le) (rate(gpuaware_scheduler_bind_latency_seconds_bucket"
                   f"{{{SCHED}}}[5m])))", "bind p99 (s)"),
            Target(f"sum(rate(gpuaware_scheduler_api_errors_total{{{SCHED}}}[5m])) or vector(0)", "API errors/s")],
              width=12),
        Panel("Scheduler decisions per pod ($namespace/$pod)", [Target(
            f"count by (cluster, namespace, pod, action, node, reason) ({POD_DECISION}{{{POD}}})",
            "{{namespace}}/{{pod}} {{action}} {{node}} {{reason}}")], kind="state-timeline", width=24, height=10,
              links=[TO_POD], description="Each pod's latest decision over time (PLACE, UNSCHEDULABLE, PREEMPT, "
                                          "MIGRATE) with its node and first reason, from the leading replica's "
                                          "latest 500 pods; click a pod for its decisions alone. Every decision "
                                          "is on the topic scheduler.decisions.v1 and in the pod's Events."),
        *job_runtime_panels(),
    ], SCHEDULER_VARIABLES)


def job_runtime_panels() -> list[Panel]:
    """The scheduler dashboard's job runtimes row: completions, the runtime table, and forecasts against
    completions over the scheduler's window of the last 500 (``gpuaware.scheduler.forecast_quality``)."""
    return [
        Panel("Job completions per hour", [Target(
            f"sum(increase(gpuaware_scheduler_completions_published_total{{{SCHED}}}[1h]))")], kind="stat", width=6,
              description="Pods of this scheduler that ended Succeeded, published on job.completions.v1."),
        Panel("Runtime signature keys", [Target(f"max(gpuaware_scheduler_runtime_keys{{{SCHED}}})")], kind="stat",
              width=6, description="Keys in the runtime table the scheduler reads from job.runtime.v1."),
        Panel("Newest runtime record age", [Target(f"min(gpuaware_scheduler_runtime_newest_age_seconds{{{SCHED}}})")],
              kind="stat", unit="s", width=6, thresholds=[(None, "green"), (3600, "orange"), (86400, "red")],
              description="The end of the newest completion learned; past scheduler.runtime_stale_after_s (a day) "
                          "forecasts are not used."),
        Panel("Completions scored", [
            Target(f"max(gpuaware_scheduler_forecast_window_completions{{{SCHED}}})", "scored"),
            Target(f"max(gpuaware_scheduler_forecast_judged_completions{{{SCHED}}})", "learned estimates")],
              kind="stat", width=6, description="Completions in the quality window (the last 500) whose pod was "
                                                "placed with a runtime estimate, and of those the ones placed with "
                                                "a learned one (forecast or calibrated) that correlation and "
                                                "coverage are over."),
        Panel("Runtime forecasts: rank correlation and p90 coverage", [
            Target(f"max(gpuaware_scheduler_forecast_spearman{{{SCHED}}})", "Spearman (p50 vs actual)"),
            Target(f"max(gpuaware_scheduler_forecast_p90_coverage{{{SCHED}}})", "ended within p90")], width=12,
              min=-1, max=1, description="Over the last 500 completions placed with a learned estimate (forecast "
                                         "or calibrated; a declared duration taken as exact is not judged), "
                                         "against the estimate each pod was placed with. Calibrated: about 0.9 "
                                         "within p90. Alert below 0.7 or above 0.98, or Spearman under 0.2, with "
                                         "at least 50 judged (GpuawareRuntimeForecastDrift)."),
        Panel("Runtime forecast error by signature level", [Target(
            f"max by (level) (gpuaware_scheduler_forecast_mae_log{{{SCHED}}})", "{{level}}")], width=12,
              description="Mean |log(actual / predicted p50)|: 0.69 is a factor of 2. Level: the most specific "
                          "signature key with history (owner, tenant, shape, global) or declared."),
    ]


DASHBOARDS = {d.uid: d for d in (fleet_overview(), gpu_health(), gpu_detail(), forecasts(), pipeline_health(),
                                 scheduler_tenants())}


# Variant folder (under gpuaware/dashboards/grafana/ and gpuaware/dashboards/prometheus/) -> (schema, prefixed);
# "" is the legacy schema without prefix, the files at the top.
VARIANTS: dict[str, tuple[Schema, bool]] = {
    "": (LEGACY, False), "dcgm-4.9": ("dcgm-4.9", False), "dcgm-4.10": ("dcgm-4.10", False),
    "beside-dcgm-exporter": (LEGACY, True), "dcgm-4.9-beside-dcgm-exporter": ("dcgm-4.9", True),
    "dcgm-4.10-beside-dcgm-exporter": ("dcgm-4.10", True),
}


def label_text(schema: Schema) -> Callable[[str], str]:
    """Label references in legends, variable queries and rule annotations, for ``schema``."""
    return lambda s: s if schema == LEGACY else re.sub(r"\bHostname\b", "hostname", s)


def variant(dashboard: Dashboard, schema: Schema, prefixed: bool) -> Dashboard:
    text = label_text(schema)
    return dashboard.translated(lambda q: translate(q, schema, prefixed),
                                lambda s: translate(text(s), schema, prefixed, units=False))
