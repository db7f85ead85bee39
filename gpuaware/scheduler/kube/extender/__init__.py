"""The kube-scheduler extender: HTTP verbs, access control, argument parsing."""
