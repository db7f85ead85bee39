"""Manifests generated from the contract (``python -m gpuaware.deploy.manifests``) and their offline checks."""
