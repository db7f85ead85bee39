"""Where the real parts are: the pins of ``realparts/versions.env`` (the one place versions are written)
and the cache ``realparts/*.sh`` build into, outside the repository and shared by every checkout."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSIONS_ENV = REPO / "realparts" / "versions.env"


def cache_dir() -> Path:
    """``$GPUAWARE_REALPARTS_CACHE``, else ``~/.cache/gpuaware/realparts``."""
    env = os.environ.get("GPUAWARE_REALPARTS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpuaware" / "realparts"


def pinned_versions(versions_env: Path | None = None) -> dict[str, str]:
    """The ``KEY=value`` pins of ``realparts/versions.env`` (empty when the file is not there)."""
    pins: dict[str, str] = {}
    try:
        lines = (versions_env or VERSIONS_ENV).read_text().splitlines()
    except OSError:
        return pins
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pins[key.strip()] = value.strip().strip("'\"")
    return pins
