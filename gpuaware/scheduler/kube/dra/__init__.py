"""Dynamic Resource Allocation: slices read, claims allocated by the core, taints, writes."""
