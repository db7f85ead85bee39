"""Where the public traces live, for every component.

The traces (Alibaba's openb and GenAI 2026 GPU cluster traces, Gavel's throughput measurements) are public
data the simulator, the benchmarks and some tests read. They are not part of the repository: they sit in
``../shared/traces``, a folder beside the project checkout, or wherever ``GPUAWARE_TRACES_DIR`` points.
"""

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
