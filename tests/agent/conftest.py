"""Fakes at the aiokafka boundary for the agent's publishing tests (no broker)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from gpuaware.agent import publisher as publisher_module


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
