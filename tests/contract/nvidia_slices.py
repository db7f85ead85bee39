"""ResourceSlices as NVIDIA's DRA driver (gpu-kubelet-plugin) publishes them, written out by hand from its
source (cmd/gpu-kubelet-plugin deviceinfo.go GetDevice, mig.go CommonAttributesMig/CommonCapacitiesMig,
partitions.go PartGetDevice) for an 8x H100 node in the default mode and an A100 with static MIG devices.
Shared by the parser's tests and the real-apiserver tests (they must be accepted as they are)."""

from __future__ import annotations

from typing import Any


def _gpu(minor: int, uuid: str, bus: str) -> dict[str, Any]:
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": bus},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            "addressingMode": {"string": "HMM"},
        },
        "capacity": {"memory": {"value": "81559Mi"}},
    }


def h100_node(node: str = "h100-0") -> dict[str, Any]:
    devices = [_gpu(i, f"GPU-4a1c2b0e-7f7d-5a5e-8c61-0000000000{i:02d}", f"0000:{0x18 + i * 0x10:02x}:00.0")
               for i in range(8)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com-x7k2p", "generateName": f"{node}-gpu.nvidia.com-"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}


def a100_static_mig_node(node: str = "a100-0") -> dict[str, Any]:
    """GPU 0 whole; GPU 1 split into 3g.40gb + two 2g.20gb (static MIG: live devices with UUIDs, capacity
    including the memory slices they hold)."""
    common = {"productName": {"string": "NVIDIA A100-SXM4-80GB"}, "brand": {"string": "Nvidia"},
              "architecture": {"string": "Ampere"}, "cudaComputeCapability": {"version": "8.0.0"},
              "driverVersion": {"version": "550.54.15"}, "cudaDriverVersion": {"version": "12.4.0"}}

    def mig(profile: str, pid: int, start: int, size: int, sms: int, mem_mib: int, n: int) -> dict[str, Any]:
        cap = {"multiprocessors": {"value": str(sms)}, "copyEngines": {"value": "3"},
               "decoders": {"value": "2"}, "encoders": {"value": "0"}, "jpegEngines": {"value": "0"},
               "ofaEngines": {"value": "0"}, "memory": {"value": str(mem_mib * 1024 * 1024)}}
        for i in range(start, start + size):
            cap[f"memorySlice{i}"] = {"value": "1"}
        return {"name": f"gpu-1-mig-{profile.replace('.', '')}-{pid}-{start}",
                "attributes": {"type": {"string": "mig"}, "uuid": {"string": f"MIG-9b2e-{n}"},
                               "parentUUID": {"string": "GPU-a100-1"}, "profile": {"string": profile},
                               **common},
                "capacity": cap}

    whole = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-a100-0"}, **common},
             "capacity": {"memory": {"value": "85899345920"}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com-q9z4d"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 3, "resourceSliceCount": 1},
                     "devices": [whole, mig("3g.40gb", 9, 0, 4, 42, 40192, 1),
                                 mig("2g.20gb", 14, 4, 2, 28, 19968, 2), mig("2g.20gb", 14, 6, 2, 28, 19968, 3)]}}
