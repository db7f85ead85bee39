"""Power caps from the core's throttle policy (``gpuaware.scheduler.core.throttle``), sent to the agents on
agent.control.v1.

A cap is sent when it changes and lifted (cap 0) once the GPU is back within its node's budget and
temperature; a cap that could not be sent is sent again on the next round.

Durable. Each cap sent (and each lift) is recorded in its Node's ``gpuaware.io/power-caps``
annotation, and the throttler starts from the caps the annotations record: a leader that takes over
lifts the caps its predecessor set once they are no longer wanted, instead of leaving them for ever.
The control records of caps are keyed by node and GPU (``AgentControl.key``), so compaction keeps
every GPU's newest cap beside the node's sampling policy, and a restarted agent re-applies them.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Protocol

import numpy as np
from kubernetes.client.exceptions import ApiException

from gpuaware.contract import annotations
from gpuaware.contract.events import AgentControl, ControlKind, DecisionAction
from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS
from gpuaware.scheduler.core.throttle import throttle_decisions
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube.cache_view import CacheView
from gpuaware.scheduler.kube.decisions import DecisionSink, Outcome
from gpuaware.scheduler.kube.live_state import LiveGpuState
from gpuaware.scheduler.kube.tasks import Tasks
from gpuaware.scheduler.metrics import SchedulerStats
from gpuaware.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)


class ControlPublisher(Protocol):
    async def __call__(self, record: AgentControl) -> None: ...


async def discard_control(record: AgentControl) -> None:
    """The default publisher: caps are decided and logged, but no agent hears of them."""


class CapRecorder(Protocol):
    async def __call__(self, node: str, gpu: int, cap_w: int) -> None: ...


class Throttler:
    def __init__(self, view: StateView, gpu_state: LiveGpuState, cache: CacheView, settings: SchedulerSettings,
                 stats: SchedulerStats, sink: DecisionSink, tasks: Tasks, publish: ControlPublisher = discard_control,
                 may_act: Callable[[], bool] = lambda: True, record: CapRecorder | None = None):
        self.view, self.gpu_state, self.cache, self.settings = view, gpu_state, cache, settings
        self.may_act = may_act
        self.stats, self.sink, self.tasks, self._publish = stats, sink, tasks, publish
        self._record = record
        self.capped: dict[tuple[str, int], int] = {}  # (node, GPU index) -> cap in W we asked for
        self._restored = False

    def restore(self) -> None:
        """Take over the caps the Node annotations record (a previous leader's, or this one's before a restart)."""
        for name, node in self.cache.nodes.items():
            for gpu, cap in annotations.power_caps(node).items():
                self.capped.setdefault((name, gpu), cap)
        self._restored = True

    def throttle(self) -> None:
        """One round: send the caps that changed, lift those no longer wanted."""
        if not self._restored:
            self.restore()
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
            return
        if self._record is not None:
            try:
                await self._record(node, gpu, cap_w)
            except (ApiException, *TRANSPORT_ERRORS) as exc:  # the cap is in force; only its record is missing
                self.stats.api_errors[("patch-node", getattr(exc, "status", 0) or 0)] += 1
                log.warning("could not record %s on the Node: %s", what, exc)
