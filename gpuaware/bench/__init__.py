"""Benchmarks that print JSON: ``gpuaware bench ...`` and the scripts beside them (gpuaware/bench/README.md)."""
