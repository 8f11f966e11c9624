"""The object-store layer: one contract, three backends, and ``open_store(url)``.

Nothing here imports the queue layer. ``S3Store`` (and with it boto3) is imported lazily, so
``:memory:`` and ``file://`` users never pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakeshore.store.base import (
    CREATE,
    OVERWRITE,
    ObjectInfo,
    PutMode,
    Store,
    check_key,
    if_match,
)
from lakeshore.store.local import LocalStore
from lakeshore.store.memory import MemoryStore
from lakeshore.store.url import open_store

if TYPE_CHECKING:
    from lakeshore.store.s3 import S3Store

__all__ = [
    "CREATE",
    "OVERWRITE",
    "LocalStore",
    "MemoryStore",
    "ObjectInfo",
    "PutMode",
    "S3Store",
    "Store",
    "check_key",
    "if_match",
    "open_store",
]


def __getattr__(name: str) -> Any:
    if name == "S3Store":
        from lakeshore.store.s3 import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
