"""Power caps from the core's throttle policy (``scheduler.core.throttle``), sent to the agents on agent.control.v1.

A cap is sent when it changes and lifted (cap 0) once the GPU is back within its node's budget and
temperature; a cap that could not be sent is sent again on the next round.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Protocol

import numpy as np

from contract.events import AgentControl, ControlKind, DecisionAction
from scheduler.core.throttle import throttle_decisions
from scheduler.feed import StateView
from scheduler.kube.cache import ClusterCache
from scheduler.kube.decisions import DecisionSink, Outcome
from scheduler.kube.live_state import LiveGpuState
from scheduler.kube.tasks import Tasks
from scheduler.metrics import SchedulerStats
from scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)


class ControlPublisher(Protocol):
    async def __call__(self, record: AgentControl) -> None: ...


async def discard_control(record: AgentControl) -> None:
    """The default publisher: caps are decided and logged, but no agent hears of them."""


class Throttler:
    def __init__(self, view: StateView, gpu_state: LiveGpuState, cache: ClusterCache, settings: SchedulerSettings,
                 stats: SchedulerStats, sink: DecisionSink, tasks: Tasks, publish: ControlPublisher = discard_control,
                 may_act: Callable[[], bool] = lambda: True):
        self.view, self.gpu_state, self.cache, self.settings = view, gpu_state, cache, settings
        self.may_act = may_act
        self.stats, self.sink, self.tasks, self._publish = stats, sink, tasks, publish
        self.capped: dict[tuple[str, int], int] = {}  # (node, GPU index) -> cap in W we asked for

    def throttle(self) -> None:
        """One round: send the caps that changed, lift those no longer wanted."""
        c = self.cache.cluster
        where = self.gpu_state.where
        power = np.zeros(c.gpu_free.shape)
        for gpu_uuid, (i, g) in where.items():
            state = self.view.gpus.get(gpu_uuid)
            if state is not None:
                power[i, g] = state.power_w
        prio = np.full(c.gpu_free.shape, -1)
        for r in self.cache.running.values():
            for g in r.allocation.gpus:
                prio[r.allocation.node, g] = max(prio[r.allocation.node, g], r.workload.priority)
        budget = np.full(len(c), self.settings.node_power_budget_w or np.inf)
        actions = throttle_decisions(power, c.temp, c.gpu_exists, budget, prio)
        want = {(c.names[a.node], a.gpu): (max(1, int(a.cap_w)), a.reason) for a in actions}
        uuid_of = {v: k for k, v in where.items()}
        for (node, g), (cap, reason) in want.items():
            if self.capped.get((node, g)) != cap:
                self.capped[(node, g)] = cap
                self.tasks.spawn(self.send_cap(node, g, uuid_of.get((c.index[node], g)), cap, reason))
        for (node, g) in [k for k in self.capped if k not in want]:
            del self.capped[(node, g)]
            i = c.index.get(node)
            self.tasks.spawn(self.send_cap(node, g, uuid_of.get((i, g)) if i is not None else None, 0,
                                           "back within budget and temperature"))

    async def send_cap(self, node: str, gpu: int, gpu_uuid: str | None, cap_w: int, reason: str) -> None:
        what = f"power cap {cap_w} W on GPU {gpu} of {node}" if cap_w else f"power cap lifted on GPU {gpu} of {node}"
        self.stats.decisions[("THROTTLE", "thermal" if reason.startswith("thermal") else
                              "power" if cap_w else "lifted")] += 1
        await self.sink.record(Outcome(f"{node}/gpu{gpu}", DecisionAction.THROTTLE, node, [what, reason]), None)
        if gpu_uuid is None:
            return
        if not self.may_act():  # a cap sent after the Lease is lost could contradict the new leader's
            self.capped.pop((node, gpu), None)
            return
        try:
            await self._publish(AgentControl(uuid.uuid4().hex, int(time.time() * 1000), node,
                                             ControlKind.POWER_CAP, None, gpu_uuid, cap_w, self.settings.name))
        except Exception as exc:  # the next round sends it again
            self.capped.pop((node, gpu), None)
            log.warning("could not send %s: %s", what, exc)
