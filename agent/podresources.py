"""Which pod owns which GPU, from the kubelet PodResources API (``v1.PodResourcesLister/List``).

The kubelet serves it over gRPC on a unix socket (``/var/lib/kubelet/pod-resources/kubelet.sock``,
mounted read-only into the agent). The response is decoded with a small protobuf reader for the
few fields used here, so no generated stubs are needed. A background thread refreshes the map;
the scrape path only reads a dict.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")


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


def parse_list_response(data: bytes) -> dict[str, tuple[str, str, str]]:
    """GPU device id (UUID) -> (pod, namespace, container) from a ListPodResourcesResponse."""
    owners: dict[str, tuple[str, str, str]] = {}
    for num, _, pod in fields(data):
        if num != 1 or not isinstance(pod, bytes):
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for pnum, _, pval in fields(pod):
            if pnum == 1:
                name = pval.decode()
            elif pnum == 2:
                namespace = pval.decode()
            elif pnum == 3:
                containers.append(pval)
        for container in containers:
            cname, devices = "", []
            for cnum, _, cval in fields(container):
                if cnum == 1:
                    cname = cval.decode()
                elif cnum == 2:
                    devices.append(cval)
            for dev in devices:
                resource, ids = "", []
                for dnum, _, dval in fields(dev):
                    if dnum == 1:
                        resource = dval.decode()
                    elif dnum == 2:
                        ids.append(dval.decode())
                if resource.startswith(GPU_RESOURCES):
                    for device_id in ids:
                        owners[device_id] = (name, namespace, cname)
    return owners


class PodResourcesWatcher:
    """Keeps a GPU -> pod map fresh in a thread; ``lookup`` is what the exporter calls."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, every_s: float = 10.0, timeout_s: float = 5.0):
        self.socket_path = socket_path
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.owners: dict[str, tuple[str, str, str]] = {}
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

    def lookup(self, uuid: str) -> tuple[str, str, str] | None:
        return self.owners.get(uuid)
