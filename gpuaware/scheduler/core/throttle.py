"""Throttling: power caps when a node exceeds its power budget or a GPU runs hot.

Pure: from per-GPU power and temperature estimates, the node's budget and each GPU's most
important resident (priority), decide which GPUs to cap and to what. Lowest-priority, most
power-hungry GPUs are capped first; a GPU at or above ``hot_c`` is capped whatever runs on it.
The caller sends the caps (``agent.control.v1`` POWER_CAP in production) and defers deferrable
work on throttled nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ThrottleAction:
    node: int
    gpu: int
    cap_w: float
    reason: str


def throttle_decisions(power_w: np.ndarray, temp_c: np.ndarray, exists: np.ndarray, budget_w: np.ndarray,
                       priority: np.ndarray, cap_fraction: float = 0.7, hot_c: float = 85.0) -> list[ThrottleAction]:
    """``power_w``, ``temp_c``, ``priority`` (-1 = idle GPU): (N, G); ``budget_w``: (N,) watts per node."""
    actions: list[ThrottleAction] = []
    capped = np.zeros_like(exists, dtype=bool)
    hot = exists & (temp_c >= hot_c)
    for n, g in zip(*np.nonzero(hot), strict=True):
        actions.append(ThrottleAction(int(n), int(g), float(power_w[n, g] * cap_fraction),
                                      f"thermal: {temp_c[n, g]:.0f} °C >= {hot_c:.0f} °C"))
        capped[n, g] = True
    effective = np.where(capped, power_w * cap_fraction, power_w) * exists
    over = effective.sum(axis=1) - budget_w
    for n in np.flatnonzero(over > 0):
        excess = float(over[n])
        order = sorted((g for g in np.flatnonzero(exists[n] & ~capped[n]) if priority[n, g] >= 0),
                       key=lambda g: (priority[n, g], -power_w[n, g]))
        for g in order:
            if excess <= 0:
                break
            saved = float(power_w[n, g] * (1 - cap_fraction))
            why = f"power: node {effective[n].sum():.0f} W over its {budget_w[n]:.0f} W budget"
            actions.append(ThrottleAction(int(n), int(g), float(power_w[n, g] * cap_fraction), why))
            excess -= saved
    return actions
