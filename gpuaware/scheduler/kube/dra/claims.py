"""A pod's ResourceClaims as a request the core places, and the core's placement as claim allocations.

What gpuaware allocates (anything else raises ``UnsupportedClaim`` with the reason; the pod is left
alone with that reason as an Event, and never allocated on a guess):

- requests ``exactly`` (or subrequests of ``firstAvailable``) with ``allocationMode: ExactCount``
  (``count``, default 1) of whole GPUs (``type: gpu`` devices) — several requests and several claims of
  one pod add up — or of one MIG partition (``type: mig``: one request of count 1 per pod);
- selectors of the DeviceClass and of the request in the CEL forms ``dra_cel`` reads, and
  ``capacity.requests`` (a device with at least that much: without ``allowMultipleAllocations`` a
  request takes the whole device);
- a **memory share** of a GPU that allows multiple allocations (``allowMultipleAllocations``, DRA
  consumable capacity): one request of count 1 with ``capacity.requests.memory``, placed by the core
  as a fractional pod (its share of the GPU's memory as ``gpu_milli``), written with a ``shareID`` and
  ``consumedCapacity``; the claims' consumed memory per device is the source of truth (never over it);
- ``constraints[].matchAttribute`` on the NVLink island attribute (all GPUs on one island) or on an
  attribute every GPU of a node shares (``productName``, ``architecture``, ...).

The core places by GPU model; where the selectors pick some but not all devices of a model (a node's
label-like attribute, a UUID), the pod's nodes are narrowed to those with enough matching devices
(``DraAsk.nodes``), and the devices are picked among the matching ones.

``firstAvailable`` requests: each subrequest as an ``exactly``; their combinations, in order, are the
pod's alternatives (``DraAsk.then``), those gpuaware cannot allocate passed over.

A pod whose claims are all allocated already (shared) goes to their node with no device of its own
(``shared_node``): its UID joins their ``reservedFor``.

The claim names of a pod are its ``resourceClaimName`` or, for a template, the name in
``status.resourceClaimStatuses`` (set by kube-controller-manager).
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuaware.contract import dra
from gpuaware.scheduler.kube.dra.cel import DeviceFacts, Selector, compile_selector
from gpuaware.scheduler.kube.dra.inventory import Device, DraInventory, NodeGpus
from gpuaware.scheduler.kube.objects import PodSpecError, quantity, short_model

NODE_UNIFORM = ("productName", "architecture", "brand", "driverVersion", "cudaDriverVersion",
                "cudaComputeCapability", "type")


class UnsupportedClaim(PodSpecError):
    """A claim gpuaware does not allocate (kube-scheduler's DynamicResources plugin would)."""


class ClaimsNotReady(PodSpecError):
    """A claim of the pod does not exist yet (a template's claim not yet created): the pod waits."""


@dataclass(frozen=True)
class _Capacity:
    """``capacity.requests``: the device must have at least this much of each."""

    wants: tuple[tuple[str, float], ...]

    def matches(self, d: DeviceFacts) -> bool:
        # A name without a domain is the device's driver's.
        return all(d.capacity.get(f"{d.driver}/{k[2:]}" if k.startswith("*/") else k, -1.0) >= v
                   for k, v in self.wants)


@dataclass(frozen=True)
class DeviceRequest:
    claim: str  # ns/name
    name: str  # the request's name in the claim
    count: int
    selectors: tuple[Selector | _Capacity, ...]
    share: int = 0  # bytes of memory asked by ``capacity.requests``: a share, where the device allows it
    tolerations: tuple[dra.Toleration, ...] = ()
    admin: bool = False  # ``adminAccess``: access to devices in use or not, taking none of them

    def matches(self, d: Device) -> bool:
        return d.tolerated_by(self.tolerations) and all(s.matches(d.facts) for s in self.selectors)


@dataclass(frozen=True)
class DraAsk:
    """What a pod's claims ask for, in the core's terms, plus what picking devices needs."""

    claims: tuple[str, ...]
    requests: tuple[DeviceRequest, ...]
    kind: str  # "gpu", "mig", "share" (a memory share of a GPU that allows multiple allocations) or "admin"
    num_gpu: int
    gpu_milli: int
    models: tuple[str, ...]
    same: tuple[str, ...]  # attributes all devices must share (qualified)
    nodes: frozenset[str] | None = None  # None: any node with GPUs of ``models``; else only these
    # ``firstAvailable``: the asks to try, in order, where this one (its first subrequests) fits nowhere.
    then: tuple[DraAsk, ...] = ()

    @property
    def needs_island(self) -> bool:
        return dra.ATTR_NVLINK_ISLAND in self.same

    @property
    def tolerating(self) -> bool:
        return any(r.tolerations for r in self.requests)

    def tolerates(self, d: Device) -> bool:
        """A tainted device one of the requests tolerates (the core sees its GPU as critical otherwise)."""
        return d.tainted and any(d.tolerated_by(r.tolerations) for r in self.requests)


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The keys (ns/name) of the pod's claims; ``ClaimsNotReady`` while a template's claim has no name yet."""
    ns = pod["metadata"].get("namespace", "")
    made = {s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    out = []
    for c in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = c.get("resourceClaimName") or made.get(c.get("name"))
        if not name:
            raise ClaimsNotReady(f"resourceClaims[{c.get('name')}]: the claim of template "
                                 f"{c.get('resourceClaimTemplateName')!r} is not created yet")
        out.append(f"{ns}/{name}")
    return out


# resource.k8s.io/v1 ``ResourceClaimReservedForMaxSize``: the apiserver refuses a claim reserved for more.
MAX_RESERVED_FOR = 256


def allocated_nodes(alloc: Mapping[str, Any]) -> set[str]:
    """The node names an allocation's nodeSelector names by ``metadata.name`` (how node-local devices are
    written, by gpuaware and by kube-scheduler)."""
    nodes: set[str] = set()
    for term in (alloc.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name":
                nodes.update(f.get("values") or [])
    return nodes


def resumed(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]], inventory: DraInventory
            ) -> tuple[str, list[tuple[DeviceRequest, Device]]] | None:
    """A placement cut short between its claims' writes and its Binding (a restart, a lost answer): every
    claim of the pod allocated on one node and reserved for this very pod (UID) alone. (node, devices), else
    None. A claim reserved for other pods too is shared (``shared_node``): rewriting its allocation for this
    pod would take the others off it."""
    try:
        keys = claim_names(pod)
    except ClaimsNotReady:
        return None
    uid, nodes, picks = pod["metadata"].get("uid"), set(), []
    for key in keys:
        status = (claims.get(key) or {}).get("status") or {}
        alloc = status.get("allocation")
        if not alloc or [r.get("uid") for r in status.get("reservedFor") or []] != [uid]:
            return None
        nodes |= allocated_nodes(alloc)
        for r in (alloc.get("devices") or {}).get("results") or []:
            d = inventory.devices.get((r.get("driver", ""), r.get("pool", ""), r.get("device", "")))
            if d is None:
                return None
            picks.append((DeviceRequest(key, r.get("request", ""), 1, (), _consumed(r), _result_tolerations(r),
                                        admin=r.get("adminAccess") is True), d))
    if len(nodes) != 1 or not picks or any(d.node not in nodes for _, d in picks):
        return None
    return nodes.pop(), picks


def _result_tolerations(result: Mapping[str, Any]) -> tuple[dra.Toleration, ...]:
    """The tolerations an allocation result carries, kept when the claim is written again (unreadable: none)."""
    try:
        return dra.parse_tolerations(result.get("tolerations"), "tolerations")
    except dra.SliceInvalid:
        return ()


def shared_node(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The node of a pod whose claims are all allocated already (claims shared by several pods, or allocated
    by someone else): it goes there, as kube-scheduler sends it, and takes no device of its own; its UID joins
    each claim's ``reservedFor``. None when none of its claims is allocated (the pod asks for devices).
    ``ClaimsNotReady`` while a claim is being deleted or reserved for the most pods the API allows (one may
    end); ``UnsupportedClaim`` when only some of its claims are allocated, or they are on different nodes."""
    keys = claim_names(pod)
    have = {k: ((claims.get(k) or {}).get("status") or {}) for k in keys}
    done = [k for k in keys if have[k].get("allocation")]
    if not done:
        return None
    if len(done) != len(keys):
        fresh = [k for k in keys if k not in done]
        raise UnsupportedClaim(f"ResourceClaim {done[0]} is allocated already and {fresh[0]} is not: gpuaware "
                               "places a pod whose claims are all new or all allocated (shared), not both")
    uid, nodes = pod["metadata"].get("uid"), set()
    for k in keys:
        if claims[k]["metadata"].get("deletionTimestamp"):
            raise ClaimsNotReady(f"ResourceClaim {k} is being deleted")
        reserved = have[k].get("reservedFor") or []
        if len(reserved) >= MAX_RESERVED_FOR and not any(r.get("uid") == uid for r in reserved):
            raise ClaimsNotReady(f"ResourceClaim {k} is reserved for {len(reserved)} pods, the most the API allows")
        on = allocated_nodes(have[k]["allocation"])
        if len(on) != 1:
            raise UnsupportedClaim(f"ResourceClaim {k}: its allocation's nodeSelector does not name one node by "
                                   "metadata.name (devices not local to a node are not placed by gpuaware)")
        nodes |= on
    if len(nodes) != 1:
        raise UnsupportedClaim(f"the pod's claims are allocated on different nodes ({', '.join(sorted(nodes))})")
    return nodes.pop()


