"""The ``gpuaware`` command line: thin wrappers that load config and start one component.

One module per command group; each command parses its flags and calls one function of the
package that owns the work (agent, stream, scheduler, bench, gpuaware.local).
"""

from __future__ import annotations

import click

from gpuaware.cli.bench import bench
from gpuaware.cli.common import Context
from gpuaware.cli.components import agent, scheduler_cmd, stream
from gpuaware.cli.evaluate import eval_group
from gpuaware.cli.local import broker, up
from gpuaware.cli.simulate import simulate

__all__ = ["cli", "main"]


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

    \b
    Example:
      gpuaware --log-level debug up --duration 60
    """
    ctx.obj = Context(config_path, {
        "log.level": log_level, "log.format": log_format, "kafka.bootstrap_servers": bootstrap_servers,
    })


@cli.command("config")
@click.pass_obj
def show_config(obj: Context) -> None:
    """Print the effective configuration (file, env and flags merged; secrets masked) as JSON.

    \b
    Example:
      GPUAWARE_LOG__LEVEL=debug gpuaware --config gpuaware.yaml config
    """
    cfg = obj.config()
    click.echo(cfg.model_dump_json(indent=2))


for command in (broker, up, agent, stream, scheduler_cmd, eval_group, bench, simulate):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="gpuaware")
