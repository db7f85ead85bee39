"""Helpers that several test files share; fixtures are in conftest.py.

Import it as ``tests.support`` (pyproject.toml puts the repository root on the path).
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer

from plumbing.kafka_settings import KafkaSettings


async def consume(settings: KafkaSettings, topic: str, group: str, want: int, timeout_s: float = 20.0):
    """``want`` records of ``topic`` read as member of ``group``, whose offsets are then committed."""
    consumer = AIOKafkaConsumer(topic, **settings.consumer_kwargs(group))
    await consumer.start()
    got = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(got) < want:
                batches = await consumer.getmany(timeout_ms=500, max_records=want - len(got))
                for records in batches.values():
                    got.extend(records)
        await consumer.commit()
    finally:
        await consumer.stop()
    return got
