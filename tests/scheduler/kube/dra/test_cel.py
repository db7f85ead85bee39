"""The CEL forms DeviceClass and request selectors use, read by gpuaware; anything else refused with where."""

from __future__ import annotations

import pytest

from gpuaware.scheduler.kube.dra.cel import DeviceFacts, UnsupportedCel, compile_selector

D = "gpu.nvidia.com"
H100 = DeviceFacts(D, {f"{D}/type": "gpu", f"{D}/productName": "NVIDIA H100 80GB HBM3", f"{D}/architecture": "Hopper",
                       f"{D}/uuid": "GPU-1", "gpu.gpuaware.io/nvlinkIsland": 1},
                   {f"{D}/memory": 80 * 2**30})


@pytest.mark.parametrize(("expression", "expected"), [
    (f'device.driver == "{D}"', True),
    (f'device.driver != "{D}"', False),
    (f"device.driver == '{D}'", True),
    (f'device.attributes["{D}"].productName == "NVIDIA H100 80GB HBM3"', True),
    (f'device.attributes["{D}"].type == "mig"', False),
    (f'device.attributes["{D}"].architecture == "Hopper" && device.attributes["{D}"].type == "gpu"', True),
    (f'device.attributes["{D}"].architecture == "Ampere" || device.attributes["{D}"].type == "gpu"', True),
    (f'!(device.attributes["{D}"].type == "gpu")', False),
    (f'device.capacity["{D}"].memory.compareTo(quantity("40Gi")) >= 0', True),
    (f'device.capacity["{D}"].memory.compareTo(quantity("81Gi")) >= 0', False),
    (f'device.capacity["{D}"].memory.isGreaterThan(quantity("79Gi"))', True),
    ('device.attributes["gpu.gpuaware.io"].nvlinkIsland == 1', True),
    (f'"uuid" in device.attributes["{D}"]', True),
    (f'"parentUUID" in device.attributes["{D}"]', False),
    (f'device.attributes["{D}"].productName.lowerAscii().contains("h100")', True),
    (f'device.attributes["{D}"].productName.startsWith("NVIDIA A")', False),
    # An attribute the device lacks, or types that do not compare: the device does not match (CEL: an error).
    (f'device.attributes["{D}"].profile == "1g.10gb"', False),
    (f'device.attributes["{D}"].productName == 1', False),
])
def test_the_common_forms_evaluate_as_kubernetes_would(expression, expected):
    assert compile_selector(expression).matches(H100) is expected


@pytest.mark.parametrize(("expression", "where"), [
    (f'device.attributes["{D}"].productName.matches("H1.*")', "method matches()"),
    ("size(device.attributes) > 2", "'size'"),
    ("device.allowMultipleAllocations", "device.allowMultipleAllocations"),
    (f'device.attributes["{D}"].productName in ["a", "b"]', "'['"),
    ("device.driver ==", "expected more"),
    ("device.driver == `x`", "cannot read"),
])
def test_anything_else_is_refused_naming_what_and_where(expression, where):
    with pytest.raises(UnsupportedCel, match="CEL") as info:
        compile_selector(expression)
    assert where in str(info.value)


def test_the_shipped_device_classes_and_the_example_workload_are_read():
    """What deploy/ ships (NVIDIA's DeviceClasses, the example's request selectors) is within what gpuaware reads."""
    import json
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[4]
    docs = [d for f in (repo / "deploy/components/dra-deviceclasses/deviceclasses.yaml",
                        repo / "deploy/examples/dra/workload.yaml") for d in yaml.safe_load_all(f.read_text()) if d]
    found = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("cel"), dict):
                found.append(node["cel"]["expression"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(json.dumps(docs)))
    assert len(found) >= 4, found
    for expression in found:
        compile_selector(expression)  # raises UnsupportedCel otherwise
    gpu = compile_selector(found[0])
    assert gpu.matches(H100)
