"""The queries of NVIDIA's Grafana dashboard for dcgm-exporter (``grafana/dcgm-exporter-dashboard.json``
of github.com/NVIDIA/dcgm-exporter, read at commit d5e5f51), panel title -> expression, and its
variables' source series. The tests run them unchanged against the agent."""

from __future__ import annotations

SELECTOR = 'instance=~"$instance", gpu=~"$gpu"'
PANELS = {
    "GPU Temperature": f"DCGM_FI_DEV_GPU_TEMP{{{SELECTOR}}}",
    "GPU Avg. Temp": f"avg(DCGM_FI_DEV_GPU_TEMP{{{SELECTOR}}})",
    "GPU Power Usage": f"DCGM_FI_DEV_POWER_USAGE{{{SELECTOR}}}",
    "GPU Power Total": f"sum(DCGM_FI_DEV_POWER_USAGE{{{SELECTOR}}})",
    "GPU SM Clocks": f"DCGM_FI_DEV_SM_CLOCK{{{SELECTOR}}} * 1000000",
    "GPU Utilization": f"DCGM_FI_DEV_GPU_UTIL{{{SELECTOR}}}",
    "GPU Framebuffer Mem Used": f"DCGM_FI_DEV_FB_USED{{{SELECTOR}}}",
    "Tensor Core Utilization": f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{SELECTOR}}}",
}
VARIABLE_SOURCES = ["DCGM_FI_DEV_GPU_TEMP"]  # label_values(DCGM_FI_DEV_GPU_TEMP, instance) and (..., gpu)
# Filled from NVML GPM, which exists on Hopper and newer only (gpuaware.contract.dcgm.GPM_ONLY): empty on
# older GPUs with this agent, where dcgm-exporter fills it from DCGM's profiling module.
GPM_PANELS = {"Tensor Core Utilization"}
