"""The agent publishing its node's GPUs as DRA ResourceSlices (``agent.resource_slices``, off by default).

For nodes no NVIDIA DRA driver runs on, so that gpuaware's allocator and kube-scheduler see their GPUs as
devices (docs/dra.md). On a node with NVIDIA's driver leave it off: the driver publishes the same devices
(same driver name, same device names) and its kubelet plugin prepares them for containers, which the agent
does not do. Whole GPUs only: the agent does not enumerate MIG placements.

Published once at start (idempotent: a restart with the same GPUs writes nothing), retried every
``RETRY_S`` until it succeeds; a failure is counted and logged, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Sequence

from gpuaware.agent.core import AgentCore
from gpuaware.agent.readings import GpuDevice
from gpuaware.contract import dra
from gpuaware.plumbing.kube.resource_slices import NodeGpu, SlicePublisher

log = logging.getLogger(__name__)

RETRY_S = 30.0
_NVML_BUS_ID = re.compile(r"^(?:[0-9a-fA-F]{4})?([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def pci_bus_id(nvml: str) -> str | None:
    """NVML's ``00000000:3B:00.0`` as Kubernetes' standard attribute wants it, ``0000:3b:00.0``; None if odd."""
    m = _NVML_BUS_ID.match(nvml or "")
    return f"{m.group(1)}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower() if m else None


def nvlink_islands(devices: Sequence[GpuDevice]) -> dict[str, int]:
    """UUID -> island: GPUs joined by NVLink (directly or through others) share one, numbered from 0 in index
    order. A GPU whose peers are unknown is an island of its own."""
    by_uuid = {d.uuid: d for d in devices}
    island: dict[str, int] = {}
    for d in sorted(devices, key=lambda d: d.index):
        if d.uuid in island:
            continue
        n = len(set(island.values()))
        todo = [d.uuid]
        while todo:
            uuid = todo.pop()
            if uuid in island:
                continue
            island[uuid] = n
            todo += [p for p in by_uuid[uuid].nvlink_peers if p in by_uuid and p not in island]
    return island


def _version(text: str) -> str:
    try:
        return dra.semver(text)
    except ValueError:  # published as 0.0.0 rather than not at all
        return "0.0"


def node_gpus(core: AgentCore, shareable: bool = False) -> list[NodeGpu]:
    """The node's GPUs to publish; ``shareable`` (``agent.resource_slices_shareable``): each allows multiple
    allocations, claims taking memory shares of it (DRA consumable capacity)."""
    devices = list(core.devices.values()) if isinstance(core.devices, dict) else list(core.devices)
    islands = nvlink_islands(devices)
    return [NodeGpu(index=d.index, uuid=d.uuid, model=d.model, memory_bytes=d.fb_total_mib * 2**20,
                    nvlink_island=islands.get(d.uuid), pci_bus_id=pci_bus_id(d.pci_bus_id),
                    driver_version=_version(d.driver_version), shareable=shareable)
            for d in sorted(devices, key=lambda d: d.index) if d.fb_total_mib > 0]


async def publish_until_done(publisher: SlicePublisher, cores: Sequence[AgentCore], stop: asyncio.Event,
                             retry_s: float = RETRY_S, shareable: bool = False) -> None:
    pending = list(cores)
    while pending and not stop.is_set():
        for core in list(pending):
            try:
                result = await asyncio.to_thread(publisher.publish, core.node, node_gpus(core, shareable))
                log.info("ResourceSlices of %s: generation %d (%d written, %d deleted)", core.node,
                         result.generation, result.written, result.deleted)
                pending.remove(core)
            except Exception as exc:  # the API's answer or a broken connection: tried again, never fatal
                log.warning("publishing the ResourceSlices of %s failed: %s; again in %.0fs", core.node, exc, retry_s)
        if pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), retry_s)
