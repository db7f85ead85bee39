"""Benchmarks that print JSON: ``gpuaware bench ...`` and the scripts beside them (bench/README.md)."""
