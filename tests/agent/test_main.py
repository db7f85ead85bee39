"""What starting the agent imports: its memory budget (60 MiB for 8 GPUs, docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys


def test_the_agent_and_the_shared_configuration_import_no_numpy():
    """numpy is 14 MiB of resident memory; the agent's detectors and simulator do without it, and the
    configuration every process loads validates scheduler.policy without the scheduler's framework."""
    code = ("import sys, gpuaware.agent.main, gpuaware.agent.collectors.nvml, gpuaware.config, gpuaware.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy' or m.startswith('gpuaware.scheduler')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("['gpuaware.scheduler', 'gpuaware.scheduler.core', 'gpuaware.scheduler.core.policy_specs', "
                           "'gpuaware.scheduler.settings']")
