"""The local stack ``gpuaware up`` runs on one machine: the embedded broker, a local API server,
Prometheus, and the supervised component processes. Stand-ins for a cluster, never used by a
component in production.
"""
