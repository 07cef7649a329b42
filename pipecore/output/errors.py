"""The error a writer, plot or page raises when an optional dependency is missing."""

from __future__ import annotations

from ..core.ops import PipecoreError

__all__ = ["MissingDependencyError"]


class MissingDependencyError(PipecoreError, ImportError):
    """An optional third-party dependency needed by a writer is not installed.

    Subclasses :class:`ImportError` so callers that already guard optional
    imports with ``except ImportError`` keep working.
    """
