"""Configuration: defaults < YAML file < ``GPUAWARE_*`` environment < command-line flags.

Environment names nest with a double underscore: ``GPUAWARE_KAFKA__BOOTSTRAP_SERVERS`` sets
``kafka.bootstrap_servers``. Whatever the source, a bad value is rejected with the field's dotted
path, the reason, and where the value came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuaware.agent.settings import AgentSettings
from gpuaware.local.broker import BrokerSettings
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.scheduler.settings import SchedulerSettings
from gpuaware.stream.settings import StreamSettings

ENV_PREFIX = "GPUAWARE_"
# GPUAWARE_* variables that are not configuration: read where they matter (the config file's path,
# the test broker, data and cache locations), so ``gpuaware`` children started with them set must
# not reject them as unknown fields.
NON_CONFIG_ENV = frozenset({
    "GPUAWARE_CONFIG",
    "GPUAWARE_TEST_BROKER",
    "GPUAWARE_TRACES_DIR",
    "GPUAWARE_REALPARTS_CACHE",
    "GPUAWARE_KUBE_BIN_DIR",
    "GPUAWARE_KEEP_KUBE_WORKDIR",
})


class LogSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "console"


class MetricsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "0.0.0.0"
    port: int = Field(9400, ge=0, le=65535, description="Prometheus /metrics port; 0 disables it")


class GpuawareConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cluster: str = "local"
    kafka: KafkaSettings = KafkaSettings()
    broker: BrokerSettings = BrokerSettings()
    log: LogSettings = LogSettings()
    metrics: MetricsSettings = MetricsSettings()
    agent: AgentSettings = AgentSettings()
    stream: StreamSettings = StreamSettings()
    scheduler: SchedulerSettings = SchedulerSettings()


class ConfigError(ValueError):
    """Bad configuration: ``problems`` lists (field path, reason, source)."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        self.problems = problems
        lines = [f"  {path}: {reason} (from {source})" for path, reason, source in problems]
        super().__init__("invalid configuration:\n" + "\n".join(lines))


def _set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def _flatten(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for key, value in tree.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, path))
        else:
            out[path] = value
    return out


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except OSError as exc:
        raise ConfigError([("<file>", f"cannot read: {exc.strerror}; pass --config an existing YAML file, "
                                      "or unset GPUAWARE_CONFIG", str(p))]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([("<file>", f"not valid YAML: {exc}", str(p))]) from exc
    if not isinstance(data, dict):
        raise ConfigError([("<file>", f"top level must be a mapping, not {type(data).__name__}", str(p))])
    return data


def env_overrides(environ: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    """Configuration paths set by ``GPUAWARE_*`` variables, those in ``NON_CONFIG_ENV`` left out."""
    out = {}
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX) and name not in NON_CONFIG_ENV:
            path = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
            out[path] = value
    return out


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> GpuawareConfig:
    """Merge the sources and validate. ``overrides`` use dotted keys (``"kafka.bootstrap_servers"``);
    a ``None`` override means the flag was not given."""
    environ = os.environ if environ is None else environ
    if path is None:
        path = environ.get("GPUAWARE_CONFIG") or None
    tree: dict[str, Any] = {}
    origin: dict[tuple[str, ...], str] = {}
    if path is not None:
        for key, value in _flatten(read_yaml(path)).items():
            _set_path(tree, key, value)
            origin[key] = f"file {path}"
    for key, value in env_overrides(environ).items():
        _set_path(tree, key, value)
        origin[key] = f"env {ENV_PREFIX}{'__'.join(key).upper()}"
    for dotted, value in (overrides or {}).items():
        if value is not None:
            key = tuple(dotted.split("."))
            _set_path(tree, key, value)
            origin[key] = "command line"
    try:
        return GpuawareConfig.model_validate(tree)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(str(p) for p in err["loc"])
            reason = err["msg"].removeprefix("Value error, ")
            # Model-level checks name their field first ("sasl_mechanism: ..."): point at it.
            head, sep, rest = reason.partition(": ")
            if sep and " " not in head:
                loc, reason = (*loc, head), rest
            problems.append((".".join(loc), reason, _source_of(loc, origin)))
        raise ConfigError(problems) from None


def _source_of(loc: tuple[str, ...], origin: dict[tuple[str, ...], str]) -> str:
    """Where the value at ``loc`` (or the nearest value given beside it) came from."""
    for depth in range(len(loc), 0, -1):
        for key, source in origin.items():
            if key[:depth] == loc[:depth] or key == loc[: len(key)]:
                return source
    return "defaults"
