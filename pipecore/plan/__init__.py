"""Planning whole training runs: data x tensor x pipeline parallelism on a
named cluster (issue 53).

``arch`` describes a model's architecture, ``hardware`` the GPUs and
clusters (every constant with its public source, read from ``data/``),
``strategy`` a parallel layout, ``estimate`` one strategy's iteration time
and memory per GPU, built on pipecore's own schedules and simulator.
"""
