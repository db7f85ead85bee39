"""GPUs as Dynamic Resource Allocation devices (``resource.k8s.io/v1``), shaped as NVIDIA's DRA driver shapes them.

Pure data, no I/O: the names NVIDIA's GPU kubelet plugin (github.com/NVIDIA/k8s-dra-driver-gpu,
``cmd/gpu-kubelet-plugin``: deviceinfo.go, mig.go, partitions.go, device_health.go) publishes, builders
for ResourceSlice dicts of that shape, and :func:`parse_slice`, which reads a slice published by
NVIDIA's driver (or by :mod:`gpuaware.plumbing.kube.resource_slices`) as it is and refuses a malformed one with
the field and the reason (:class:`SliceInvalid`).

Shape (docs/dra.md):

* driver ``gpu.nvidia.com``; a whole GPU is device ``gpu-<minor>``, a MIG partition
  ``gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>``;
* attributes without a domain belong to the driver's (``type``: ``gpu`` | ``mig``, ``uuid``,
  ``productName``, ``brand``, ``architecture``, ``cudaComputeCapability`` / ``driverVersion`` /
  ``cudaDriverVersion`` as semver versions, ``parentUUID`` and ``profile`` on MIG devices), the PCI ones
  are Kubernetes' standard ``resource.kubernetes.io/pciBusID`` / ``pcieRoot``;
* capacity ``memory`` in bytes; MIG partitions add ``multiprocessors``, ``copyEngines``, ``decoders``,
  ``encoders``, ``jpegEngines``, ``ofaEngines`` (static MIG devices also one ``memorySlice<i>`` per memory
  slice they hold; the builders here make partitionable devices, which hold their slices as counters);
* partitionable devices (KEP 4815): one counter set ``gpu-<minor>-counter-set`` per GPU that has MIG
  partitions; the whole GPU consumes all of it, each partition its share and its memory slices, so the
  allocator never hands out a GPU and one of its partitions, nor two overlapping partitions.
  kube-apiserver 1.36 refuses ``sharedCounters`` and ``devices`` in one slice ("only one of
  `sharedCounters` or `devices` is allowed"): counters go in a slice of their own in the same pool.

What NVIDIA does not publish, gpuaware publishes under its own domain ``gpu.gpuaware.io``:
``gpu.gpuaware.io/nvlinkIsland`` (the NVLink island a GPU belongs to, the index of the node's fully
connected group) and ``gpu.gpuaware.io/index`` (the GPU's index as the agent and the annotations count
it, which is not always the minor number).
"""

from gpuaware.contract.dra.parse import (
    MAX_TOLERATIONS_PER_REQUEST,
    TOLERATION_OPERATORS,
    DeviceView,
    SliceView,
    Taint,
    TaintRuleView,
    Toleration,
    incomplete_pools,
    parse_device,
    parse_slice,
    parse_taint_rule,
    parse_tolerations,
    pool_devices,
    quantity,
    tolerated,
)
from gpuaware.contract.dra.shape import (
    API_VERSION,
    ATTR_ADDRESSING_MODE,
    ATTR_ARCHITECTURE,
    ATTR_BRAND,
    ATTR_CUDA_COMPUTE_CAPABILITY,
    ATTR_CUDA_DRIVER_VERSION,
    ATTR_DRIVER_VERSION,
    ATTR_INDEX,
    ATTR_NVLINK_ISLAND,
    ATTR_PARENT_UUID,
    ATTR_PCI_BUS_ID,
    ATTR_PCIE_ROOT,
    ATTR_PRODUCT_NAME,
    ATTR_PROFILE,
    ATTR_TYPE,
    ATTR_UUID,
    CAP_MEMORY,
    DEVICE_CLASS_GPU,
    DEVICE_CLASS_MIG,
    DRIVER,
    EXTENDED_RESOURCE,
    GPUAWARE_DOMAIN,
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS,
    MAX_TAINTS_PER_DEVICE,
    MIG_CAPACITIES,
    TAINT_EFFECTS,
    TAINT_GPU_LOST,
    TAINT_UNHEALTHY,
    TAINT_UNMONITORED,
    TAINT_XID,
    TYPE_GPU,
    TYPE_MIG,
    MigPartition,
    SliceInvalid,
    counter_set_name,
    device_taint,
    gpu_counter_set,
    gpu_device,
    gpu_device_name,
    memory_slice_counter,
    mig_device,
    mig_device_name,
    resource_slice,
    semver,
    slice_name,
)

__all__ = [
    "API_VERSION",
    "ATTR_ADDRESSING_MODE",
    "ATTR_ARCHITECTURE",
    "ATTR_BRAND",
    "ATTR_CUDA_COMPUTE_CAPABILITY",
    "ATTR_CUDA_DRIVER_VERSION",
    "ATTR_DRIVER_VERSION",
    "ATTR_INDEX",
    "ATTR_NVLINK_ISLAND",
    "ATTR_PARENT_UUID",
    "ATTR_PCIE_ROOT",
    "ATTR_PCI_BUS_ID",
    "ATTR_PRODUCT_NAME",
    "ATTR_PROFILE",
    "ATTR_TYPE",
    "ATTR_UUID",
    "CAP_MEMORY",
    "DEVICE_CLASS_GPU",
    "DEVICE_CLASS_MIG",
    "DRIVER",
    "EXTENDED_RESOURCE",
    "GPUAWARE_DOMAIN",
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_COUNTER_SETS_PER_SLICE",
    "MAX_DEVICES_PER_SLICE",
    "MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS",
    "MAX_TAINTS_PER_DEVICE",
    "MAX_TOLERATIONS_PER_REQUEST",
    "MIG_CAPACITIES",
    "TAINT_EFFECTS",
    "TAINT_GPU_LOST",
    "TAINT_UNHEALTHY",
    "TAINT_UNMONITORED",
    "TAINT_XID",
    "TOLERATION_OPERATORS",
    "TYPE_GPU",
    "TYPE_MIG",
    "DeviceView",
    "MigPartition",
    "SliceInvalid",
    "SliceView",
    "Taint",
    "TaintRuleView",
    "Toleration",
    "counter_set_name",
    "device_taint",
    "gpu_counter_set",
    "gpu_device",
    "gpu_device_name",
    "incomplete_pools",
    "memory_slice_counter",
    "mig_device",
    "mig_device_name",
    "parse_device",
    "parse_slice",
    "parse_taint_rule",
    "parse_tolerations",
    "pool_devices",
    "quantity",
    "resource_slice",
    "semver",
    "slice_name",
    "tolerated",
]
