"""The agent's side of the power capper (``gpuaware.agent.power_capper``): one request, one answer, over its socket.

The agent itself may not set power limits (non-root, no capabilities); it asks the capper in the
same pod. A refusal or an unreachable capper raises ``RuntimeError`` with the capper's field and
reason, which the runtime logs as a rejected cap: no acknowledgement is written for it.
"""

from __future__ import annotations

import json
import socket

from gpuaware.agent.power_capper import MAX_REQUEST_BYTES


class CapperClient:
    def __init__(self, path: str, timeout_s: float = 5.0):
        self.path = path
        self.timeout_s = timeout_s

    def set_limit(self, uuid: str, watts: float) -> float:
        """Ask for ``watts`` on ``uuid`` (0: the default limit); the limit in force afterwards, in watts."""
        line = json.dumps({"gpu": uuid, "watts": watts}).encode() + b"\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout_s)
                s.connect(self.path)
                s.sendall(line)
                reply = s.makefile("rb").readline(4 * MAX_REQUEST_BYTES + 1024)
        except OSError as exc:
            raise RuntimeError(f"power capper at {self.path} unreachable: {exc}") from exc
        try:
            answer = json.loads(reply)
            if answer.get("ok") is True:
                return float(answer["applied_w"])
            field, reason = answer["field"], answer["reason"]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise RuntimeError(f"power capper at {self.path} answered {reply[:200]!r}: {exc}") from exc
        raise RuntimeError(f"power capper refused {watts:g} W on {uuid}: {field}: {reason}")
