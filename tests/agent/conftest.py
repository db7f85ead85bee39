"""Fakes at the aiokafka boundary for the agent's publishing tests (no broker), and a small real
filesystem to fill (``small_fs``)."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuaware.agent import publisher as publisher_module
from tests.support import in_ci


class FakeProducer:
    """Stands in for ``AIOKafkaProducer``: ``fail(topic, value)`` returns the exception a send raises."""

    sent: list[bytes]
    headers: list[list[tuple[str, bytes]] | None]
    attempts: int
    fail: Callable[[str, bytes], BaseException | None]
    hook: Callable[[str, bytes], None]

    def __init__(self, **_kwargs):
        pass

    async def start(self):
        pass

    async def stop(self):
        pass

    async def send(self, topic, value, key=None, headers=None):
        type(self).attempts += 1
        type(self).hook(topic, value)
        exc = type(self).fail(topic, value)
        if exc is not None:
            raise exc
        type(self).sent.append(value)
        type(self).headers.append(headers)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


@pytest.fixture
def fake_producer(monkeypatch) -> type[FakeProducer]:
    FakeProducer.sent = []
    FakeProducer.headers = []
    FakeProducer.attempts = 0
    FakeProducer.fail = staticmethod(lambda topic, value: None)
    FakeProducer.hook = staticmethod(lambda topic, value: None)
    monkeypatch.setattr(publisher_module, "AIOKafkaProducer", FakeProducer)
    return FakeProducer


async def wait_until(cond: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
def small_fs(tmp_path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test (unmounted after it): a disk that really fills.

    Mounting needs root (CAP_SYS_ADMIN); without it the test is skipped, and under ``CI=true`` it fails."""
    mnt = tmp_path / "small_fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        reason = f"cannot mount a 1 MiB tmpfs here: {done.stderr.strip() or done.returncode}"
        if in_ci():
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write ``directory/name`` until the filesystem refuses another byte; return its path."""
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        while True:  # the last page's spare bytes too
            try:
                os.write(fd, b"\0")
            except OSError:
                return path
    finally:
        os.close(fd)
