"""Pods and nodes translated to the core's model; bad requests name the annotation, and any input either
decodes or raises PodSpecError (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuaware.contract import annotations as ann
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.kube import objects
from tests.support import FUZZ, printable_text


def test_pods_and_nodes_translate_to_the_core_model():
    node = objects.node_spec(make_node("n1", gpus=4, product="NVIDIA-A100-SXM4-80GB", cpu="32", memory="256Gi"))
    assert (node.name, node.gpus, node.model, node.cpu_milli, node.memory_mib) == ("n1", 4, "A100", 32000, 262144)
    assert node.gpu_memory_mib == 80 * 1024
    plain = objects.workload_of(make_pod("p", gpus=2, cpu="500m", memory="2Gi"), "t", 0.0).workload
    assert (plain.num_gpu, plain.gpu_milli, plain.cpu_milli, plain.memory_mib) == (2, 1000, 500, 2048)
    frac = objects.workload_of(make_pod("f", gpus=0, annotations={
        "gpuaware.io/gpu-milli": "250", "gpuaware.io/sharing": "mps", "gpuaware.io/gpu-models": "H100,A100",
        "gpuaware.io/gang": "g", "gpuaware.io/gang-size": "4"}, priority=200_000), "vision", 0.0)
    w = frac.workload
    assert (w.num_gpu, w.gpu_milli, w.models, w.priority, w.preemptible, w.gang, frac.gang_size) == \
        (1, 250, ("H100", "A100"), 2, False, "default/g", 4)
    assert w.labels == {"sharing": "mps"} and w.tenant == "vision"


@pytest.mark.parametrize(("annotations", "gpus", "message"), [
    ({"gpuaware.io/gpu-milli": "1500"}, 0, "gpuaware.io/gpu-milli: 1500 is outside 1..999"),
    ({"gpuaware.io/gpu-milli": "500"}, 2, "a fraction is of one GPU"),
    ({"gpuaware.io/sharing": "vgpu"}, 1, "gpuaware.io/sharing: 'vgpu' is not one of"),
    ({"gpuaware.io/preemptible": "maybe"}, 1, "gpuaware.io/preemptible: 'maybe' is not true or false"),
    ({"gpuaware.io/gang-size": "3"}, 1, "gpuaware.io/gang-size: needs gpuaware.io/gang"),
])
def test_bad_pod_requests_are_rejected_with_the_annotation(annotations, gpus, message):
    with pytest.raises(objects.PodSpecError, match=message.replace(".", r"\.").replace("(", r"\(")):
        objects.workload_of(make_pod("p", gpus=gpus, annotations=annotations), "t", 0.0)


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


def test_a_declared_duration_is_the_live_schedulers_runtime_estimate_and_none_declared_is_unknown():
    import math

    from gpuaware.scheduler.core.preemption import Running
    from gpuaware.scheduler.core.runtime import PredictedEnds

    declared = objects.workload_of(make_pod("d", gpus=1, annotations={"gpuaware.io/duration-s": "600"}), "t", 0.0)
    silent = objects.workload_of(make_pod("s", gpus=1), "t", 0.0)
    assert declared.workload.runtime.source == "declared" and declared.workload.runtime.p90() == pytest.approx(600)
    assert silent.workload.runtime is None
    running = {w.id: Running(w, None, started_s=100.0, done_s=0.0, checkpoint_every_s=None)
               for w in (declared.workload, silent.workload)}
    ends = PredictedEnds(running, now=400.0)
    assert ends[declared.workload.id] == pytest.approx(700.0)  # started at 100, declared 600 s
    assert ends[silent.workload.id] == math.inf  # unknown: nothing to wait for
