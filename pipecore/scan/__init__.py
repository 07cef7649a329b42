"""Scans: simulate_many (one kernel call, many configurations), grids, scans and the Ray backend."""
