"""Scheduling plugins, one per file, each implementing extension points of ``framework.py``
(filters return masks, scores one value per candidate); ``registry.py`` builds them by name."""
