"""Local stand-ins built from real upstream parts (a real Kubernetes control plane) for tests and benchmarks."""
