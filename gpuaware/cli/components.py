"""``gpuaware agent``, ``stream`` and ``scheduler``: one long-running component each, as deployed."""

from __future__ import annotations

import logging
import sys

import click

from gpuaware.cli.common import Context, setup

log = logging.getLogger("gpuaware")


@click.command()
@click.option("--collector", type=click.Choice(["nvml", "sim"]), default=None,
              help="nvml: the GPUs of this node (default); sim: simulated GPUs replaying the GenTD26 traces.")
@click.option("--scenario", default=None,
              help="sim: scenario name (gpuaware/agent/scenarios) or YAML file (default baseline).")
@click.option("--nodes", "sim_nodes", type=int, default=None, help="sim: number of simulated nodes.")
@click.option("--gpus-per-node", "sim_gpus", type=int, default=None, help="sim: GPUs per simulated node.")
@click.option("--node-name", default=None, help="Node name (default: NODE_NAME env, then the hostname).")
@click.option("--policy", "policy_path", default=None, help="Sampling policy YAML, hot-reloaded on change.")
@click.option("--spool-dir", default=None, help="Disk spool for records not yet acknowledged by Kafka.")
@click.option("--metrics-port", type=int, default=None, help="Port of /metrics (default 9400; 0 disables).")
@click.option("--api-server", default=None,
              help="Kubernetes API URL to read this node's cordoned GPUs from (default: in-cluster config in a pod).")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds (default: run until stopped).")
@click.pass_obj
def agent(obj: Context, collector: str | None, scenario: str | None, sim_nodes: int | None, sim_gpus: int | None,
          node_name: str | None, policy_path: str | None, spool_dir: str | None, metrics_port: int | None,
          api_server: str | None, duration: float | None) -> None:
    """Run the node agent: read GPUs, sample adaptively, detect anomalies, score health, publish to Kafka.

    Serves dcgm-exporter-compatible metrics on /metrics; keeps sampling and spools to disk while
    Kafka is unreachable; follows agent.control.v1 for sampling policies and power caps; samples
    the GPUs its node's gpuaware.io/cordoned-gpus annotation names at the floor.

    \b
    Example:
      gpuaware agent --collector sim --scenario xid --metrics-port 0 --duration 30
    """
    from gpuaware.agent.main import serve_agent
    from gpuaware.agent.sampling import PolicyError

    cfg = obj.config(**{"agent.collector": collector, "agent.scenario": scenario, "agent.sim_nodes": sim_nodes,
                        "agent.sim_gpus_per_node": sim_gpus, "agent.node_name": node_name,
                        "agent.policy_path": policy_path, "agent.spool_dir": spool_dir,
                        "agent.api_server": api_server, "metrics.port": metrics_port})
    setup("agent", cfg)
    try:
        runtime = serve_agent(cfg.agent, cfg.kafka, cfg.metrics.host, cfg.metrics.port, duration)
    except (PolicyError, ValueError, RuntimeError, FileNotFoundError) as exc:
        click.echo(f"gpuaware agent: {exc}", err=True)
        sys.exit(2)
    log.info("agent stopped: %d samples, %d events published, %d records spooled, %d dropped",
             runtime.samples_published, runtime.events_published, runtime.spool.depth, runtime.spool.dropped)


@click.command()
@click.option("--metrics-port", type=int, default=None, help="Port of /metrics (default 9400; 0 disables).")
@click.option("--app-id", default=None, help="Faust app id = consumer group (default gpuaware-stream).")
@click.option("--data-dir", default=None,
              help="Faust's working directory, where the rocksdb store keeps the table; one per worker "
                   "(default /tmp/gpuaware-stream).")
@click.pass_obj
def stream(obj: Context, metrics_port: int | None, app_id: str | None, data_dir: str | None) -> None:
    """Run one Faust stream worker: per-GPU state, forecasts, fingerprints, derived-state topics.

    Reads gpu.telemetry.v1 and gpu.events.v1, keeps each GPU's state in a changelog-backed table,
    and publishes gpu.state.v1, node.state.v1 and cluster.forecast.v1; learns job runtimes from
    job.completions.v1 into job.runtime.v1. Start several with the same
    app id to share the partitions; bad records go to <topic>.dlq. Ctrl-C stops it.

    \b
    Example:
      gpuaware --bootstrap-servers 127.0.0.1:9092 stream --app-id gpuaware-stream --metrics-port 9401
    """
    from gpuaware.stream.main import run_worker

    cfg = obj.config(**{"metrics.port": metrics_port, "stream.app_id": app_id, "stream.data_dir": data_dir})
    setup("stream", cfg)
    try:
        run_worker(cfg.kafka, cfg.stream, cfg.cluster, cfg.metrics.host, cfg.metrics.port, cfg.log.level)
    except (TimeoutError, RuntimeError, OSError) as exc:
        click.echo(f"gpuaware stream: {exc}", err=True)
        sys.exit(2)


@click.command("scheduler")
@click.option("--name", default=None, help="schedulerName of the pods it places (default gpuaware).")
@click.option("--policy", default=None, help="Placement policy (default gpuaware; any simulator policy).")
@click.option("--extender-port", type=int, default=None,
              help="Port of the extender endpoints and /healthz, /readyz (default 8888; 0 disables).")
@click.option("--leader-elect/--no-leader-elect", default=None,
              help="Hold a Lease so that only one replica schedules (default off).")
@click.option("--lease-namespace", default=None, help="Namespace of the Lease (default gpuaware).")
@click.option("--api-server", default=None,
              help="Kubernetes API URL (default: in-cluster service account, then ~/.kube/config).")
@click.option("--metrics-port", type=int, default=None, help="Port of /metrics (default 9400; 0 disables).")
@click.option("--state-feed/--no-state-feed", default=True,
              help="Read live GPU state from Kafka (default on; off: capacity only, no health).")
@click.pass_obj
def scheduler_cmd(obj: Context, name: str | None, policy: str | None, extender_port: int | None,
                  leader_elect: bool | None, lease_namespace: str | None, api_server: str | None,
                  metrics_port: int | None, state_feed: bool) -> None:
    """Run the scheduler on a Kubernetes cluster: custom scheduler and extender, one core.

    Places pods with schedulerName gpuaware (Binding API, GPU annotations, Events), answers
    kube-scheduler's extender calls (/filter, /prioritize, /preempt) for everything else, reads
    gpu.state.v1 / node.state.v1 / cluster.forecast.v1 to know GPU health and job.runtime.v1 for
    runtime forecasts, cordons critical GPUs and moves their pods (checkpoint, then the Eviction API),
    publishes every decision on scheduler.decisions.v1 and every pod that succeeded on
    job.completions.v1. Ctrl-C or SIGTERM stops it.

    \b
    Example:
      gpuaware scheduler --api-server http://127.0.0.1:8001 --policy gpuaware --leader-elect
    """
    from gpuaware.scheduler.main import run_scheduler

    cfg = obj.config(**{"scheduler.name": name, "scheduler.policy": policy, "scheduler.extender_port": extender_port,
                        "scheduler.leader_elect": leader_elect, "scheduler.lease_namespace": lease_namespace,
                        "scheduler.api_server": api_server, "metrics.port": metrics_port})
    setup("scheduler", cfg)
    try:
        run_scheduler(cfg.kafka if state_feed else None, cfg.scheduler, cfg.metrics.host, cfg.metrics.port)
    except (TimeoutError, RuntimeError, OSError) as exc:
        click.echo(f"gpuaware scheduler: {exc}", err=True)
        sys.exit(2)
