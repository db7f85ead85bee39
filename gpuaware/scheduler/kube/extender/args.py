"""kube-scheduler's extender request bodies: decode them and check the shape of every field gpuaware reads.

kube-scheduler sends Go structs (k8s.io/kube-scheduler/extender/v1) that always have this shape; a
body that does not is a bad request, answered 400 with the field that is wrong (:class:`BadRequest`),
never an internal error. What a field means (a gpuaware annotation that cannot be scheduled) is
checked later, by ``objects.workload_of``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson

# Bodies above this are decoded in a worker process (``extender.offload``): a 500-node NodeList
# (4.5 MB) takes tens of milliseconds to parse, holding the GIL, which would stall every other
# request and the informers on the loop. Below it, orjson takes ~1 ms.
OFFLOAD_BYTES = 256 * 1024


class BadRequest(ValueError):
    """The body is not what kube-scheduler sends; the message names the field."""


def parse(body: bytes, verb: str = "filter") -> dict[str, Any]:
    """The body's ``ExtenderArgs``, ``ExtenderPreemptionArgs`` or (``verb`` bind) ``ExtenderBindingArgs``,
    checked; raises :class:`BadRequest`."""
    try:
        # orjson: ~4x faster than json, and strict as Go's encoder is (no NaN, no lone surrogates).
        args = orjson.loads(body)
    except (ValueError, RecursionError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise BadRequest(f"request body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(args, dict):
        raise BadRequest(f"request body is not a JSON object but {_kind(args)}")
    if verb == "bind":
        for key in ("PodName", "PodNamespace", "PodUID", "Node"):
            _string(args.get(key), key)
        if not args["PodName"] or not args["Node"]:
            raise BadRequest("PodName and Node: must not be empty")
        return args
    _pod(args.get("Pod"), "Pod")
    # Every field present is checked, whatever the verb: a body with a wrong field is wrong as a whole.
    _victims(args, "NodeNameToMetaVictims", _meta_pod)
    _victims(args, "NodeNameToVictims", _victim_pod)
    _nullable_list(args, "NodeNames", "NodeNames", _string)
    if args.get("Nodes") is not None:
        _nullable_list(_object(args["Nodes"], "Nodes"), "items", "Nodes.items", _node)
    return args


# --------------------------------------------------------------------------- the shapes
def _kind(value: Any) -> str:
    return "null" if value is None else {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{where}: must be an object, not {_kind(value)}")
    return value


def _string(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise BadRequest(f"{where}: must be a string, not {_kind(value)}")


def _integer(value: Any, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{where}: must be an integer, not {_kind(value)}")


def _optional(obj: dict[str, Any], key: str, where: str, check: Callable[[Any, str], Any]) -> None:
    if obj.get(key) is not None:
        check(obj[key], f"{where}.{key}")


def _nullable_list(obj: dict[str, Any], key: str, where: str, each: Callable[[Any, str], Any]) -> None:
    items = obj.get(key)
    if items is None:
        return
    if not isinstance(items, list):
        raise BadRequest(f"{where}: must be a list, not {_kind(items)}")
    if each is _string and all(type(item) is str for item in items):
        return  # kube-scheduler's NodeNames (hundreds per request): no per-item call and place name
    for i, item in enumerate(items):
        each(item, f"{where}[{i}]")


def _string_map(value: Any, where: str) -> None:
    for k, v in _object(value, where).items():
        _string(v, f"{where}.{k}")


def _timestamp(value: Any, where: str) -> None:
    _string(value, where)
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"{where}: {value[:40]!r} is not an RFC 3339 time") from None


def _metadata(value: Any, where: str) -> None:
    meta = _object(value, where)
    _string(meta.get("name"), f"{where}.name")
    for key in ("namespace", "uid"):
        _optional(meta, key, where, _string)
    _optional(meta, "annotations", where, _string_map)
    _optional(meta, "creationTimestamp", where, _timestamp)


def _container(value: Any, where: str) -> None:
    c = _object(value, where)
    _optional(c, "name", where, _string)
    if c.get("resources") is not None:
        res = _object(c["resources"], f"{where}.resources")
        for part in ("requests", "limits"):  # resource.Quantity marshals as a string
            _optional(res, part, f"{where}.resources", _string_map)


def _pod(value: Any, where: str) -> None:
    pod = _object(value, where)
    _metadata(pod.get("metadata"), f"{where}.metadata")
    if "spec" in pod:
        spec = _object(pod["spec"], f"{where}.spec")
        for key in ("containers", "initContainers"):
            _nullable_list(spec, key, f"{where}.spec.{key}", _container)
        _optional(spec, "priority", f"{where}.spec", _integer)


def _node(value: Any, where: str) -> None:
    meta = _object(_object(value, where).get("metadata"), f"{where}.metadata")
    _string(meta.get("name"), f"{where}.metadata.name")


def _meta_pod(value: Any, where: str) -> None:
    _string(_object(value, where).get("UID"), f"{where}.UID")


def _victim_pod(value: Any, where: str) -> None:
    meta = _object(_object(value, where).get("metadata"), f"{where}.metadata")
    _string(meta.get("uid"), f"{where}.metadata.uid")


def _victims(args: dict[str, Any], key: str, pod: Callable[[Any, str], None]) -> None:
    if args.get(key) is None:
        return
    for node, victims in _object(args[key], key).items():
        where = f"{key}.{node}"
        v = _object(victims, where)
        _nullable_list(v, "Pods", f"{where}.Pods", pod)
        _optional(v, "NumPDBViolations", where, _integer)


def meta_victims(node_to_victims: dict[str, Any]) -> dict[str, Any]:
    """``NodeNameToVictims`` (whole pods, nodeCacheCapable: false) as ``NodeNameToMetaVictims`` (their UIDs)."""
    return {n: {"Pods": [{"UID": p["metadata"]["uid"]} for p in (v.get("Pods") or [])],
                "NumPDBViolations": v.get("NumPDBViolations", 0)}
            for n, v in node_to_victims.items()}
