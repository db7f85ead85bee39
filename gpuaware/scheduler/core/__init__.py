"""The scheduling core: pure (no I/O), state in, decisions out. The simulator and the live scheduler run it."""
