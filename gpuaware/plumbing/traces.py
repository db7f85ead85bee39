"""Where the shared public traces live (``../shared/traces`` beside the checkout), for every component."""

from __future__ import annotations

import os
from pathlib import Path


def traces_dir() -> Path:
    """``GPUAWARE_TRACES_DIR``, else ``../shared/traces`` beside the project checkout or the cwd."""
    env = os.environ.get("GPUAWARE_TRACES_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[3] / "shared" / "traces", Path.cwd().parent / "shared" / "traces",
                   Path.cwd() / "shared" / "traces"]
    for c in candidates:
        if (c / "alibaba-gentd26").is_dir() or (c / "alibaba-openb").is_dir():
            return c
    raise FileNotFoundError(
        "traces not found; set GPUAWARE_TRACES_DIR to the folder holding alibaba-gentd26/, alibaba-openb/ and gavel/ "
        "(tried: " + ", ".join(str(c) for c in candidates) + ")"
    )
