"""The Kubernetes client wrapper (typed calls, one error vocabulary) and the informer."""
