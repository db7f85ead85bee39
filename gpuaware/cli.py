"""The ``gpuaware`` command line: thin wrappers that load config and start one component."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from gpuaware.config import ConfigError, GpuawareConfig, load_config
from gpuaware.localbroker import BrokerError, LocalBroker
from stream import observability, topics

log = logging.getLogger("gpuaware")

NOT_BUILT_EXIT = 3


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
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON on stdout.")
@click.option("--port", type=int, default=None, help="Broker port (default 9092; 0 picks a free one).")
@click.option("--durable", is_flag=True, help="Keep the broker's log in a local S3 store (SeaweedFS).")
@click.pass_obj
def up(obj: Context, duration: float | None, as_json: bool, port: int | None, durable: bool) -> None:
    """Run the whole pipeline on this machine: broker, simulated GPU nodes, stream workers, scheduler.

    At this stage only the broker and the topic contract are built; the other parts report
    that they are not built yet (see the open issues).
    """
    cfg = obj.config(**{"broker.port": port, "broker.storage": "s3" if durable else None})
    _setup("up", cfg)
    started = time.monotonic()
    local = LocalBroker(cfg.broker)
    with stop_signals() as stop:
        try:
            local.start()
        except BrokerError as exc:
            click.echo(f"gpuaware up: {exc}", err=True)
            sys.exit(1)
        try:
            pending = {"agent": "not built yet", "stream": "not built yet", "scheduler": "not built yet"}
            if not as_json:
                click.echo(f"broker ready on {local.bootstrap} ({cfg.broker.storage} storage), "
                           f"{len(topics.ALL_TOPICS)} topics created")
                for part, state in pending.items():
                    click.echo(f"  {part}: {state}")
                click.echo("Ctrl-C stops everything." if duration is None else f"running for {duration:.0f}s")
            while not stop.wait(0.5):
                if duration is not None and time.monotonic() - started >= duration:
                    break
                if not local.running():
                    click.echo("gpuaware up: the broker exited unexpectedly", err=True)
                    sys.exit(1)
        finally:
            local.stop()
    summary = {
        "bootstrap": local.bootstrap,
        "storage": cfg.broker.storage,
        "topics": sorted(t.name for t in topics.ALL_TOPICS),
        "components": pending,
        "duration_s": round(time.monotonic() - started, 3),
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))


# --------------------------------------------------------------------------- config


@cli.command("config")
@click.pass_obj
def show_config(obj: Context) -> None:
    """Print the effective configuration (file, env and flags merged; secrets masked) as JSON."""
    cfg = obj.config()
    click.echo(cfg.model_dump_json(indent=2))


# --------------------------------------------------------------------------- parts built by later issues

_LATER = {
    "agent": ("Run the node agent (NVML or simulated GPUs) that streams telemetry to Kafka.", 3),
    "stream": ("Run the Faust stream workers: per-GPU state, River forecasts, derived-state topics.", 4),
    "scheduler": ("Run the scheduler (custom scheduler or extender) on live state from Kafka.", 6),
    "simulate": ("Replay the openb traces through the scheduling core and report the figures.", 5),
    "eval": ("Evaluate sampling and forecasting against the real traces (JSON figures).", 3),
    "bench": ("Benchmarks of the agent, stream, scheduler and pipeline (JSON figures).", 9),
}


def _not_built(name: str, issue: int) -> click.Command:
    @click.pass_context
    def run(ctx: click.Context, **_: Any) -> None:
        click.echo(f"gpuaware {name}: not built yet (tracked in issue {issue}).", err=True)
        ctx.exit(NOT_BUILT_EXIT)

    return click.Command(
        name, callback=run, help=_LATER[name][0] + f"\n\nNot built yet: tracked in issue {issue}.",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


for _name, (_help, _issue) in _LATER.items():
    cli.add_command(_not_built(_name, _issue))


def main() -> None:
    cli(prog_name="gpuaware")


if __name__ == "__main__":
    main()
