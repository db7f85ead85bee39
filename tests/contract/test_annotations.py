"""The node annotation of which pods hold which GPU (gpuaware.contract.annotations.gpu_pods): its round trip, and a
clear
error naming the field and the reason for each malformed value."""

from __future__ import annotations

import pytest

from gpuaware.contract import annotations


def _node(value: str) -> dict:
    return {"metadata": {"annotations": {annotations.ANN_GPU_PODS: value}}}


def test_gpu_pods_round_trip_sorted_and_empty_means_removed():
    value = annotations.gpu_pods_value({3: ["b/y", "a/x", "a/x"], 0: [], 1: ["ns/p"]})
    assert value == '{"1":["ns/p"],"3":["a/x","b/y"]}'
    assert annotations.gpu_pods(_node(value)) == {1: {"ns/p"}, 3: {"a/x", "b/y"}}
    assert annotations.gpu_pods_value({0: []}) is None
    assert annotations.gpu_pods({"metadata": {}}) == {}


@pytest.mark.parametrize(("value", "reason"), [
    ("{", "not JSON"),
    ("[1]", "want an object"),
    ('{"gpu0": ["a/b"]}', "key 'gpu0' is not a GPU index"),
    ('{"0": "a/b"}', "GPU 0: 'a/b' is not a list of namespace/name"),
    ('{"0": ["justname"]}', "is not a list of namespace/name"),
    ('{"0": ["a/b/c"]}', "is not a list of namespace/name"),
    ('{"0": ["/b"]}', "is not a list of namespace/name"),
])
def test_a_malformed_gpu_pods_annotation_names_the_field_and_the_reason(value, reason):
    with pytest.raises(ValueError, match=f"annotation {annotations.ANN_GPU_PODS}: .*") as exc:
        annotations.gpu_pods(_node(value))
    assert reason in str(exc.value)
