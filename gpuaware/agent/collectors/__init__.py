"""GPU collectors behind one small interface (``Collector``): NVML for real GPUs, sim for replayed traces."""
