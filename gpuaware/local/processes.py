"""Child processes that never outlive us: the local broker and its storage.

Each child is started with PR_SET_PDEATHSIG, so the kernel kills it if this process dies in any
way (SIGKILL included); ``stop()`` handles the orderly path: SIGTERM, a grace period, SIGKILL.
The signal fires when the *thread* that forked the child exits, so every child is forked from one
long-lived spawner thread, whatever thread asks for it.

Each child also runs in its own session: Ctrl-C in a terminal signals the whole foreground process
group, and a broker that died on it at once would leave its clients failing while they stop. The
owner stops its children, in its own order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuaware-spawner")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_port_closed(host: str, port: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not port_in_use(host, port):
            return True
        time.sleep(0.1)
    return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


class ChildProcess:
    """One supervised child, its output in a log file we can quote when it fails."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            try:
                self.proc = _SPAWNER.submit(
                    subprocess.Popen, self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=self.env, preexec_fn=_die_with_parent, start_new_session=True,
                ).result()
            except OSError as exc:
                raise RuntimeError(f"cannot run {self.name} ({self.argv[0]}): {exc}") from exc
        log.debug("started %s pid=%s", self.name, self.proc.pid)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        return tail(self.log_path, lines)

    def stop(self, grace_s: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not exit %.0fs after SIGTERM; killing it", self.name, grace_s)
                self.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5)
        return self.proc.returncode

    def kill(self, wait_s: float | None = 10.0) -> None:
        """SIGKILL: no goodbye, no commit, no flush (what a crash looks like); waits ``wait_s`` unless None."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            if wait_s is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(wait_s)


async def finish(work: Awaitable[T], hurry: asyncio.Event, hasten: Callable[[], None]) -> T:
    """Await ``work``; should ``hurry`` be set first, call ``hasten`` (which makes it end soon) and go on awaiting."""
    task = asyncio.ensure_future(work)
    hurried = asyncio.create_task(hurry.wait())
    try:
        await asyncio.wait({task, hurried}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            hasten()
        return await task
    finally:
        hurried.cancel()


async def stop_children(children: Sequence[ChildProcess], hurry: asyncio.Event,
                        grace_s: float = 10.0) -> dict[str, int | None]:
    """Stop ``children`` together, off the event loop (so it still hears signals); SIGKILL them on ``hurry``.

    Returns each child's exit code by name.
    """

    def kill_all() -> None:
        for c in children:
            c.kill(wait_s=None)

    codes = await finish(asyncio.gather(*(asyncio.to_thread(c.stop, grace_s) for c in children)), hurry, kill_all)
    return {c.name: code for c, code in zip(children, codes, strict=True)}


def _proc_status(pid: int | None, key: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def peak_rss_mib(pid: int | None) -> float:
    """Peak resident memory of a process (Linux /proc), NaN when unknown."""
    return _proc_status(pid, "VmHWM") / 1024


def rss_mib(pid: int | None) -> float:
    """Resident memory of a process now (Linux /proc), NaN when unknown."""
    return _proc_status(pid, "VmRSS") / 1024


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (Linux /proc), NaN when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a log file ("" when it cannot be read), for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])
