"""The ``gpuaware`` command line: thin wrappers that load config and start one component."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from gpuaware.config import ConfigError, GpuawareConfig, load_config
from gpuaware.local.broker import BrokerError, LocalBroker
from plumbing import observability

log = logging.getLogger("gpuaware")



class Context:
    def __init__(self, config_path: str | None, flag_overrides: dict[str, Any]):
        self.config_path = config_path
        self.flag_overrides = flag_overrides

    def config(self, **overrides: Any) -> GpuawareConfig:
        try:
            return load_config(self.config_path, overrides={**self.flag_overrides, **overrides})
        except ConfigError as exc:
            click.echo(f"gpuaware: {exc}", err=True)
            sys.exit(2)


@contextmanager
def stop_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM, with the previous handlers restored afterwards."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": None})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="GPUAWARE_CONFIG",
              help="YAML config file (also GPUAWARE_CONFIG). Flags override env, env overrides the file.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None,
              help="Log level (default info; env GPUAWARE_LOG__LEVEL).")
@click.option("--log-format", type=click.Choice(["json", "console"]), default=None,
              help="Log format (default console; env GPUAWARE_LOG__FORMAT).")
@click.option("--bootstrap-servers", default=None,
              help="Kafka bootstrap servers host:port[,host:port] (env GPUAWARE_KAFKA__BOOTSTRAP_SERVERS).")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, log_level: str | None, log_format: str | None,
        bootstrap_servers: str | None) -> None:
    """gpuaware: GPU-aware scheduling built as a telemetry pipeline.

    Agents on GPU nodes stream telemetry to Kafka; Faust workers keep per-GPU state and
    forecasts; the scheduler places, migrates and throttles workloads from that state.
    """
    ctx.obj = Context(config_path, {
        "log.level": log_level, "log.format": log_format, "kafka.bootstrap_servers": bootstrap_servers,
    })


def _setup(component: str, cfg: GpuawareConfig) -> None:
    observability.setup(component, log_level=cfg.log.level, log_format=cfg.log.format)


# --------------------------------------------------------------------------- broker


@cli.command()
@click.option("--host", default=None, help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default 9092; 0 picks a free one).")
@click.option("--storage", type=click.Choice(["memory", "s3"]), default=None,
              help="memory (default) or s3: a durable log in a local SeaweedFS S3 store.")
@click.option("--data-dir", default=None, help="Directory of the s3 store's files (s3 storage only).")
@click.option("--no-topics", is_flag=True, default=False, help="Do not create the contract's topics.")
@click.pass_obj
def broker(obj: Context, host: str | None, port: int | None, storage: str | None, data_dir: str | None,
           no_topics: bool) -> None:
    """Run the embedded Kafka-protocol broker (Tansu) in the foreground until Ctrl-C.

    Creates every topic of the contract (and its .dlq) before reporting ready. Prints one
    line `READY bootstrap=HOST:PORT pid=PID` on stdout when clients can connect.
    """
    cfg = obj.config(**{"broker.host": host, "broker.port": port, "broker.storage": storage,
                        "broker.data_dir": data_dir, "broker.create_topics": False if no_topics else None})
    _setup("broker", cfg)
    local = LocalBroker(cfg.broker)
    with stop_signals() as stop:
        try:
            local.start()
        except BrokerError as exc:
            click.echo(f"gpuaware broker: {exc}", err=True)
            sys.exit(1)
        click.echo(f"READY bootstrap={local.bootstrap} pid={local.pid} storage={cfg.broker.storage}", nl=True)
        sys.stdout.flush()
        code = 0
        try:
            while not stop.wait(0.5):
                if not local.running():
                    click.echo(f"gpuaware broker: tansu exited unexpectedly:\n{local.child.log_tail()}", err=True)
                    code = 1
                    break
        finally:
            local.stop()
    log.info("broker stopped")
    sys.exit(code)


# --------------------------------------------------------------------------- up


@cli.command()
@click.option("--duration", type=float, default=None, help="Stop after this many seconds (default: until Ctrl-C).")
@click.option("--json", "as_json", is_flag=True, help="No live view; print the run summary as JSON on stdout.")
@click.option("--port", type=int, default=None, help="Broker port (default 9092; 0 picks a free one).")
@click.option("--durable", is_flag=True, help="Keep the broker's log in a local S3 store (SeaweedFS).")
@click.option("--scenario", default="demo", show_default=True,
              help="Simulated cluster and its faults: a name from agent/scenarios or a YAML file.")
@click.option("--stream-workers", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Faust stream worker processes.")
@click.option("--prometheus/--no-prometheus", default=None,
              help="Run a local Prometheus with the alert rules (default: when the prometheus binary is installed).")
@click.option("--scheduler/--no-scheduler", default=True, show_default=True,
              help="Run the scheduler on the simulated nodes (as a Kubernetes cluster) with openb pods.")
@click.pass_obj
def up(obj: Context, duration: float | None, as_json: bool, port: int | None, durable: bool, scenario: str,
       stream_workers: int, prometheus: bool | None, scheduler: bool) -> None:
    """Run the pipeline on this machine: the broker, simulated GPU nodes with their agents, the stream
    workers, the scheduler, a local Prometheus with the alert rules when one is installed, and a live view.

    The default scenario is 16 nodes x 8 GPUs of mixed models replaying the GenTD26 traces, with
    faults injected in the first 40 seconds. The scheduler places pods sampled from the openb
    trace for four tenants on those nodes (served by a local fake Kubernetes API), reacting to
    the GPUs' live health. Ctrl-C stops everything; --json prints a summary at the end.
    """
    import asyncio

    from gpuaware.local.prometheus import available
    from gpuaware.local.stack import run_up

    cfg = obj.config(**{"broker.port": port, "broker.storage": "s3" if durable else None})
    observability.setup("up", log_level="warning" if not as_json else cfg.log.level, log_format=cfg.log.format)
    if prometheus and not available():
        click.echo("gpuaware up: --prometheus: no prometheus binary on PATH: install the Debian package prometheus, "
                   "or leave out --prometheus", err=True)
        sys.exit(2)
    try:
        # The first SIGINT/SIGTERM stops the run in order and still ends here with its summary.
        summary = asyncio.run(run_up(cfg.broker, scenario, duration, live=not as_json, stream_workers=stream_workers,
                                     prometheus=available() if prometheus is None else prometheus,
                                     scheduler=scheduler))
    except BrokerError as exc:
        click.echo(f"gpuaware up: {exc}", err=True)
        sys.exit(1)
    except ValueError as exc:
        click.echo(f"gpuaware up: {exc}", err=True)
        sys.exit(2)
    click.echo(json.dumps(summary, indent=2) if as_json else
               f"\nstopped after {summary['duration_s']:.0f}s: {summary['samples']} samples, "
               f"{summary['events']} events"
               + (f", {summary['scheduler']['placements']} pods placed" if summary.get("scheduler") else ""))


# --------------------------------------------------------------------------- config


@cli.command("config")
@click.pass_obj
def show_config(obj: Context) -> None:
    """Print the effective configuration (file, env and flags merged; secrets masked) as JSON."""
    cfg = obj.config()
    click.echo(cfg.model_dump_json(indent=2))


# --------------------------------------------------------------------------- agent


@cli.command()
@click.option("--collector", type=click.Choice(["nvml", "sim"]), default=None,
              help="nvml: the GPUs of this node (default); sim: simulated GPUs replaying the GenTD26 traces.")
@click.option("--scenario", default=None, help="sim: scenario name (agent/scenarios) or YAML file (default baseline).")
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
    """
    import asyncio

    from agent.main import run_agent
    from agent.sampling import PolicyError

    cfg = obj.config(**{"agent.collector": collector, "agent.scenario": scenario, "agent.sim_nodes": sim_nodes,
                        "agent.sim_gpus_per_node": sim_gpus, "agent.node_name": node_name,
                        "agent.policy_path": policy_path, "agent.spool_dir": spool_dir,
                        "agent.api_server": api_server, "metrics.port": metrics_port})
    _setup("agent", cfg)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runtime = await run_agent(cfg.agent, cfg.kafka, cfg.metrics.host, cfg.metrics.port, duration, stop)
        log.info("agent stopped: %d samples, %d events published, %d records spooled, %d dropped",
                 runtime.samples_published, runtime.events_published, runtime.spool.depth, runtime.spool.dropped)

    try:
        asyncio.run(main())
    except (PolicyError, ValueError, RuntimeError, FileNotFoundError) as exc:
        click.echo(f"gpuaware agent: {exc}", err=True)
        sys.exit(2)


