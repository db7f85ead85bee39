"""Which pods hold which GPU, from the kubelet PodResources API (``v1.PodResourcesLister/List``),
and which pod a GPU process belongs to, from its cgroup.

The kubelet serves the API over gRPC on a unix socket (``/var/lib/kubelet/pod-resources/kubelet.sock``,
mounted read-only into the agent). The response is decoded with a small protobuf reader for the
few fields used here, so no generated stubs are needed. A background thread refreshes the map;
the scrape path only reads a dict. Time-sliced GPUs appear once per replica (``GPU-<uuid>::<n>``),
so a GPU maps to a list of pods.

Per-pod values on a shared GPU follow dcgm-exporter's per-process accounting: NVML's running
processes, each PID's pod UID from ``/proc/<pid>/cgroup`` (the kubelet names pod cgroups
``...pod<uid>...``), summed per pod. PodResources names pods but carries no UID, so the UID of a
listed pod comes from ``uids`` (``(namespace, name) -> uid``), filled by whoever can read the
pods of the node; without it a shared GPU is exported once, without pod labels, never copied to
every pod.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")
POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True, slots=True)
class PodRef:
    name: str
    namespace: str
    container: str
    uid: str = ""
    labels: tuple[tuple[str, str], ...] = ()  # the pod's Kubernetes labels, where the pod informer knows them


class PodAttribution(Protocol):
    """What the exporter asks: the pods holding a GPU, and the pod (UID) a process belongs to."""

    def pods(self, uuid: str) -> list[PodRef]: ...

    def uid_of_pid(self, pid: int) -> str | None: ...


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a ``/proc/<pid>/cgroup`` file (v1 or v2; systemd writes ``_`` for ``-``)."""
    m = POD_UID.search(text)
    return m.group(1).replace("_", "-") if m else None


def pod_uid_of_pid(pid: int, proc: str = "/proc") -> str | None:
    try:
        return pod_uid_from_cgroup(Path(proc, str(pid), "cgroup").read_text())
    except OSError:  # gone, or not visible from this PID namespace (the DaemonSet needs hostPID)
        return None


class ProtobufError(ValueError):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of a protobuf message; nested messages stay bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ProtobufError("truncated length-delimited field")
            yield number, wire, data[pos : pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")


def _by_number(message: bytes | int) -> dict[int, list[bytes | int]]:
    if not isinstance(message, bytes):  # a varint or fixed field where a nested message belongs
        raise ProtobufError(f"expected a nested message, got wire value {message!r}")
    out: dict[int, list[bytes | int]] = {}
    for number, _, value in fields(message):
        out.setdefault(number, []).append(value)
    return out


def _text(message: dict[int, list[bytes | int]], number: int) -> str:
    # A name that is not UTF-8 is shown with U+FFFD rather than losing the whole answer's attribution.
    values = message.get(number)
    return values[-1].decode(errors="replace") if values and isinstance(values[-1], bytes) else ""


def parse_list_response(data: bytes) -> dict[str, list[tuple[str, str, str]]]:
    """GPU UUID -> the (pod, namespace, container)s holding it, from a ListPodResourcesResponse.

    PodResources{1 name, 2 namespace, 3 containers}; ContainerResources{1 name, 2 devices};
    ContainerDevices{1 resource_name, 2 device_ids}. A time-sliced replica id ``<uuid>::<n>`` is
    its GPU. A device id that is not UTF-8 (or not a string) names no GPU and is skipped; any other
    malformed input raises :class:`ProtobufError` and nothing else.
    """
    owners: dict[str, list[tuple[str, str, str]]] = {}
    for pod_bytes in _by_number(data).get(1, []):
        pod = _by_number(pod_bytes)
        for container_bytes in pod.get(3, []):
            container = _by_number(container_bytes)
            for device_bytes in container.get(2, []):
                device = _by_number(device_bytes)
                if _text(device, 1).startswith(GPU_RESOURCES):
                    for device_id in device.get(2, []):
                        try:
                            uuid = device_id.decode().split("::")[0]  # type: ignore[union-attr]
                        except (AttributeError, UnicodeDecodeError):
                            continue
                        holders = owners.setdefault(uuid, [])
                        owner = (_text(pod, 1), _text(pod, 2), _text(container, 1))
                        if owner not in holders:
                            holders.append(owner)
    return owners


class PodResourcesWatcher:
    """Keeps a GPU -> pods map fresh in a thread: a :class:`PodAttribution` for the exporter."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, every_s: float = 10.0, timeout_s: float = 5.0,
                 proc: str = "/proc"):
        self.socket_path = socket_path
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.proc = proc
        self.owners: dict[str, list[tuple[str, str, str]]] = {}
        self.uids: dict[tuple[str, str], str] = {}  # (namespace, name) -> pod UID, where known
        self.labels: dict[tuple[str, str], dict[str, str]] = {}  # (namespace, name) -> pod labels, where known
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return Path(self.socket_path).exists()

    def refresh(self) -> None:
        import grpc

        with grpc.insecure_channel(f"unix://{self.socket_path}") as channel:
            call = channel.unary_unary(LIST_METHOD, request_serializer=None, response_deserializer=None)
            self.owners = parse_list_response(call(b"", timeout=self.timeout_s))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # any gRPC or decode failure: keep the last map, try again later
                self.errors += 1
                log.warning("pod-resources refresh failed: %s", exc)
            self._stop.wait(self.every_s)

    def start(self) -> PodResourcesWatcher:
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="pod-resources", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=self.timeout_s + 1)

    def pods(self, uuid: str) -> list[PodRef]:
        return [PodRef(name, ns, container, self.uids.get((ns, name), ""),
                       tuple(self.labels.get((ns, name), {}).items()))
                for name, ns, container in self.owners.get(uuid, ())]

    def uid_of_pid(self, pid: int) -> str | None:
        return pod_uid_of_pid(pid, self.proc)
