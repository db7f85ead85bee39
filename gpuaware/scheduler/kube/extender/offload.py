"""Large extender request bodies parsed without stalling the event loop.

Turning JSON into objects holds the GIL for the whole document, even on a worker thread, and the
garbage collector's passes over the objects it builds hold it longer still: an 8 MiB NodeList
held the loop for ~145 ms with ``json``, and ``orjson`` on a thread does no better once the
collections are counted (``python -m gpuaware.bench.extender_stall``). Every other request and the
informers wait that long.

So a body over ``args.OFFLOAD_BYTES`` is parsed and checked in a worker process (its GIL, not
ours), which hands back only what the verbs read, compactly (:func:`compact`): each of ``Nodes``'
items as its name and its JSON bytes (:class:`RawNode`; /filter echoes the kept ones verbatim,
``orjson.Fragment``), ``NodeNameToVictims`` as the victims' UIDs (all /preempt reads of them), and
the rest (the pod) as objects. This process unpickles a few hundred byte strings instead of
building a million objects.

The worker process is started on first use (``spawn``: no copy of this process's threads) and
again if it dies; one is enough, since kube-scheduler sends one scheduling cycle at a time.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import orjson

from gpuaware.scheduler.kube.extender.args import meta_victims, parse

_pool: ProcessPoolExecutor | None = None
_lock = threading.Lock()


class RawNode:
    """One of ``Nodes.items``, kept as the JSON it came in: its name, and its bytes to echo.

    Not a dataclass: orjson would write a dataclass's fields rather than ask ``dumps``' default."""

    __slots__ = ("json", "name")

    def __init__(self, name: str, json: bytes):
        self.name, self.json = name, json


def node_name(item: dict[str, Any] | RawNode) -> str:
    return item.name if isinstance(item, RawNode) else item["metadata"]["name"]


def dumps(value: Any) -> bytes:
    """JSON of an answer; a :class:`RawNode` is written as the bytes it came in."""
    return orjson.dumps(value, default=_raw, option=orjson.OPT_SERIALIZE_NUMPY)


def _raw(value: Any) -> orjson.Fragment:
    if isinstance(value, RawNode):
        return orjson.Fragment(value.json)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def compact(args: dict[str, Any]) -> dict[str, Any]:
    """Checked arguments with their bulk reduced to what the verbs read (see the module's doc)."""
    nodes = args.get("Nodes")
    if nodes is not None and nodes.get("items"):
        args["Nodes"] = {**nodes, "items": [RawNode(n["metadata"]["name"], orjson.dumps(n)) for n in nodes["items"]]}
    if not args.get("NodeNameToMetaVictims") and args.get("NodeNameToVictims"):
        args["NodeNameToMetaVictims"] = meta_victims(args["NodeNameToVictims"])
    args.pop("NodeNameToVictims", None)
    return args


def parse_compact(body: bytes, verb: str) -> dict[str, Any]:
    """In the worker process: ``args.parse`` (BadRequest as it is), then :func:`compact`."""
    return compact(parse(body, verb))


def _executor() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return _pool


def _discard(pool: ProcessPoolExecutor) -> None:
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
    pool.shutdown(wait=False, cancel_futures=True)


async def parse_large(body: bytes, verb: str) -> dict[str, Any]:
    """``args.parse(body, verb)`` for a large body, compacted, parsed in the worker process; raises BadRequest."""
    pool = _executor()
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, parse_compact, body, verb)
    except BrokenProcessPool:  # the worker died (killed, out of memory): a new one for the next request
        _discard(pool)
        raise


def shutdown() -> None:
    """Stop the worker process (tests and benchmarks; at exit concurrent.futures joins it)."""
    pool = _pool
    if pool is not None:
        _discard(pool)
