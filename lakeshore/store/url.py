"""``open_store(url)``: from a URL to a store.

Accepted forms:

* ``":memory:"`` — a fresh :class:`MemoryStore` (one per call; nothing is shared);
* ``"file:///abs/path"``, ``"file://~/dir"``, or a bare path — a :class:`LocalStore`;
  ``?fsync=1`` makes every write durable against power loss;
* ``"s3://bucket/prefix"`` — an :class:`S3Store`; query options ``endpoint_url``, ``region``,
  ``addressing=path|virtual``, ``max_pool_connections``, ``client=auto|boto3|obstore`` (the
  HTTP client; default ``$LAKESHORE_S3_CLIENT``, else ``auto``: obstore for GET, PUT and LIST
  wherever it can act as boto3 would, boto3 for the rest and for everything under moto's
  ``mock_aws``); credentials and endpoint otherwise come from the usual AWS environment
  variables and config files.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from lakeshore.errors import InvalidArgument
from lakeshore.store.base import Store
from lakeshore.store.local import LocalStore
from lakeshore.store.memory import MemoryStore

__all__ = ["open_store"]

_FORMS = "use ':memory:', 'file:///abs/path', a directory path, or 's3://bucket/prefix'"
_S3_OPTIONS = {"endpoint_url", "region", "addressing", "max_pool_connections", "client"}


def open_store(url: str | os.PathLike[str], **options: Any) -> Store:
    """Open the store a URL names; ``options`` go to the store's constructor.

    Raises:
        InvalidArgument: the URL has an unknown scheme or a malformed option.
        StoreError: the store cannot be opened (e.g. a directory that cannot be created).
    """
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgument("open_store", f"no store URL given ({url!r})", _FORMS)
    url = url.strip()
    if url == ":memory:":
        return MemoryStore(**options)
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    if parts.scheme == "file":
        path = unquote(parts.netloc + parts.path)  # file://~/x has "~" as its netloc
        if not path:
            raise InvalidArgument("open_store", f"{url!r} names no directory", _FORMS)
        unknown = set(query) - {"fsync"}
        if unknown:
            raise InvalidArgument(
                "open_store", f"unknown option(s) {sorted(unknown)} in {url!r}", "use ?fsync=1"
            )
        if "fsync" in query:
            options.setdefault("fsync", _flag(query["fsync"], url))
        return LocalStore(path, **options)
    if parts.scheme == "s3":
        return _open_s3(url, parts.netloc, parts.path, query, options)
    if parts.scheme == "" and ":" not in url.split("/", 1)[0]:
        return LocalStore(url, **options)
    raise InvalidArgument("open_store", f"unsupported store URL {url!r}", _FORMS)


def _open_s3(
    url: str, bucket: str, path: str, query: dict[str, str], options: dict[str, Any]
) -> Store:
    from lakeshore.store.s3 import S3Store

    if not bucket:
        raise InvalidArgument("open_store", f"{url!r} names no bucket", "write s3://bucket/prefix")
    unknown = set(query) - _S3_OPTIONS
    if unknown:
        raise InvalidArgument(
            "open_store",
            f"unknown option(s) {sorted(unknown)} in {url!r}",
            f"use {sorted(_S3_OPTIONS)}",
        )
    if "endpoint_url" in query:
        options.setdefault("endpoint_url", query["endpoint_url"])
    if "region" in query:
        options.setdefault("region", query["region"])
    if "addressing" in query:
        if query["addressing"] not in ("path", "virtual"):
            raise InvalidArgument(
                "open_store",
                f"addressing={query['addressing']!r} in {url!r}",
                "use path or virtual",
            )
        options.setdefault("path_style", query["addressing"] == "path")
    if "client" in query:
        options.setdefault("transport", query["client"].strip().lower())
    if "max_pool_connections" in query:
        try:
            options.setdefault("max_pool_connections", int(query["max_pool_connections"]))
        except ValueError:
            raise InvalidArgument(
                "open_store", f"max_pool_connections must be an integer in {url!r}", "e.g. 64"
            ) from None
    return S3Store(bucket, unquote(path), **options)


def _flag(value: str, url: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise InvalidArgument("open_store", f"bad flag value {value!r} in {url!r}", "use 1 or 0")
