"""Plumbing every component shares: Kafka client settings and administration, logging and
tracing, the Kubernetes client wrapper and informer, metric helpers, where the public traces are.

It imports the contract and third-party clients, never ``agent``, ``stream`` or ``scheduler``.
"""