def has_claims(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def _selectors(raw: Any, where: str) -> list[Selector]:
    out = []
    for i, s in enumerate(raw or []):
        expr = ((s or {}).get("cel") or {}).get("expression")
        if not isinstance(expr, str):
            raise UnsupportedClaim(f"{where}.selectors[{i}]: only cel selectors are read")
        out.append(compile_selector(expr))
    return out


# resource.k8s.io/v1 allows 8 subrequests per ``firstAvailable``; the alternatives of several such requests
# multiply, and each is one more try of the core for the pod.
MAX_ALTERNATIVES = 16


def _request(ex: Mapping[str, Any], name: str, key: str, classes: Mapping[str, Mapping[str, Any]], where: str
             ) -> DeviceRequest:
    """One ``exactly`` request, or one subrequest of ``firstAvailable`` (the same fields)."""
    if (ex.get("allocationMode") or "ExactCount") != "ExactCount":
        raise UnsupportedClaim(f"{where}.allocationMode: {ex.get('allocationMode')!r} is not supported")
    admin = ex.get("adminAccess") is True
    try:
        tolerations = dra.parse_tolerations(ex.get("tolerations"), f"{where}.tolerations")
    except dra.SliceInvalid as exc:
        raise UnsupportedClaim(str(exc)) from None
    cls = classes.get(ex.get("deviceClassName") or "")
    if cls is None:
        raise ClaimsNotReady(f"{where}.deviceClassName: DeviceClass {ex.get('deviceClassName')!r} does not exist")
    sels: list[Selector | _Capacity] = [*_selectors((cls.get("spec") or {}).get("selectors"),
                                                    f"DeviceClass {ex.get('deviceClassName')}.spec"),
                                        *_selectors(ex.get("selectors"), where)]
    wants = ((ex.get("capacity") or {}).get("requests") or {})
    share = 0
    if wants and admin:
        raise UnsupportedClaim(f"{where}.capacity: not read with adminAccess (admin access consumes no capacity)")
    if wants:
        amounts = tuple(sorted((k if "/" in k else f"*/{k}", quantity(v, f"{where}.capacity.requests[{k}]"))
                               for k, v in wants.items()))
        sels.append(_Capacity(amounts))
        share = int(sum(v for k, v in amounts if k.split("/", 1)[1] == dra.CAP_MEMORY))
    return DeviceRequest(key, name, int(ex.get("count") or 1), tuple(sels), share, tolerations, admin)


def _requests(claim: Mapping[str, Any], key: str, classes: Mapping[str, Mapping[str, Any]]
              ) -> list[tuple[DeviceRequest, ...]]:
    """Per request of the claim, its alternatives in order: one for ``exactly``, the subrequests of
    ``firstAvailable`` (named ``<request>/<subrequest>``, as the allocation result names them)."""
    out = []
    for i, r in enumerate(((claim.get("spec") or {}).get("devices") or {}).get("requests") or []):
        where = f"ResourceClaim {key}: spec.devices.requests[{i}]"
        ex, first = r.get("exactly"), r.get("firstAvailable")
        if isinstance(ex, dict):
            out.append((_request(ex, r.get("name", ""), key, classes, f"{where}.exactly"),))
        elif isinstance(first, list) and first:
            out.append(tuple(_request(sub, f"{r.get('name', '')}/{sub.get('name', '')}", key, classes,
                                      f"{where}.firstAvailable[{j}]") for j, sub in enumerate(first)))
        else:
            raise UnsupportedClaim(f"{where}: neither `exactly` nor `firstAvailable` subrequests")
    return out


def ask_of(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]],
           classes: Mapping[str, Mapping[str, Any]], inventory: DraInventory) -> DraAsk:
    """The pod's claims as one request; ``UnsupportedClaim`` / ``ClaimsNotReady`` (both ``PodSpecError``).
    With ``firstAvailable`` requests, the first combination of their subrequests gpuaware can allocate, with
    the later ones as its ``then`` (a subrequest matching no device, or of a kind not allocated, is passed
    over, as kube-scheduler passes over one no node satisfies); none: the first one's reason."""
    keys = claim_names(pod)
    slots: list[tuple[DeviceRequest, ...]] = []
    same: list[str] = []
    for key in keys:
        claim = claims.get(key)
        if claim is None:
            raise ClaimsNotReady(f"ResourceClaim {key} does not exist (yet)")
        if claim["metadata"].get("deletionTimestamp"):
            raise ClaimsNotReady(f"ResourceClaim {key} is being deleted")
        if (claim.get("status") or {}).get("allocation"):
            raise UnsupportedClaim(f"ResourceClaim {key} is allocated already (a pod with shared claims goes where "
                                   "they are: ``shared_node``)")
        slots += _requests(claim, key, classes)
        for i, c in enumerate(((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []):
            attr = c.get("matchAttribute")
            if not attr or c.get("distinctAttribute"):
                raise UnsupportedClaim(f"ResourceClaim {key}: spec.devices.constraints[{i}]: only matchAttribute "
                                       "is supported")
            if attr != dra.ATTR_NVLINK_ISLAND and attr.split("/", 1)[-1] not in NODE_UNIFORM:
                raise UnsupportedClaim(f"ResourceClaim {key}: spec.devices.constraints[{i}].matchAttribute: "
                                       f"{attr!r} is not the NVLink island ({dra.ATTR_NVLINK_ISLAND}) or an "
                                       "attribute all GPUs of a node share")
            same.append(attr)
    if not slots:
        raise UnsupportedClaim("the pod's claims request no devices")
    combos = list(itertools.islice(itertools.product(*slots), MAX_ALTERNATIVES + 1))
    if len(combos) > MAX_ALTERNATIVES:
        raise UnsupportedClaim(f"the pod's firstAvailable requests make more than {MAX_ALTERNATIVES} alternatives")
    asks: list[DraAsk] = []
    first_error: UnsupportedClaim | None = None
    for combo in combos:
        try:
            asks.append(_ask(tuple(keys), list(combo), tuple(same), inventory))
        except UnsupportedClaim as exc:
            first_error = first_error or exc
    if not asks:
        assert first_error is not None
        raise first_error
    return dataclasses.replace(asks[0], then=tuple(asks[1:]))


def _ask(keys: tuple[str, ...], requests: list[DeviceRequest], same: tuple[str, ...], inventory: DraInventory
         ) -> DraAsk:
    if any(r.admin for r in requests):
        return _admin_ask(keys, requests, same, inventory)
    kinds, models, nodes = _matching(requests, inventory)
    if len(kinds) != 1:
        raise UnsupportedClaim(f"the requests match {' and '.join(sorted(kinds)) or 'no'} devices: gpuaware "
                               "allocates whole GPUs or one MIG partition per pod (or one memory share of a GPU that "
                               "allows multiple allocations)")
    kind = kinds.pop()
    num = sum(r.count for r in requests)
    milli = 1000
    if kind == "mig":
        if num != 1:
            raise UnsupportedClaim(f"{num} MIG partitions requested: gpuaware allocates one per pod")
        milli = min(d.milli for d in inventory.devices.values() if d.kind == "mig" and requests[0].matches(d))
    elif kind == "share":
        if num != 1 or len(requests) != 1:
            raise UnsupportedClaim(f"{num} memory shares requested: gpuaware allocates one per pod (one request, "
                                   "count 1)")
        milli = _share_milli(requests[0], inventory)
    return DraAsk(keys, tuple(requests), kind, num, milli, tuple(sorted(models)), same, nodes)


def _admin_ask(keys: tuple[str, ...], requests: list[DeviceRequest], same: tuple[str, ...], inventory: DraInventory
               ) -> DraAsk:
    """Admin access (a monitoring or debugging pod): the pod goes to a node with enough matching GPUs, in use or
    not, and takes none (no GPU in the core's model, nothing charged to a quota); its claim's results say
    ``adminAccess``. The apiserver admits such a claim only in a namespace labelled
    ``resource.kubernetes.io/admin-access: "true"``."""
    if not all(r.admin for r in requests):
        raise UnsupportedClaim("adminAccess and other requests in one pod: gpuaware places a pod either with admin "
                               "access to devices or with devices of its own")
    if same:
        raise UnsupportedClaim("constraints with adminAccess: not supported")
    nodes = _admin_nodes(requests, inventory)
    if not nodes:
        raise UnsupportedClaim("the adminAccess requests match no node's GPUs")
    return DraAsk(keys, tuple(requests), "admin", 0, 1000, (), same, nodes)


def _admin_nodes(requests: list[DeviceRequest], inventory: DraInventory) -> frozenset[str]:
    """Nodes where every request gets its GPUs or MIG partitions (``_pick_admin``: taints and tolerations as for
    any request; in use or not)."""
    return frozenset(n for n, ng in inventory.nodes.items() if not isinstance(_pick_admin(requests, ng), str))


def pick_admin(ask: DraAsk, ng: NodeGpus) -> list[tuple[DeviceRequest, Device]] | str:
    return _pick_admin(ask.requests, ng)


def _pick_admin(requests: Iterable[DeviceRequest], ng: NodeGpus) -> list[tuple[DeviceRequest, Device]] | str:
    """Devices for admin access on a node: each request's first matching ones, in use or not; a claim's results
    name a device once (another claim of the pod may name it again: admin access takes nothing)."""
    out: list[tuple[DeviceRequest, Device]] = []
    for r in requests:
        mine = [d for d in [*ng.gpus, *ng.migs]
                if r.matches(d) and not any(d is o and q.claim == r.claim for q, o in out)][: r.count]
        if len(mine) < r.count:
            return f"fewer than {r.count} devices matching request {r.name} of {r.claim}"
        out += [(r, d) for d in mine]
    return out


def _share_milli(r: DeviceRequest, inventory: DraInventory) -> int:
    """The share as the core's ``gpu_milli``: its fraction of the smallest matching GPU's memory (the most it
    is of any GPU it may land on, so the model never holds less than the claims consume)."""
    key = ("share", r.selectors, r.share)
    if key not in inventory.matches:
        inventory.matches[key] = max((d.share_milli(r.share) for d in inventory.devices.values()
                                      if d.kind == "gpu" and d.shareable and r.matches(d)), default=1000)
    return int(inventory.matches[key])


def _kind(r: DeviceRequest, d: Device) -> str:
    return "share" if d.kind == "gpu" and d.shareable and r.share else d.kind


def _matching(requests: list[DeviceRequest], inventory: DraInventory
              ) -> tuple[set[str], set[str], frozenset[str] | None]:
    """Which device kinds the requests match anywhere, on which GPU models, and, where they match only some
    devices of a model, the nodes with enough matching devices for all requests (else None: any)."""
    key = tuple((r.count, r.selectors, bool(r.share)) for r in requests)
    if key not in inventory.matches:
        inventory.matches[key] = _match_all(requests, inventory)
    kinds, models, nodes = inventory.matches[key]
    return set(kinds), set(models), nodes


def _match_all(requests: list[DeviceRequest], inventory: DraInventory
               ) -> tuple[set[str], set[str], frozenset[str] | None]:
    kinds: set[str] = set()
    models: set[str] | None = None
    partial = False
    per_node: dict[str, int] = {}
    need = 0
    for r in requests:
        hit: dict[str, set[bool]] = {}
        count: dict[str, int] = {}
        for d in inventory.devices.values():
            if d.kind not in ("gpu", "mig"):
                continue
            ok = all(s.matches(d.facts) for s in r.selectors)  # taints aside: a tainted GPU is cordoned
            if ok:
                kinds.add(_kind(r, d))
                count[d.node] = count.get(d.node, 0) + 1
            hit.setdefault(short_model(d.product), set()).add(ok)
        partial |= any(v == {True, False} for v in hit.values())
        mine = {m for m, v in hit.items() if True in v}
        models = mine if models is None else models & mine
        need += r.count
        for node, n in count.items():
            per_node[node] = per_node.get(node, 0) + n
    nodes = frozenset(n for n, c in per_node.items() if c >= need) if partial else None
    return kinds, models or set(), nodes


def pick(ask: DraAsk, ng: NodeGpus, slots: list[int], free_slots: list[int], taken: Container[tuple[str, str, str]],
         fits: Callable[[Device], bool]) -> tuple[list[int], list[tuple[DeviceRequest, Device]]] | str:
    """The devices for ``ask`` on a node: the core's ``slots`` if they do, else others of ``free_slots``;
    (slots, [(request, device)]) or why none do. ``fits``: the device's shared counters allow it."""
    if ask.kind == "share":
        r = ask.requests[0]
        for slot in [*slots, *free_slots]:
            d = ng.gpus[slot]
            if d.shareable and r.matches(d) and fits(d):
                return [slot], [(r, d)]
        return f"no GPU with {r.share} bytes of memory free matching the request"
    if ask.kind == "mig":
        for slot in [*slots, *free_slots]:
            cands = sorted((m for m in ng.migs if ng.slot_of[m.ref] == slot and m.ref not in taken
                            and ask.requests[0].matches(m) and fits(m)), key=lambda m: (m.milli, m.name))
            if cands:
                return [slot], [(ask.requests[0], cands[0])]
        return "no free MIG partition matching the request on the chosen GPU"
    for choice in _slot_choices(ask, ng, slots, free_slots):
        out = _assign(ask, [ng.gpus[s] for s in choice], taken, fits)
        if out is not None:
            return choice, out
    return f"no {ask.num_gpu} free GPUs matching the requests and constraints together"


def _slot_choices(ask: DraAsk, ng: NodeGpus, slots: list[int], free_slots: list[int]) -> Iterable[list[int]]:
    """The core's GPUs, then free GPUs that match a request, one group of equal ``same`` attributes at a time."""
    yield slots
    by_value: dict[Any, list[int]] = {}
    for s in free_slots:
        if not any(r.matches(ng.gpus[s]) for r in ask.requests):
            continue
        key = tuple(ng.gpus[s].facts.attributes.get(a) for a in ask.same)
        by_value.setdefault(key, []).append(s)
    for group in sorted(by_value.values(), key=len):  # the smallest group that fits keeps bigger ones whole
        if len(group) >= ask.num_gpu:
            yield sorted(group, key=lambda s: ng.gpus[s].tainted)[: ask.num_gpu]  # untainted GPUs first


def _assign(ask: DraAsk, devices: list[Device], taken: Container[tuple[str, str, str]], fits: Callable[[Device], bool]
            ) -> list[tuple[DeviceRequest, Device]] | None:
    if any(d.ref in taken or not fits(d) for d in devices):
        return None
    for a in ask.same:
        if len({d.facts.attributes.get(a) for d in devices}) != 1 or a not in devices[0].facts.attributes:
            return None
    out, left = [], list(devices)
    # Requests without tolerations first (they cannot take a tainted device the others may), then the pickiest.
    for r in sorted(ask.requests, key=lambda r: (bool(r.tolerations), -len(r.selectors))):
        mine = [d for d in left if r.matches(d)][: r.count]
        if len(mine) < r.count:
            return None
        out += [(r, d) for d in mine]
        left = [d for d in left if d not in mine]
    return out


def allocation_status(claim: Mapping[str, Any], node: str, picked: list[tuple[DeviceRequest, Device]],
                      pod: Mapping[str, Any]) -> dict[str, Any]:
    """The claim with ``status.allocation`` for this node and ``reservedFor`` the pod (PUT to .../status;
    the claim's resourceVersion stays the precondition)."""
    key = f"{claim['metadata'].get('namespace', '')}/{claim['metadata']['name']}"
    results: list[dict[str, Any]] = []
    for r, d in picked:
        if r.claim != key:
            continue
        result: dict[str, Any] = {"request": r.name, "driver": d.driver, "pool": d.pool, "device": d.name}
        if r.tolerations:  # as kube-scheduler writes them: the taint eviction controller reads them here
            result["tolerations"] = [t.to_api() for t in r.tolerations]
        if r.admin:
            result["adminAccess"] = True
        elif r.share or d.shareable:
            # As kube-scheduler: every allocation of a device that allows multiple allocations is a share, told
            # apart by its shareID and saying what it consumes (taken whole: all of its memory, so kube-scheduler
            # puts no share beside it). The ID derives from the claim, so a rewrite (resumed) says the same.
            result["shareID"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{claim['metadata'].get('uid')}/{r.name}/"
                                               f"{d.driver}/{d.pool}/{d.name}"))
            result["consumedCapacity"] = {dra.CAP_MEMORY: str(r.share or d.memory_bytes)}
        results.append(result)
    meta = pod["metadata"]
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": dict(claim["metadata"]),
            "spec": claim["spec"], "status": {
                "allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [{
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
                "reservedFor": [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}]}}
    return body


