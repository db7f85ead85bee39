"""Manifests generated from the contract (``python -m deploy.manifests``) and their offline checks."""
