"""Core: the op table and its rules, costs and networks, compilation to kernel arrays, simulate and Result."""
