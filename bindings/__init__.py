"""Adapters between pipecore schedules and the frameworks that run them.

Installed as ``pipecore.bindings``. Importing this package imports no
framework: each adapter is a submodule that needs its own optional extra.

- :mod:`pipecore.bindings.torch`: PyTorch's ``torch.distributed.pipelining``
  (``pip install 'pipecore[torch]'``): export and import of
  ``pipeline_order`` and its CSV, torch's own schedules as pipecore
  schedules, real runs on CPU ranks and cost calibration.
"""

__all__ = ["torch"]


def __getattr__(name):
    # ``from pipecore.bindings import torch`` works without this; it is here so
    # that ``pipecore.bindings.torch`` also resolves after a bare package import.
    if name == "torch":
        import importlib

        return importlib.import_module(f"{__name__}.torch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
