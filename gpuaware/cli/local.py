"""``gpuaware broker`` and ``gpuaware up``: the stand-ins of gpuaware.local on this machine."""

from __future__ import annotations

import json
import logging
import sys

import click

from gpuaware.cli.common import Context, setup, stop_signals
from gpuaware.local.broker import BrokerError, LocalBroker, serve_broker
from gpuaware.plumbing import observability

log = logging.getLogger("gpuaware")


@click.command()
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

    \b
    Example:
      gpuaware broker --port 0 --storage s3
    """
    cfg = obj.config(**{"broker.host": host, "broker.port": port, "broker.storage": storage,
                        "broker.data_dir": data_dir, "broker.create_topics": False if no_topics else None})
    setup("broker", cfg)
    with stop_signals() as stop:
        try:
            failure = serve_broker(cfg.broker, stop, on_ready=_announce)
        except BrokerError as exc:
            click.echo(f"gpuaware broker: {exc}", err=True)
            sys.exit(1)
    if failure:
        click.echo(f"gpuaware broker: {failure}", err=True)
    log.info("broker stopped")
    sys.exit(1 if failure else 0)


def _announce(local: LocalBroker) -> None:
    click.echo(f"READY bootstrap={local.bootstrap} pid={local.pid} storage={local.settings.storage}", nl=True)
    sys.stdout.flush()


@click.command()
@click.option("--duration", type=float, default=None, help="Stop after this many seconds (default: until Ctrl-C).")
@click.option("--json", "as_json", is_flag=True, help="No live view; print the run summary as JSON on stdout.")
@click.option("--port", type=int, default=None, help="Broker port (default 9092; 0 picks a free one).")
@click.option("--durable", is_flag=True, help="Keep the broker's log in a local S3 store (SeaweedFS).")
@click.option("--scenario", default="demo", show_default=True,
              help="Simulated cluster and its faults: a name from gpuaware/agent/scenarios or a YAML file.")
@click.option("--stream-workers", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Faust stream worker processes.")
@click.option("--prometheus/--no-prometheus", default=None,
              help="Run a local Prometheus with the alert rules (default: when the prometheus binary is installed).")
@click.option("--scheduler/--no-scheduler", default=True, show_default=True,
              help="Run the scheduler on the simulated nodes (as a Kubernetes cluster) with openb pods.")
@click.option("--kube", type=click.Choice(["real", "embedded"]), default=None,
              help="The scheduler's cluster: real (etcd, kube-apiserver, kwok nodes; realparts/build-kube.sh "
                   "builds them, Go needed) or embedded (a fake API server). Default: real when built.")
@click.pass_obj
def up(obj: Context, duration: float | None, as_json: bool, port: int | None, durable: bool, scenario: str,
       stream_workers: int, prometheus: bool | None, scheduler: bool, kube: str | None) -> None:
    """Run the pipeline on this machine: the broker, simulated GPU nodes with their agents, the stream
    workers, the scheduler, a local Prometheus with the alert rules when one is installed, and a live view.

    The default scenario is 16 nodes x 8 GPUs of mixed models replaying the GenTD26 traces, with
    faults injected in the first 40 seconds. The scheduler places pods sampled from the openb
    trace for four tenants on those nodes (a real kube-apiserver with kwok nodes when built, its
    kubeconfig printed for kubectl; else a local fake Kubernetes API), reacting to the GPUs' live health.
    Ctrl-C stops everything; --json prints a summary at the end.

    \b
    Example:
      gpuaware up --duration 60 --json --scenario xid
      gpuaware up --kube embedded
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
    if kube is None and scheduler:
        from gpuaware.local.kube_cluster import default_kube

        kube, why_not = default_kube()
        if why_not:
            click.echo(f"gpuaware up: {why_not}", err=True)
    try:
        # The first SIGINT/SIGTERM stops the run in order and still ends here with its summary.
        summary = asyncio.run(run_up(cfg.broker, scenario, duration, live=not as_json, stream_workers=stream_workers,
                                     prometheus=available() if prometheus is None else prometheus,
                                     scheduler=scheduler, kube=kube or "embedded"))
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
