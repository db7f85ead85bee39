"""Trace-driven simulation of the scheduling core."""
