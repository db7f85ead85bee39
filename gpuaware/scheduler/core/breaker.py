"""The remediation safety net, decided centrally: a circuit breaker on quarantines, and the lemon-node ledger.

One scheduler (the Lease holder) decides for the whole cluster, so one bad driver roll-out or a
broken exporter that makes every agent cry wolf cannot drain the fleet: no more than
``max_fraction`` of the nodes may be newly quarantined within ``window_s`` (NVSentinel's default,
50 % in 5 minutes). A node already quarantined in the window costs nothing more. The breaker
*holds* (refuses) past that; what it held is counted and retried on the next state update.

The ledger keeps each node's remediations for a week: ``lemon_after`` or more in 7 days flags a
lemon node (NVSentinel's rule, 5), and the gaps between them give the mean time between
interventions (MTBI). Pure: the caller passes the time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WEEK_S = 7 * 24 * 3600.0


@dataclass
class QuarantineBreaker:
    max_fraction: float = 0.5
    window_s: float = 300.0
    quarantined: deque = field(default_factory=deque)  # (ts, node), oldest first
    held: int = 0

    def _trim(self, now: float) -> None:
        while self.quarantined and self.quarantined[0][0] <= now - self.window_s:
            self.quarantined.popleft()

    def allow(self, node: str, now: float, total_nodes: int) -> bool:
        """May ``node`` be quarantined now? Records it when it may."""
        self._trim(now)
        nodes = {n for _, n in self.quarantined}
        if node in nodes:
            return True
        if len(nodes) + 1 > max(1, int(self.max_fraction * total_nodes)):
            self.held += 1
            return False
        self.quarantined.append((now, node))
        return True


@dataclass
class RemediationLedger:
    lemon_after: int = 5
    history: dict[str, deque] = field(default_factory=dict)  # node -> remediation times, a week of them

    def record(self, node: str, now: float) -> float | None:
        """Note a remediation; returns the time since the node's previous one (an MTBI sample), if any."""
        times = self.history.setdefault(node, deque())
        while times and times[0] <= now - WEEK_S:
            times.popleft()
        gap = now - times[-1] if times else None
        times.append(now)
        return gap

    def lemon(self, node: str) -> bool:
        return len(self.history.get(node, ())) >= self.lemon_after

    def lemons(self) -> list[str]:
        return sorted(n for n in self.history if self.lemon(n))
