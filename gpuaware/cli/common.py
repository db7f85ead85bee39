"""What every command shares: the root options' context, signal handling, logging setup, figure output."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from gpuaware.config import ConfigError, GpuawareConfig, load_config
from gpuaware.plumbing import observability

# Where the openb traces live, relative to a checkout (the simulator's and the scheduler bench's defaults).
OPENB = "../shared/traces/alibaba-openb"


class Context:
    """The root options: the config file and the flags that override it."""

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


def setup(component: str, cfg: GpuawareConfig) -> None:
    observability.setup(component, log_level=cfg.log.level, log_format=cfg.log.format)


def echo_figures(result: dict, as_json: bool, width: int, keys: Iterable[str] | None = None) -> None:
    """The figures as indented JSON, or one ``key value`` line each (only ``keys`` when given)."""
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo("\n".join(f"{k:{width}} {result[k]}" for k in (result if keys is None else keys)))


def progress_to_stderr(prefix: str) -> Callable[[str], None]:
    return lambda message: click.echo(f"{prefix}: {message}", err=True)