# --------------------------------------------------------------------------- stream


@cli.command()
@click.option("--metrics-port", type=int, default=None, help="Port of /metrics (default 9400; 0 disables).")
@click.option("--app-id", default=None, help="Faust app id = consumer group (default gpuaware-stream).")
@click.option("--data-dir", default=None, help="Faust's working directory (default /tmp/gpuaware-stream).")
@click.pass_obj
def stream(obj: Context, metrics_port: int | None, app_id: str | None, data_dir: str | None) -> None:
    """Run one Faust stream worker: per-GPU state, forecasts, fingerprints, derived-state topics.

    Reads gpu.telemetry.v1 and gpu.events.v1, keeps each GPU's state in a changelog-backed table,
    and publishes gpu.state.v1, node.state.v1 and cluster.forecast.v1. Start several with the same
    app id to share the partitions; bad records go to <topic>.dlq. Ctrl-C stops it.
    """
    from stream.main import run_worker

    cfg = obj.config(**{"metrics.port": metrics_port, "stream.app_id": app_id, "stream.data_dir": data_dir})
    _setup("stream", cfg)
    try:
        run_worker(cfg.kafka, cfg.stream, cfg.cluster, cfg.metrics.host, cfg.metrics.port, cfg.log.level)
    except (TimeoutError, RuntimeError, OSError) as exc:
        click.echo(f"gpuaware stream: {exc}", err=True)
        sys.exit(2)


