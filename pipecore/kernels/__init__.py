"""Kernels: every Numba-compiled function, plain arrays in and out (no Arrow, no pipecore objects)."""
