"""lakeshore: a task queue whose only server is object storage.

This release ships the foundation: the object-store layer (``lakeshore.store``), the error
tree, and ``lakeshore doctor``. The queue plane builds on them.
"""

from __future__ import annotations

from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    LakeshoreError,
    NotFound,
    PermissionDenied,
    StoreError,
    StoreUnavailable,
)
from lakeshore.store import open_store

__version__ = "0.1.0"

__all__ = [
    "Conflict",
    "InvalidArgument",
    "LakeshoreError",
    "NotFound",
    "PermissionDenied",
    "StoreError",
    "StoreUnavailable",
    "__version__",
    "open_store",
]
