"""Search: local search over op orders, tune, the MILP optimum and model partitioning.

``pc.search`` is this package; :func:`local_search` is its entry point.
"""

from .local import local_search

__all__ = ["local_search"]
