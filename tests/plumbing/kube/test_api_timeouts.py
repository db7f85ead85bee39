"""Kubernetes API calls and watches give up on a server that stops answering instead of hanging."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, Informer, KubeApi, WatchSpec, connect


class SilentServer:
    """Answers a list with an empty one; takes every other request (a watch, a GET) and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[str] = []
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                line = head.split(b"\r\n", 1)[0].decode()
                self.requests.append(line)
                if "watch=true" in line or "/leases/" in line:
                    if "watch=true" in line:  # the stream starts, then goes quiet for good
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\n")
                    threading.Event().wait()
                body = json.dumps({"kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()


@contextlib.contextmanager
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


def in_thread(fn: Any, timeout: float) -> tuple[bool, BaseException | None]:
    """(finished within ``timeout``, what it raised); a daemon thread, so a hung call cannot hang the tests."""
    result: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result), (result[0] if result else None)


def test_api_calls_time_out():
    with silent_server() as server:
        api = KubeApi(connect(server.url), request_timeout_s=0.3)
        started = time.monotonic()
        finished, exc = in_thread(lambda: api.read_lease("gpuaware", "gpuaware-scheduler"), timeout=10)
        assert finished, "read_lease hung on a server that never answers"
        assert isinstance(exc, TRANSPORT_ERRORS) and time.monotonic() - started < 5, exc


def test_a_silent_watch_is_abandoned_and_started_again():
    with silent_server() as server:
        api = KubeApi(connect(server.url))
        informer = Informer(WatchSpec("pods", api.core.list_pod_for_all_namespaces), lambda items: None,
                            lambda kind, obj: None, watch_timeout_s=1, request_timeout_s=0.3)
        informer.start()
        try:
            deadline = time.monotonic() + 10
            while sum("watch=true" in r for r in server.requests) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            watches = [r for r in server.requests if "watch=true" in r]
            assert len(watches) >= 2, f"the watch was never given up: {server.requests}"
            assert "timeoutSeconds=1" in watches[0]
        finally:
            informer._stop.set()
            server.close()