# --------------------------------------------------------------------------- scheduler


@cli.command("scheduler")
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
    gpu.state.v1 / node.state.v1 / cluster.forecast.v1 to know GPU health, cordons critical GPUs
    and moves their pods (checkpoint, then the Eviction API), and publishes every decision on
    scheduler.decisions.v1. Ctrl-C or SIGTERM stops it.
    """
    from scheduler.main import run_scheduler

    cfg = obj.config(**{"scheduler.name": name, "scheduler.policy": policy, "scheduler.extender_port": extender_port,
                        "scheduler.leader_elect": leader_elect, "scheduler.lease_namespace": lease_namespace,
                        "scheduler.api_server": api_server, "metrics.port": metrics_port})
    _setup("scheduler", cfg)
    try:
        run_scheduler(cfg.kafka if state_feed else None, cfg.scheduler, cfg.metrics.host, cfg.metrics.port)
    except (TimeoutError, RuntimeError, OSError) as exc:
        click.echo(f"gpuaware scheduler: {exc}", err=True)
        sys.exit(2)


# --------------------------------------------------------------------------- eval


@cli.group("eval")
def eval_group() -> None:
    """Evaluate the pipeline's models against the real traces; figures print as JSON."""


@eval_group.command("sampling")
@click.option("--scenario", "scenarios", multiple=True,
              help="Scenario name or YAML (repeatable; default: every scenario in agent/scenarios).")
