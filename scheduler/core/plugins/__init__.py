"""Scheduling plugins, one per file: filters return masks, scores return one value per candidate."""
