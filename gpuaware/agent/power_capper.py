"""The power capper: the one privileged piece of the agent pod, and all it may do is set power limits.

NVML sets a power limit only for a caller holding CAP_SYS_ADMIN (the driver checks it on every
call), and the agent runs as non-root with every capability dropped. So the agent pod carries this
second container (root, CAP_SYS_ADMIN only, no Kafka, no API token, no network listener): it
answers requests from the agent on a unix socket in an emptyDir the two containers share, and
does nothing else. A request is one JSON line::

    {"gpu": "GPU-<uuid>", "watts": 450}      # 0 restores the board's default limit

and the answer one JSON line, ``{"ok": true, "gpu": ..., "applied_w": 450.0}`` (the limit read
back from NVML), or ``{"ok": false, "field": ..., "reason": ...}``. Only GPUs of this node, only
limits inside the board's own [min, max] constraints, only from the agent's user id (the peer's
credentials on the socket); anything else is refused with the field and the reason, and no
request, however malformed, stops the capper.

Standard library and pynvml only, so the code that runs with the privilege stays this file.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
import socketserver
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    pynvml = None

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 256  # a request is ~70 bytes; more is not a request
TIMEOUT_S = 2.0  # a client that stalls mid-request is dropped, never waited on
FIELDS = frozenset({"gpu", "watts"})


class Refused(ValueError):
    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


@dataclass(frozen=True)
class Board:
    uuid: str
    handle: Any
    min_w: float
    max_w: float


class Nvml:
    """The NVML calls the capper makes, over the node's GPUs found at start."""

    def __init__(self) -> None:
        if pynvml is None:
            raise RuntimeError("nvidia-ml-py is not installed")
        pynvml.nvmlInit()
        self.boards: dict[str, Board] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            try:
                lo_mw, hi_mw = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
            except pynvml.NVMLError as exc:  # a board without power management: requests for it are refused
                log.warning("GPU %s has no power limits to set: %s", uuid, exc)
                continue
            self.boards[uuid] = Board(uuid, h, lo_mw / 1000, hi_mw / 1000)

    def apply(self, board: Board, watts: float) -> float:
        """Set the limit (0: the default) and return the one in force, read back, in watts."""
        mw = (pynvml.nvmlDeviceGetPowerManagementDefaultLimit(board.handle) if watts == 0
              else round(watts * 1000))
        pynvml.nvmlDeviceSetPowerManagementLimit(board.handle, mw)
        return pynvml.nvmlDeviceGetPowerManagementLimit(board.handle) / 1000

    def close(self) -> None:
        pynvml.nvmlShutdown()


def parse(line: bytes, boards: dict[str, Board]) -> tuple[Board, float]:
    """A request line -> (board, watts); :class:`Refused` names the field and the reason."""
    if len(line) > MAX_REQUEST_BYTES:
        raise Refused("request", f"longer than {MAX_REQUEST_BYTES} bytes")
    try:
        req = json.loads(line)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise Refused("request", f"not JSON: {exc}") from None
    if not isinstance(req, dict):
        raise Refused("request", f"a JSON object is needed, not {type(req).__name__}")
    unknown = sorted(set(req) - FIELDS)
    if unknown:
        raise Refused(unknown[0], "unknown field")
    gpu, watts = req.get("gpu"), req.get("watts")
    if not isinstance(gpu, str):
        raise Refused("gpu", "a GPU UUID string is needed")
    board = boards.get(gpu)
    if board is None:
        raise Refused("gpu", f"{gpu[:64]!r} is not a GPU of this node")
    if isinstance(watts, bool) or not isinstance(watts, int | float) or not math.isfinite(watts):
        raise Refused("watts", "a finite number of watts is needed (0 restores the default)")
    if watts != 0 and not board.min_w <= watts <= board.max_w:
        raise Refused("watts", f"{watts} W is outside {board.uuid}'s limits [{board.min_w:g}, {board.max_w:g}] W")
    return board, float(watts)


def answer(line: bytes, nvml: Nvml) -> dict[str, Any]:
    """The reply to one request line; never raises."""
    try:
        board, watts = parse(line, nvml.boards)
    except Refused as exc:
        return {"ok": False, "field": exc.field, "reason": exc.reason}
    try:
        applied = nvml.apply(board, watts)
    except Exception as exc:  # NVML's refusal, or anything else: the capper answers and goes on
        return {"ok": False, "field": "watts", "reason": f"NVML refused {watts:g} W on {board.uuid}: {exc}"}
    log.info("power limit of %s: %s W requested, %g W in force", board.uuid, watts or "default", applied)
    return {"ok": True, "gpu": board.uuid, "applied_w": applied}


def peer_uid(sock: socket.socket) -> int | None:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", creds)[1]


def make_server(path: str, nvml: Nvml, allow_uid: int | None,
                peer: Callable[[socket.socket], int | None] = peer_uid) -> socketserver.UnixStreamServer:
    """One request per connection, one connection at a time (caps are rare; the agent is the only client)."""

    class Handler(socketserver.StreamRequestHandler):
        timeout = TIMEOUT_S

        def handle(self) -> None:
            try:
                # The line is read before the peer is judged so that a refused client, still sending, reads
                # the refusal rather than a reset connection.
                line = self.rfile.readline(MAX_REQUEST_BYTES + 1).rstrip(b"\n")
                uid = peer(self.connection)
                if allow_uid is not None and uid != allow_uid:
                    reply = {"ok": False, "field": "peer", "reason": f"uid {uid} may not set power limits"}
                else:
                    reply = answer(line, nvml)
                self.wfile.write(json.dumps(reply).encode() + b"\n")
            except OSError as exc:  # the client went away or stalled past the timeout
                log.warning("power-cap request dropped: %s", exc)

    if os.path.exists(path):
        os.unlink(path)  # a stale socket of a previous run of this container
    server = socketserver.UnixStreamServer(path, Handler)
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuaware.agent.power_capper", description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True, help="unix socket to listen on (in the emptyDir shared with the agent)")
    ap.add_argument("--allow-uid", type=int, default=None,
                    help="only this peer user id may ask (the agent's runAsUser); default: any")
    ap.add_argument("--socket-gid", type=int, default=None,
                    help="group that owns the socket, mode 0660 (the agent's group); default: this process's")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    nvml = Nvml()
    server = make_server(args.socket, nvml, args.allow_uid)
    os.chmod(args.socket, 0o660)
    if args.socket_gid is not None:
        os.chown(args.socket, -1, args.socket_gid)
    log.info("power capper on %s for %d GPU(s)", args.socket, len(nvml.boards))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        nvml.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
