"""Run on the GPU machine: exercise the NVML collector and print what it reads."""
import json, time, dataclasses, subprocess, sys
from agent.collectors.nvml import NvmlCollector
c = NvmlCollector("gpu-box")
devs = c.devices()
print("DEVICES", json.dumps([dataclasses.asdict(d) for d in devs], default=str))
for i in range(3):
    for d in devs:
        r = c.read(d.index, full=True)
        print("READ", i, json.dumps({k: v for k, v in dataclasses.asdict(r).items()}, default=str))
    time.sleep(1)
w = c.read(0, full=False)
print("WATCH", json.dumps(dataclasses.asdict(w), default=str))
print("XIDS", c.xid_events())
t = time.perf_counter(); n = 0
while time.perf_counter() - t < 2:
    c.read(0, full=False); n += 1
print("WATCH_READ_US", round(2e6 / n, 1))
t = time.perf_counter(); n = 0
while time.perf_counter() - t < 2:
    c.read(0, full=True); n += 1
print("FULL_READ_US", round(2e6 / n, 1))
c.close()
