"""Upstream's transport error: how a callable travels (by name, or pickled)."""

from __future__ import annotations

__all__ = ["TransportError"]


class TransportError(RuntimeError):
    """A callable cannot travel the way asked (``transport="ref"`` for a lambda, or pickling
    on a plane that did not opt in)."""
