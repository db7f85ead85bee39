"""The agent's proof of its node: the pod's projected ServiceAccount token, attached when a record is sent.

The kubelet writes the token (audience ``gpuaware.contract.identity.TOKEN_AUDIENCE``) into a projected volume
and rotates it before it expires; the file is re-read when its mtime changes. The token is added at
send time, not when a record is spooled, so a backlog replayed after a long outage carries a live
token, and no token is written to the spool's disk.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gpuaware.contract.identity import NODE_TOKEN_HEADER

log = logging.getLogger(__name__)


class NodeToken:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._mtime: float | None = None
        self._header: list[tuple[str, bytes]] = []
        self._missing = False  # logged once per disappearance

    def headers(self) -> list[tuple[str, bytes]]:
        """``[(NODE_TOKEN_HEADER, token)]``, or ``[]`` while the file is missing (records then go out
        unproven and a stream that requires node identity dead-letters them: never a silent pass)."""
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError as exc:
            if not self._missing:
                log.warning("no node token at %s (%s): records go out without one", self.path, exc)
            self._mtime, self._header, self._missing = None, [], True
            return []
        self._missing = False
        if mtime != self._mtime:
            token = self.path.read_bytes().strip()
            self._mtime, self._header = mtime, [(NODE_TOKEN_HEADER, token)] if token else []
        return list(self._header)
