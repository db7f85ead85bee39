"""Pods and nodes from the API: any input either decodes or raises PodSpecError (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contract import annotations as ann
from gpuaware.local.fake_apiserver import make_node, make_pod
from scheduler.kube import objects
from tests.support import FUZZ, printable_text

ANNOTATION_KEYS = ["gpu-milli", "gpu-memory-mib", "sharing", "gpu-models", "min-gpu-memory-gib",
                   "min-memory-bandwidth-gbs", "tensor-cores", "interconnect", "qos", "preemptible", "checkpoint",
                   "deferrable", "gang", "gang-size", "duration-s", "gpus"]
quantities = st.one_of(printable_text, st.from_regex(r"\A[0-9]{1,4}(m|Mi|Gi|k)?\Z"), st.integers(-5, 20).map(str),
                       st.from_regex(r"\A[0-9]{1,3}e[0-9]{1,3}\Z"))


@FUZZ
@given(st.dictionaries(st.sampled_from(ANNOTATION_KEYS), printable_text, max_size=5), quantities, quantities,
       quantities, st.integers(-10**6, 10**9))
def test_pod_requests_decode_or_raise_pod_spec_error(annotations, gpus, cpu, memory, priority):
    pod = make_pod("p", annotations={ann.PREFIX + k: v for k, v in annotations.items()}, priority=priority)
    container = pod["spec"]["containers"][0]
    container["resources"] = {"limits": {ann.GPU_RESOURCE: gpus}, "requests": {"cpu": cpu, "memory": memory}}
    try:
        pw = objects.workload_of(pod, "t", 0.0)
    except objects.PodSpecError as exc:
        assert str(exc)
        return
    w = pw.workload
    assert w.num_gpu >= 0 and 0 < w.gpu_milli <= 1000 and pw.gang_size >= 1


@FUZZ
@given(printable_text, quantities, quantities, quantities,
       st.dictionaries(st.sampled_from([ann.ANN_CORDONED, "x"]), printable_text))
def test_nodes_decode_or_raise_pod_spec_error(product, gpus, cpu, memory, annotations):
    node = make_node("n", product=product)
    node["status"]["allocatable"] = {"cpu": cpu, "memory": memory, ann.GPU_RESOURCE: gpus}
    node["metadata"]["annotations"] = annotations
    try:
        spec = objects.node_spec(node)
    except objects.PodSpecError as exc:
        assert str(exc)
        return
    assert spec.gpus >= 0 and spec.cpu_milli >= 0 and spec.memory_mib >= 0
    assert all(g >= 0 for g in ann.cordoned_gpus(node))