@click.option("--policy", "policy_path", default=None, help="Sampling policy YAML to evaluate (default policy).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def eval_sampling(scenarios: tuple[str, ...], policy_path: str | None, as_json: bool) -> None:
    """Adaptive sampling vs fixed 1 s sampling over the fault scenarios (simulated clock).

    Reports sample_reduction, util_mae_pct_points, faults_injected, faults_detected,
    detection_delay_p95_s and false_alarms.
    """
    from pathlib import Path

    from agent.collectors.sim import SCENARIO_DIR
    from agent.evaluation import evaluate
    from agent.sampling import PolicyError, load_policy

    try:
        policy = load_policy(policy_path) if policy_path else None
        paths = [Path(s) if Path(s).exists() else SCENARIO_DIR / f"{s}.yaml" for s in scenarios] or None
        result = evaluate(paths, policy)
    except (PolicyError, ValueError, FileNotFoundError) as exc:
        click.echo(f"gpuaware eval sampling: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for key in ("sample_reduction", "util_mae_pct_points", "faults_injected", "faults_detected",
                "detection_delay_p95_s", "false_alarms"):
        click.echo(f"{key:24} {result[key]}")


@eval_group.command("forecast")
@click.option("--series", "series_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="A GenTD26-style CSV(.gz): value, timestamp_anon, container_ip (one series per container).")
@click.option("--horizon", type=int, default=5, show_default=True, help="Steps ahead (one step = one sample).")
@click.option("--max-value", type=float, default=None,
              help="Physical upper bound for clamping (default: 100 for duty-cycle files, none otherwise).")
@click.option("--limit", type=int, default=None, help="Only the first N series (sorted by id).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def eval_forecast(series_path: str, horizon: int, max_value: float | None, limit: int | None, as_json: bool) -> None:
    """Prequential (predict, then learn) forecast evaluation over every series of a trace.

    Reports mae, persistence_mae (last value), ratio = mae / persistence_mae,
    interval_coverage_80 of the 80% interval, and us_per_update.
    """
    from agent.traces import load_series
    from stream.forecast import prequential

    if horizon < 1:
        click.echo("gpuaware eval forecast: --horizon must be at least 1", err=True)
        sys.exit(2)
    try:
        series = load_series(series_path)
    except (ValueError, OSError) as exc:
        click.echo(f"gpuaware eval forecast: {exc}", err=True)
        sys.exit(2)
    if limit:
        series = dict(list(series.items())[:limit])
    upper = max_value if max_value is not None else (100.0 if "duty_cycle" in series_path else None)
    result = {"series_file": series_path, **prequential(series, horizon=horizon, upper=upper)}
    click.echo(json.dumps(result, indent=2) if as_json else "\n".join(f"{k:22} {v}" for k, v in result.items()))


# --------------------------------------------------------------------------- bench


@cli.group()
def bench() -> None:
    """Benchmarks that print JSON figures (never timed assertions in tests)."""


@bench.command("agent")
@click.option("--seconds", type=float, default=60.0, show_default=True, help="Measured wall time.")
@click.option("--gpus", type=int, default=8, show_default=True, help="Simulated GPUs on the node.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def bench_agent_cmd(obj: Context, seconds: float, gpus: int, as_json: bool) -> None:
    """The agent's own cost at a 1 s floor: CPU, memory, bytes per GPU sample, DCGM text size.

    Uses the broker named by --bootstrap-servers/GPUAWARE_KAFKA__BOOTSTRAP_SERVERS if given,
    otherwise starts the embedded broker for the run.
    """
    from bench.agent_bench import bench_agent

    cfg = obj.config()
    observability.setup("bench", log_level="warning")
    if obj.flag_overrides.get("kafka.bootstrap_servers") or "GPUAWARE_KAFKA__BOOTSTRAP_SERVERS" in os.environ:
        result = bench_agent(cfg.kafka, seconds=seconds, gpus=gpus)
    else:
        with LocalBroker(cfg.broker.model_copy(update={"port": 0})) as local:
            result = bench_agent(local.kafka_settings(), seconds=seconds, gpus=gpus)
    click.echo(json.dumps(result, indent=2) if as_json else "\n".join(f"{k:28} {v}" for k, v in result.items()))


@contextmanager
def _bench_kafka(obj: Context, cfg: GpuawareConfig) -> Iterator[tuple[Any, int | None]]:
    """(settings, broker pid or None): the broker named by --bootstrap-servers/GPUAWARE_KAFKA__BOOTSTRAP_SERVERS,
    else a fresh embedded one."""
    if obj.flag_overrides.get("kafka.bootstrap_servers") or "GPUAWARE_KAFKA__BOOTSTRAP_SERVERS" in os.environ:
        yield cfg.kafka, None
    else:
        with LocalBroker(cfg.broker.model_copy(update={"port": 0})) as local:
            yield local.kafka_settings(session_timeout_ms=2000), local.pid


def _int_list(text: str, minimum: int, param_hint: str, example: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
        if not values or min(values) < minimum:
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"{text!r}: give numbers of {minimum} or more like {example}",
                                 param_hint=param_hint) from None
    return values


@bench.command("stream")
@click.option("--workers", "worker_counts", default="1,2", show_default=True,
              help="Worker counts to measure, comma-separated.")
@click.option("--gpus", type=int, default=1024, show_default=True, help="Simulated fleet size (8 GPUs per node).")
@click.option("--samples-per-batch", type=int, default=5, show_default=True,
              help="Samples per GPU in each node's batch (an agent flushing every 5 s at a 1 s floor).")
@click.option("--backlog", type=int, default=200_000, show_default=True, help="Samples in the throughput backlog.")
@click.option("--rate", type=float, default=2000.0, show_default=True,
              help="Samples/s produced live for the latency phase.")
@click.option("--latency-seconds", type=float, default=20.0, show_default=True, help="Length of the latency phase.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def bench_stream_cmd(obj: Context, worker_counts: str, gpus: int, samples_per_batch: int, backlog: int, rate: float,
                     latency_seconds: float, as_json: bool) -> None:
    """GPU-samples/s through 1 and 2 stream workers (forecasting on) and p99 sample-to-state latency.

    Writes a backlog of synthetic fleet telemetry, starts the workers, and times how fast they
    apply it; then produces live at --rate and measures sample-to-gpu.state.v1 latency.
    Progress goes to stderr; the figures to stdout.
    """
    from bench.stream_bench import run_bench

    counts = _int_list(worker_counts, 1, "--workers", "1,2")
    cfg = obj.config()
    observability.setup("bench", log_level="warning")
    with _bench_kafka(obj, cfg) as (kafka, _):
        result = run_bench(kafka, counts, gpus, samples_per_batch, backlog, rate, latency_seconds,
                           progress=lambda m: click.echo(f"bench stream: {m}", err=True))
    click.echo(json.dumps(result, indent=2) if as_json else json.dumps(result))


# (the scheduler and pipeline benchmarks are added below, with the other parts not built yet)


# --------------------------------------------------------------------------- simulate

_OPENB = "../shared/traces/alibaba-openb"


@cli.command()
@click.option("--experiment", type=click.Choice(["fragmentation", "dynamic"]), default="fragmentation",
              show_default=True, help="fragmentation: the ATC'23 FGD protocol; dynamic: lifetimes, tenants, faults.")
@click.option("--nodes", "nodes_csv", default=f"{_OPENB}/openb_node_list_gpu_node.csv", show_default=True,
              help="Node CSV (sn, cpu_milli, memory_mib, gpu, model).")
@click.option("--pods", "pods_csv", default=f"{_OPENB}/openb_pod_list_default.csv", show_default=True,
              help="Pod CSV of the openb columns.")
@click.option("--policy", "policies", multiple=True, help="Policy (repeatable, or 'all'; default all).")
@click.option("--seed", "seed_list", type=int, multiple=True, help="A seed (repeatable).")
@click.option("--seeds", default=None, help="Seeds as '0-4' or '0,3' (default 0-4 unless --seed is given).")
@click.option("--out", "out_dir", default=None, help="Directory for the JSON report and PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on stdout.")
def simulate(experiment: str, nodes_csv: str, pods_csv: str, policies: tuple[str, ...], seed_list: tuple[int, ...],
             seeds: str | None, out_dir: str | None, as_json: bool) -> None:
    """Replay the openb traces through the scheduling core and report the figures.

    Progress goes to stderr; with one policy, --json prints that policy's figures (policy,
    unallocated_pct, decisions_per_s, p99_decision_ms), otherwise a report with every policy.
    """
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress

    from scheduler.sim.experiments import dynamic_experiment, fragmentation_experiment, parse_seeds, resolve_policies
    from scheduler.sim.openb import TraceError

    try:
        names = resolve_policies(list(policies))
        seed_values = list(seed_list) or parse_seeds(seeds or "0-4")
        if seeds and seed_list:
            seed_values = sorted(set(seed_values) | set(parse_seeds(seeds)))
        with Progress(transient=True, console=Console(stderr=True)) as bar:
            task = bar.add_task("simulating", total=len(names) * len(seed_values))
            done: set[str] = set()

            def progress(label: str, fraction: float) -> None:
                bar.update(task, description=label)
                if fraction >= 1.0 and label not in done:
                    done.add(label)
                    bar.advance(task)

            if experiment == "fragmentation":
                report = fragmentation_experiment(nodes_csv, pods_csv, names, seed_values,
                                                  Path(out_dir) if out_dir else None, progress)
            else:
                report = dynamic_experiment(nodes_csv, pods_csv, names, seed_values,
                                            Path(out_dir) if out_dir else None, progress)
    except (TraceError, ValueError) as exc:
        click.echo(f"gpuaware simulate: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(report["results"][0] if len(names) == 1 else report, indent=2))
        return
    for r in report["results"]:
        click.echo(json.dumps(r))


@bench.command("scheduler")
@click.option("--nodes", "node_csv", default=f"{_OPENB}/openb_node_list_gpu_node.csv", show_default=True,
              help="Node CSV loaded into the fake API server.")
@click.option("--pods", "pod_csv", default=f"{_OPENB}/openb_pod_list_default.csv", show_default=True,
              help="Pod CSV the pods are sampled from.")
@click.option("--burst", type=int, default=2000, show_default=True, help="Pods created at once (throughput).")
@click.option("--rate", type=float, default=200.0, show_default=True, help="Pods/s for the latency phase.")
@click.option("--seconds", type=float, default=15.0, show_default=True, help="Length of the latency phase.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def bench_scheduler_cmd(obj: Context, node_csv: str, pod_csv: str, burst: int, rate: float, seconds: float,
                        seed: int, as_json: bool) -> None:
    """Pods bound per second end to end and p99 creation-to-binding on the 1,213-node openb cluster.

    A fake kube-apiserver (its own process) holds the trace's nodes; every GPU's state goes through
    the broker; the scheduler binds a burst of trace pods (throughput), then pods arriving at --rate
    (latency). Progress goes to stderr; the figures (pods_per_s, p99_create_to_bind_s, ...) to stdout.
    """
    from bench.scheduler_bench import run_bench

    for path in (node_csv, pod_csv):
        if not Path(path).is_file():
            raise click.BadParameter(f"{path}: no such file (the openb traces live in ../shared/traces)")
    cfg = obj.config()
    observability.setup("bench", log_level="warning")
    with _bench_kafka(obj, cfg) as (kafka, _):
        result = run_bench(kafka, node_csv, pod_csv, burst, rate, seconds, seed,
                           progress=lambda m: click.echo(f"bench scheduler: {m}", err=True))
    click.echo(json.dumps(result, indent=2) if as_json else "\n".join(f"{k:28} {v}" for k, v in result.items()))


@bench.command("pipeline")
@click.option("--sizes", default="64,256,1024,4096", show_default=True, help="Fleet sizes in GPUs, comma-separated.")
@click.option("--seconds", type=float, default=30.0, show_default=True, help="Measured time per size.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_obj
def bench_pipeline_cmd(obj: Context, sizes: str, seconds: float, as_json: bool) -> None:
    """The whole pipeline (agents, a stream worker, the scheduler) at rising fleet sizes on this machine.

    Per size: samples/s, p99 sample-to-state latency, the stream's max consumer lag and whether it
    grows, the scheduler's p99 cycle time, CPU and memory of each process; and the largest fleet
    sustained without growing lag. Progress on stderr, figures on stdout.
    """
    from bench.pipeline_bench import run_pipeline_bench

    fleet = _int_list(sizes, 8, "--sizes", "64,256")
    cfg = obj.config()
    observability.setup("bench", log_level="warning")
    with _bench_kafka(obj, cfg) as (kafka, broker_pid):
        result = run_pipeline_bench(kafka, fleet, seconds, broker_pid,
                                    progress=lambda m: click.echo(f"bench pipeline: {m}", err=True))
    click.echo(json.dumps(result, indent=2) if as_json else
               "\n".join(json.dumps(r) for r in result["results"])
               + f"\nlargest sustained: {result['largest_sustained_gpus']} GPUs")


def main() -> None:
    cli(prog_name="gpuaware")


if __name__ == "__main__":
    main()
