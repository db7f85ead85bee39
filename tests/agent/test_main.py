"""What starting the agent imports: its memory budget (60 MiB for 8 GPUs, docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys


def test_the_agent_and_the_shared_configuration_import_no_numpy():
    """numpy is 14 MiB of resident memory; the agent's detectors and simulator do without it, and the
    configuration every process loads validates scheduler.policy without the scheduler's framework."""
    code = ("import sys, agent.main, agent.collectors.nvml, gpuaware.config, gpuaware.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'scheduler')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['scheduler', 'scheduler.core', 'scheduler.core.policy_specs', 'scheduler.settings']"