# kube-scheduler's DynamicResources plugin puts this finalizer on a claim before it writes the allocation
# (k8s.io/api/resource/v1 ``Finalizer``), so that a claim deleted while its pod runs stays, allocation and all,
# until kube-controller-manager's resource claim controller deallocates it and takes the finalizer off.
FINALIZER = "resource.kubernetes.io/delete-protection"


def with_finalizer(claim: Mapping[str, Any], on: bool) -> dict[str, Any] | None:
    """The claim (for a PUT) with the delete-protection finalizer added (``on``) or removed; None when it
    already is so (nothing to write)."""
    have = list(claim["metadata"].get("finalizers") or [])
    if (FINALIZER in have) == on:
        return None
    return {**claim, "metadata": {**claim["metadata"],
                                  "finalizers": [*have, FINALIZER] if on else [f for f in have if f != FINALIZER]}}


def reserved_status(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """A shared claim (allocated already) with the pod added to ``reservedFor``, as kube-scheduler's PreBind
    does for a claim in use; None when it is reserved for the pod already (nothing to write)."""
    meta, status = pod["metadata"], dict(claim.get("status") or {})
    have = list(status.get("reservedFor") or [])
    if any(r.get("uid") == meta["uid"] for r in have):
        return None
    status["reservedFor"] = [*have, {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": dict(claim["metadata"]),
            "spec": claim["spec"], "status": status}


def released_status(claim: Mapping[str, Any]) -> dict[str, Any]:
    """The claim with its allocation and reservations taken back (a placement withdrawn before its Binding)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": dict(claim["metadata"]),
            "spec": claim["spec"], "status": {}}


def _consumed(result: Mapping[str, Any]) -> int:
    """Bytes of memory a result with a ``shareID`` consumes of its device (0: the device is taken whole)."""
    if not result.get("shareID"):
        return 0
    used = (result.get("consumedCapacity") or {}).get(dra.CAP_MEMORY)
    try:
        return int(quantity(used, "consumedCapacity.memory")) if used is not None else 0
    except PodSpecError:
        return 0


def allocated(claim: Mapping[str, Any]) -> list[tuple[tuple[str, str, str], int]]:
    """The claim's allocated devices with the memory each share consumes (0: the whole device). Results with
    ``adminAccess`` take nothing: the device stays free for others (as kube-scheduler counts it)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return [((r.get("driver", ""), r.get("pool", ""), r.get("device", "")), _consumed(r))
            for r in (alloc.get("devices") or {}).get("results") or [] if r.get("adminAccess") is not True]


def allocated_refs(claim: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return [ref for ref, _ in allocated(claim)]


def reserved_for(claim: Mapping[str, Any]) -> list[str]:
    """Keys (ns/name) of the pods a claim is reserved for."""
    ns = claim["metadata"].get("namespace", "")
    return [f"{ns}/{r.get('name')}" for r in (claim.get("status") or {}).get("reservedFor") or []
            if r.get("resource") == "pods"]
