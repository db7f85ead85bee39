"""The stream table's keys and values: a node's entry (``node:<name>``), its GPUs' minute history (``hist:<name>``),
a GPU's owner (``owner:<uuid>``). Values are bytes the processor encodes itself (JSON, once: the app's table passes
them through), where Faust's JSON codec encoded each write twice, for the store and for the changelog.

Each history entry written for a node is numbered (``seq``), and a node entry names the one its ``closed`` minutes
follow (``hist``): a node entry read with a newer history entry (a worker stopped between the two writes) adds none
of them, as the history holds them. Version 3 entries (the history entry written at every closed minute, no
``closed``) are read as version 4 ones with nothing carried; a worker of a version before 4 reading version 4 entries
ignores ``closed``, and its GPUs' histories lack those minutes (at most ``processor.MAX_CLOSED`` each).

From version 5 a node entry holds each GPU's snapshot as a row (``rows``, ``gpuaware.stream.snapshot_rows``) and the
minutes carried apart (``closed``); version 4 entries (``gpus``: a dict per GPU, its ``closed`` in it) are still read.
A worker of a version before 5 finds no GPUs in a version 5 entry: it starts the node's GPUs afresh from their next
samples (readings, health, fingerprints and the minute history start again, their history entry written over), so a
rolling upgrade from it first writes version 4 (``StreamSettings.node_entry_version``; docs/deploy.md, "Upgrade"); it
never reads a row as something else.

Entries written before the split layout are still read, and rewritten in it the first time their node is:
``SNAPSHOT_VERSION`` 2 (a node entry holding its GPUs' history, what Faust's JSON codec wrote) and 1 (one
per GPU, keyed by its UUID; a GPU found only there is loaded from it, and its old key is deleted, a
tombstone in the changelog, once its node's entry holds it), so the migration loses nothing and needs no
reset.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import orjson

from gpuaware.stream.snapshot_rows import row, snapshot

if TYPE_CHECKING:
    from gpuaware.stream.gpu_state import GpuTracker

SNAPSHOT_VERSION = 5
# GPU UUIDs (the version 1 keys) start with "GPU-", so these never collide with them.
NODE_KEY_PREFIX = "node:"
HISTORY_KEY_PREFIX = "hist:"
OWNER_KEY_PREFIX = "owner:"


def node_key(node: str) -> str:
    """The table key of a node's entry."""
    return NODE_KEY_PREFIX + node


def history_key(node: str) -> str:
    """The table key of the minute history of a node's GPUs (version 3)."""
    return HISTORY_KEY_PREFIX + node


def owner_key(uuid: str) -> str:
    """The table key naming the node whose entry holds a GPU: written when a GPU joins a node (rarely), read
    when a worker meets a GPU it holds no tracker for, so that a restarted worker still knows whose it is."""
    return OWNER_KEY_PREFIX + uuid


def encode_value(value: object) -> bytes:
    """A table value as stored: JSON, which reads back as what Faust's JSON codec wrote before, made once.

    orjson, at a sixth of ``json.dumps``'s cost: a node entry (8 GPUs' snapshots) took 71 µs that way, ~8 % of
    a worker's core at 50,000 GPUs (docs/performance.md, the stream's "Where the time went", item 9). Its text
    differs from ``json.dumps(value, separators=(",", ":"))`` only in spelling some numbers (``1e-7`` for
    ``1e-07``) and in writing non-ASCII text as UTF-8 where json escaped it: both read back to the same values
    (tests/stream/test_processor.py). It writes a NaN as null (a node entry's row holds NaN for a reading not seen
    yet, read back as not seen; the contract's checks refuse samples and events that are not finite); what it cannot
    write (an integer beyond 64 bits) goes through json, which writes a NaN as ``NaN``, which ``json.loads`` reads."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def node_entry(members: dict[str, GpuTracker], closed: dict[str, int] | None = None, hist: int = 0,
               version: int = SNAPSHOT_VERSION) -> bytes:
    """A node entry's value, ``{"v": 5, "hist": hist, "rows": {uuid: row}, "closed": {uuid: minutes}}``, encoded in
    one call: each GPU's snapshot as a row (``gpuaware.stream.snapshot_rows``); ``closed``: per GPU, how many of its
    last minutes its node's history entry (number ``hist``) lacks (left out when none). ``version`` 4: ``{"v": 4,
    "hist": hist, "gpus": {uuid: snapshot}}``, each snapshot a dict with its ``closed`` in it, what workers before
    version 5 read. Each GPU's encoded snapshot was kept to be spliced into the next entries its node wrote (a batch
    samples ~3 of a node's 8 GPUs), but that was ~1 KiB of every GPU held (docs/stream.md, "Memory")."""
    carried = {key: members[key].last_minutes(n) for key, n in (closed or {}).items()}
    if version == 4:
        gpus = {key: t.to_dict(history=False) for key, t in members.items()}
        for key, minutes in carried.items():
            gpus[key]["closed"] = minutes
        return encode_value({"v": 4, "hist": hist, "gpus": gpus})
    entry: dict = {"v": version, "hist": hist, "rows": {key: row(t) for key, t in members.items()}}
    if carried:
        entry["closed"] = carried
    return encode_value(entry)


def entry_snapshots(entry: dict) -> dict[str, dict]:
    """The snapshot dict of each GPU of a node entry as read back (any version), by UUID, each with the minutes the
    entry carries for it (``closed``) as versions 4 and before held them; ValueError for a row of another layout."""
    if entry.get("v", 0) < 5:
        return entry.get("gpus", {})
    closed = entry.get("closed", {})
    out = {}
    for key, values in entry.get("rows", {}).items():
        out[key] = snapshot(key, values)
        if key in closed:
            out[key]["closed"] = closed[key]
    return out


def decode_value(raw: bytes | None) -> object:
    return None if raw is None else json.loads(raw)
