"""The live agent: one asyncio task per concern around the pure ``AgentCore``.

Tasks: sampling (tick every node's core at the watch interval), flushing (telemetry batches per
window, at once on an event), publishing (spool -> Kafka), syncing the spool to disk (every
``fsync_interval_s``), control (``agent.control.v1``: policy and power caps), the policy file
watcher (hot reload of the mounted ConfigMap), and, where the Kubernetes API can be read, the
node's GPU cordons (``gpuaware.agent.cordons``).

The publisher runs beside the others until they stop, so nothing would notice it dying: it is
supervised, an unexpected exception logged, counted in ``task_restarts`` and the task restarted
with a back-off (doubling from ``publisher_restart_s`` to 30 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from gpuaware.agent.collectors.base import Collector
from gpuaware.agent.core import AgentCore, BatchBuilder
from gpuaware.agent.exporter import AgentStats
from gpuaware.agent.publisher import Publisher
from gpuaware.agent.sampling import PolicyError, SamplingPolicy, load_policy, parse_policy
from gpuaware.agent.spool import DiskSpool
from gpuaware.contract import events, topics
from gpuaware.contract.events import AgentControl, ControlKind
from gpuaware.plumbing import observability
from gpuaware.plumbing.kafka_admin import check_topics, topic_partitions
from gpuaware.plumbing.kafka_settings import KafkaSettings

if TYPE_CHECKING:
    from gpuaware.agent.cordons import CordonWatcher

log = logging.getLogger(__name__)
tracer = observability.tracer("gpuaware.agent")


class AgentRuntime:
    def __init__(self, collectors: Sequence[Collector], settings: KafkaSettings, policy: SamplingPolicy,
                 spool_dir: str | Path, policy_path: str | Path | None = None,
                 clock: Callable[[], float] = time.time, spool_max_bytes: int = 256 * 2**20):
        self.settings = settings
        self.policy = policy
        self.policy_path = Path(policy_path) if policy_path else None
        self.clock = clock
        self.cores = [AgentCore(c, policy, clock) for c in collectors]
        self.builders = [BatchBuilder(core.node, core.devices) for core in self.cores]
        self.stats = AgentStats()
        self.cordons: CordonWatcher | None = None  # set when the Kubernetes API can be read
        self.spool = DiskSpool(spool_dir, max_bytes=spool_max_bytes, segment_bytes=min(4 * 2**20, spool_max_bytes // 4))
        self.publisher = Publisher(settings, self.spool, self.stats)
        self.publisher_restart_s = 1.0
        self._flush_now = asyncio.Event()
        self.event_listeners: list[Callable[[events.GpuEvent], None]] = []
        self.events_published = 0
        self.samples_published = 0

    # ------------------------------------------------------------------ policy

    def apply_policy(self, policy: SamplingPolicy, nodes: set[str] | None = None) -> None:
        for core in self.cores:
            if nodes is None or core.node in nodes:
                core.set_policy(policy)
        if nodes is None:
            self.policy = policy
        self.stats.policy_reloads += 1

    def apply_policy_text(self, text: str, source: str, nodes: set[str] | None = None) -> bool:
        try:
            policy = parse_policy(text, source)
        except PolicyError as exc:
            self.stats.policy_errors += 1
            log.error("sampling policy rejected, keeping the current one: %s", exc)
            return False
        self.apply_policy(policy, nodes)
        log.info("sampling policy applied from %s", source)
        return True

    async def watch_policy_file(self, stop: asyncio.Event, every_s: float = 2.0) -> None:
        if self.policy_path is None:
            return
        last = None
        while not stop.is_set():
            try:
                # ConfigMap volumes swap a symlink; stat() follows it, so mtime changes on update.
                mtime = os.stat(self.policy_path).st_mtime_ns
            except OSError:
                mtime = None
            if mtime is not None and mtime != last:
                if last is not None:
                    try:
                        self.apply_policy(load_policy(self.policy_path))
                        log.info("sampling policy reloaded from %s", self.policy_path)
                    except PolicyError as exc:
                        self.stats.policy_errors += 1
                        log.error("sampling policy rejected, keeping the current one: %s", exc)
                    except Exception:  # a bad file must not stop the watcher (or the agent)
                        self.stats.policy_errors += 1
                        log.exception("sampling policy %s could not be applied, keeping the current one",
                                      self.policy_path)
                last = mtime
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)

    # ------------------------------------------------------------------ control topic

    def handle_control(self, cmd: AgentControl) -> None:
        targets = {c.node for c in self.cores} if cmd.target == "*" else {cmd.target}
        mine = [c for c in self.cores if c.node in targets]
        if not mine:
            return
        self.stats.control_commands[cmd.kind] = self.stats.control_commands.get(cmd.kind, 0) + 1
        if cmd.kind is ControlKind.SAMPLING_POLICY and cmd.sampling_policy_yaml is not None:
            self.apply_policy_text(cmd.sampling_policy_yaml, f"control {cmd.command_id}",
                                   None if cmd.target == "*" else targets)
        elif cmd.kind is ControlKind.POWER_CAP and cmd.power_cap_w is not None:
            for core in mine:
                for d in core.devices:
                    if cmd.gpu_uuid in (None, d.uuid):
                        try:
                            if cmd.power_cap_w <= 0:  # 0: the cap is lifted
                                core.collector.reset_power_limit(d.index)
                                core.applied_caps.pop(d.index, None)
                                log.info("power cap lifted on %s", d.uuid)
                                continue
                            core.collector.set_power_limit(d.index, cmd.power_cap_w)
                            core.applied_caps[d.index] = cmd.power_cap_w
                            log.info("power cap %d W on %s", cmd.power_cap_w, d.uuid)
                        except (ValueError, RuntimeError) as exc:
                            log.error("power cap %s on %s rejected: %s", cmd.power_cap_w, d.uuid, exc)
        else:
            log.warning("control command %s of kind %s ignored", cmd.command_id, cmd.kind)

    def take_control(self, rec: ConsumerRecord) -> None:
        """Apply one control record; whatever is wrong with it is logged and counted, never raised.

        The control topic is compacted and read from the beginning at every start, so a record
        that raised here would stop every agent at every restart. A rejected record is not
        dead-lettered: the agent has no grant on ``agent.control.v1.dlq`` (least privilege,
        docs/reliability.md), every agent of the DaemonSet would write its own copy at every
        restart, and the record stays readable on the control topic itself at the offset logged.
        """
        try:
            cmd = events.decode_for_topic(topics.CONTROL, rec.value)
        except events.DecodeError as exc:
            self._reject_control(rec, "undecodable", exc)
            return
        try:
            self.handle_control(cmd)
        except Exception as exc:  # one bad record must not stop the consumer
            self._reject_control(rec, "error", exc)

    def _reject_control(self, rec: ConsumerRecord, reason: str, exc: BaseException) -> None:
        self.stats.control_rejected[reason] = self.stats.control_rejected.get(reason, 0) + 1
        log.error("control record %s/%d@%d rejected (%s), skipped: %s: %s", topics.CONTROL, rec.partition, rec.offset,
                  reason, type(exc).__name__, exc, exc_info=reason == "error")

    async def consume_control(self, stop: asyncio.Event) -> None:
        """Read the compacted control topic from the beginning (last policy wins), then follow it."""
        while not stop.is_set():
            # An idle one-partition topic: a policy change may wait half a second, and 6,250 agents' empty fetches
            # at kafka.fetch_max_wait_ms (100) would be ~62,500 requests/s at one broker.
            consumer = AIOKafkaConsumer(**self.settings.consumer_kwargs(None, fetch_max_wait_ms=500))
            try:
                await consumer.start()
                # Assigned, not subscribed (no group: every agent reads all of it), so the
                # partitions come from the topic's metadata, asked for explicitly.
                tps = await topic_partitions(self.settings, topics.CONTROL)
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                while not stop.is_set():
                    batches = await consumer.getmany(timeout_ms=500)
                    for records in batches.values():
                        for rec in records:
                            self.take_control(rec)
            except (KafkaError, OSError) as exc:
                log.warning("control consumer: %s; retrying", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 2.0)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(consumer.stop(), 5)

    # ------------------------------------------------------------------ sampling and flushing

    def tick(self, now: float) -> None:
        for core, builder in zip(self.cores, self.builders, strict=True):
            out = core.tick(now)
            builder.add(out.samples, out.points)
            for ev in out.events:
                with tracer.start_as_current_span("agent.event", attributes={"gpu": ev.gpu_uuid, "kind": ev.kind}):
                    self.publisher.enqueue(topics.EVENTS, ev.key(), events.encode(ev), observability.inject_headers())
                self.events_published += 1
                self._flush_now.set()
                for listener in self.event_listeners:
                    listener(ev)

    def flush(self) -> None:
        for builder in self.builders:
            batch = builder.build()
            if batch is None:
                continue
            with tracer.start_as_current_span("agent.publish", attributes={"node": batch.node,
                                                                           "samples": len(batch.samples)}):
                self.publisher.enqueue(topics.TELEMETRY, batch.key(), events.encode(batch),
                                       observability.inject_headers())
            self.samples_published += len(batch.samples)

    async def sample_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = self.clock()
            self.tick(started)
            delay = max(0.0, min(c.policy.floor_s for c in self.cores) - (self.clock() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def flush_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._flush_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush_now.wait(), self.policy.flush_s)
            self.flush()
        self.flush()

    async def spool_sync_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.spool.fsync_interval_s)
            self.spool.sync()

    async def supervised(self, name: str, run: Callable[[asyncio.Event], Awaitable[None]],
                         stop: asyncio.Event) -> None:
        """Run ``run(stop)`` to its end, restarting it after an unexpected exception."""
        delay = self.publisher_restart_s
        while True:
            try:
                await run(stop)
                return
            except Exception:
                self.stats.task_restarts[name] = self.stats.task_restarts.get(name, 0) + 1
                if stop.is_set():
                    log.exception("%s task failed while stopping", name)
                    return
                log.exception("%s task failed; restarting it in %.1fs", name, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, 30.0)

    async def check_topics(self, control: bool = True, timeout_s: float = 10.0) -> None:
        """Refuse to start without the agent's topics or grants (``TopicUnavailable`` names them).

        A broker not reachable yet is no reason to stop: samples wait in the spool until it is.
        """
        names = (topics.TELEMETRY, topics.EVENTS, *((topics.CONTROL,) if control else ()))
        try:
            await asyncio.wait_for(check_topics(self.settings, [topics.spec(n) for n in names]), timeout_s)
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("Kafka not reachable at start (%s); sampling into the spool meanwhile", exc)

    async def run(self, stop: asyncio.Event, duration_s: float | None = None, control: bool = True) -> None:
        await self.check_topics(control)
        inner = asyncio.Event()

        async def watchdog() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), duration_s)
            inner.set()

        producers = [self.sample_loop(inner), self.flush_loop(inner), self.watch_policy_file(inner),
                     self.spool_sync_loop(inner)]
        if control:
            producers.append(self.consume_control(inner))
        if self.cordons is not None:
            producers.append(self.cordons.run(inner))
        publisher_stop = asyncio.Event()
        publisher = asyncio.create_task(self.supervised("publisher", self.publisher.run, publisher_stop))
        try:
            await asyncio.gather(watchdog(), *producers)
        finally:
            # Stop sampling first, then let the publisher drain what the last flush spooled.
            publisher_stop.set()
            await publisher
            self.spool.close()
