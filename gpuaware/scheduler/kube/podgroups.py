"""Gangs from the upstream Workload API: a pod's ``spec.schedulingGroup.podGroupName`` and that PodGroup's
gang policy, placed all or nothing by the same core as ``gpuaware.io/gang`` + ``gpuaware.io/gang-size``.

What Kubernetes 1.36 serves (KEP-4671 gang scheduling, reshaped by KEP-5832 "Decouple PodGroup from Workload
API"), read from kube-apiserver v1.36.3 itself (``--feature-gates=GenericWorkload=true`` and
``--runtime-config=scheduling.k8s.io/v1alpha2=true``; ``kubectl api-resources``, ``kubectl explain``) and
from staging/src/k8s.io/api/scheduling/v1alpha2/types.go:

- ``scheduling.k8s.io/v1alpha2`` only: ``scheduling.k8s.io/v1alpha1`` (1.35's Workload with ``podGroups``
  and the pod's ``spec.workloadRef``) is no longer registered; the apiserver refuses to start when asked
  for it ("group version scheduling.k8s.io/v1alpha1 that has not been registered");
- ``Workload`` (namespaced): ``spec.podGroupTemplates[]`` {name, schedulingPolicy {basic | gang
  {minCount}}}: the policy templates, which controllers (Job, JobSet, LWS) copy into PodGroups;
- ``PodGroup`` (namespaced, with a ``/status``): ``spec.schedulingPolicy`` (copied from the template,
  immutable), ``spec.podGroupTemplateRef.workload`` {workloadName, podGroupTemplateName};
- a pod names its PodGroup in ``spec.schedulingGroup.podGroupName`` (same namespace; immutable; the
  PodGroup may not exist yet: kube-scheduler keeps such a pod pending, and so does this).

So the PodGroup alone says what the gang is: its id here is ``<namespace>/podgroup:<name>`` and its size
``spec.schedulingPolicy.gang.minCount``; a ``basic`` policy is no gang. The Workload is not read (its
template was copied). Watched only when the apiserver serves podgroups (``served``); otherwise the field is
ignored (without the gate the apiserver drops it anyway).
"""

from __future__ import annotations

import logging
from typing import Any

from gpuaware.contract.annotations import PREFIX
from gpuaware.scheduler.kube.objects import PodSpecError

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "scheduling.k8s.io", "v1alpha2", "podgroups"
MAX_GANG = 4096  # as gpuaware.io/gang-size


def group_name(pod: dict[str, Any]) -> str | None:
    """The PodGroup a pod names (``spec.schedulingGroup.podGroupName``), or None."""
    ref = (pod.get("spec") or {}).get("schedulingGroup") or {}
    name = ref.get("podGroupName") if isinstance(ref, dict) else None
    return name if isinstance(name, str) and name else None


def gang_size(group: dict[str, Any]) -> int:
    """A PodGroup's gang size: ``spec.schedulingPolicy.gang.minCount``; 1 for a ``basic`` policy (no gang).
    Raises ``PodSpecError`` for a policy that cannot be read."""
    policy = (group.get("spec") or {}).get("schedulingPolicy") or {}
    if not isinstance(policy, dict):
        raise PodSpecError("spec.schedulingPolicy is not an object")
    gang = policy.get("gang")
    if gang is None:
        return 1
    count = gang.get("minCount") if isinstance(gang, dict) else None
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GANG:
        raise PodSpecError(f"spec.schedulingPolicy.gang.minCount: {count!r} is not a whole number in 1..{MAX_GANG}")
    return count


class PodGroups:
    """The PodGroups the informer saw, by ``namespace/name``; ``served``: the apiserver serves them (set by the
    first list)."""

    def __init__(self) -> None:
        self.served = False
        self.groups: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _key(obj: dict[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    def sync(self, items: list[dict[str, Any]]) -> None:
        self.served = True
        self.groups = {self._key(g): g for g in items}

    def event(self, kind: str, obj: dict[str, Any]) -> str:
        """One PodGroup's change; its ``namespace/name``."""
        key = self._key(obj)
        if kind == "DELETED":
            self.groups.pop(key, None)
        else:
            self.groups[key] = obj
        return key

    def names(self, pod: dict[str, Any]) -> str | None:
        """The ``namespace/name`` of the PodGroup a pod names, when PodGroups are served."""
        name = group_name(pod) if self.served else None
        return None if name is None else f"{pod['metadata'].get('namespace', '')}/{name}"

    def gang_of(self, pod: dict[str, Any], annotated: str | None) -> tuple[str, int] | None:
        """The pod's gang (id, size) from its PodGroup; None when it names none (or names a basic one). Raises
        ``PodSpecError`` while the PodGroup is not there (the pod waits for it), for an unreadable policy, and for
        a pod that names a PodGroup and a ``gpuaware.io/gang`` both (``annotated``)."""
        key = self.names(pod)
        if key is None:
            return None
        if annotated:
            raise PodSpecError(f"{PREFIX}gang and spec.schedulingGroup both name a gang; use one")
        group = self.groups.get(key)
        if group is None:
            raise PodSpecError(f"waiting for PodGroup {key} ({GROUP}/{VERSION}) to exist")
        try:
            size = gang_size(group)
        except PodSpecError as exc:
            raise PodSpecError(f"PodGroup {key}: {exc}") from None
        if size == 1:
            return None
        ns, name = key.split("/", 1)
        return f"{ns}/podgroup:{name}", size
