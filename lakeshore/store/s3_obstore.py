"""The obstore transport of ``S3Store``: GET, PUT and LIST through obstore (Rust's
``object_store``), which spends a fraction of botocore's CPU per request.

Imported only by :mod:`lakeshore.store.s3`, when a store may send its data path through
obstore (the default, or ``client=obstore``). It sends requests and reports what came back;
everything else stays in ``s3.py``: the choice of client, the one translation table, the
one retry loop, the ambiguous-412 read-back, conditional deletes, the clock. obstore has no
conditional DELETE and exposes no response headers (so no ``Date``): those requests keep
going through the store's boto3 client.

obstore's own retries are switched off (``max_retries=0``): a retried conditional PUT whose
first attempt landed comes back 412 although it succeeded, which only ``S3Store``'s loop
knows how to settle.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from lakeshore.errors import InvalidArgument

try:
    import obstore
    import obstore.exceptions as oex
    from obstore.store import S3Store as _ObS3Store
except ImportError as e:  # pragma: no cover - exercised by the missing-package test via a stub
    raise InvalidArgument(
        "S3Store",
        f"the obstore S3 client cannot be imported ({e})",
        "pip install 'obstore>=0.12.1,<0.13' (lakeshore-queue depends on it), or use client=boto3",
    ) from None

__all__ = ["ERRORS", "ObstoreTransport", "describe", "settings_only_obstore_reads", "version"]

# What the transport's calls raise. FileNotFoundError is obstore's 404; it is caught only
# around obstore calls, so a local file error elsewhere can never be mistaken for one.
ERRORS: tuple[type[Exception], ...] = (oex.BaseError, FileNotFoundError)

_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
# Failures below HTTP: the request may or may not have reached the server.
_IO = re.compile(
    r"error sending request|HTTP error|error decoding response body|connection|timed out"
    r"|operation timed out|request or response body error|unexpected EOF",
    re.IGNORECASE,
)
# A 301 without a Location header: S3's answer to a request sent to another region than the
# bucket's, which obstore reports without quoting the answer.
_REDIRECT = re.compile(r"BareRedirect|redirect without LOCATION", re.IGNORECASE)
# obstore's error classes for the answers it recognises; the status in the message wins.
_BY_CLASS: list[tuple[type[BaseException], int]] = [
    (FileNotFoundError, 404),
    (oex.AlreadyExistsError, 412),
    (oex.PreconditionError, 412),
    (oex.PermissionDeniedError, 403),
    (oex.UnauthenticatedError, 401),
    (oex.NotSupportedError, 501),
]


# Settings obstore reads from the environment and boto3 ignores, that change where requests
# go or what they carry; the ones S3Store always passes explicitly (region, endpoint when it
# has one, addressing, plain HTTP, conditional puts, credentials) override the environment.
_OBSTORE_ONLY_ENV = (
    "AWS_SKIP_SIGNATURE",
    "AWS_S3_EXPRESS",
    "AWS_REQUEST_PAYER",
    "AWS_UNSIGNED_PAYLOAD",
    "AWS_CHECKSUM_ALGORITHM",
    "AWS_SERVER_SIDE_ENCRYPTION",
    "AWS_SSE_KMS_KEY_ID",
    "AWS_SSE_BUCKET_KEY_ENABLED",
    "AWS_SSE_CUSTOMER_KEY_BASE64",
    "AWS_PROXY_URL",
    "AWS_ALLOW_INVALID_CERTIFICATES",
)


def settings_only_obstore_reads(endpoint_given: bool) -> list[str]:
    """The environment variables set now that obstore would follow and boto3 ignores: with
    any, the two clients of one store could differ (``AWS_ENDPOINT`` sends requests to
    another server when the store passes no endpoint of its own)."""
    names = [*_OBSTORE_ONLY_ENV, *(() if endpoint_given else ("AWS_ENDPOINT",))]
    return [name for name in names if os.environ.get(name, "").strip()]


def version() -> str:
    """obstore's version, for the doctor."""
    return str(getattr(obstore, "__version__", "?"))


def describe(e: BaseException) -> tuple[int | None, str, bool]:
    """``(http_status, s3_code, transport_failed)`` of an exception from this transport.

    ``transport_failed`` is true when no HTTP answer came back (reset, timeout, cut body):
    S3Store retries those like botocore's connection errors. The status and code are read
    from obstore's message, which quotes the server's answer; the class is the fallback.
    """
    text = str(e)
    m = _STATUS.search(text)
    status = int(m.group(1)) if m else None
    if status is None:
        status = next((s for cls, s in _BY_CLASS if isinstance(e, cls)), None)
    c = _CODE.search(text)
    code = c.group(1) if c else ""
    if status is None and not code and _REDIRECT.search(text):
        return 301, "PermanentRedirect", False
    if status is None and not code and _IO.search(text):
        return None, "connection", True
    return status, code or type(e).__name__, False


@dataclass(frozen=True, slots=True)
class Fetched:
    """A GET whose headers arrived: size and etag known, body not read yet."""

    size: int
    etag: str
    read: Callable[[], bytes]


@dataclass(frozen=True, slots=True)
class AFetched:
    """:class:`Fetched` of an async GET: the body is read by awaiting ``read()``."""

    size: int
    etag: str
    read: Callable[[], Awaitable[bytes]]


class _SessionCredentials:
    """obstore asks this for credentials: boto3's chain (environment, config files, SSO,
    instance roles), so both clients sign as the same identity. Cached by obstore until
    ``expires_at``; kept short so refreshed role credentials are picked up in time."""

    _TTL = timedelta(minutes=5)

    def __init__(self, credentials: Any) -> None:
        self._credentials = credentials

    def __call__(self) -> dict[str, Any]:
        frozen = self._credentials.get_frozen_credentials()
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(UTC) + self._TTL,
        }


class ObstoreTransport:
    """GET, PUT and LIST of one bucket through obstore. Keys are full object keys (the
    store's prefix included); errors are obstore's, for :func:`describe`."""

    name = "obstore"

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None,
        region: str,
        virtual_hosted: bool | None,
        credentials: dict[str, str],
        session: Any,
        root_certificate: bytes | None,
        max_pool_connections: int,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        config: dict[str, Any] = {"region": region, "conditional_put": "etag"}
        if endpoint_url:
            config["endpoint"] = endpoint_url
        if virtual_hosted is not None:
            config["virtual_hosted_style_request"] = virtual_hosted
        provider = None
        if credentials:
            config.update(credentials)
        else:
            found = session.get_credentials()
            if found is not None:  # else obstore's own chain, and its error at first use
                provider = _SessionCredentials(found)
        client_options: dict[str, Any] = {
            "allow_http": bool(endpoint_url and endpoint_url.startswith("http://")),
            "connect_timeout": timedelta(seconds=connect_timeout),
            # botocore's read_timeout is per read; so is this one. The overall limit stays
            # generous: a server may hold a contended conditional write for seconds.
            "read_timeout": timedelta(seconds=read_timeout),
            "timeout": timedelta(seconds=max(read_timeout * 4, 60.0)),
            "pool_max_idle_per_host": str(max_pool_connections),
        }
        if root_certificate is not None:  # boto3's CA bundle; obstore adds it to its roots
            client_options["root_certificate"] = root_certificate
        self.bucket = bucket
        self._store = _ObS3Store(
            bucket,
            config=config,  # type: ignore[arg-type]
            client_options=client_options,  # type: ignore[arg-type]
            retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=0)},
            credential_provider=provider,  # type: ignore[arg-type]
        )

    def get(self, key: str) -> Fetched:
        result = obstore.get(self._store, key)
        meta = result.meta
        return Fetched(int(meta["size"]), str(meta["e_tag"] or ""), lambda: bytes(result.bytes()))

    def put(self, key: str, data: bytes, condition: str, etag: str | None) -> str:
        mode: Any = "overwrite"
        if condition == "create":
            mode = "create"
        elif condition == "if_match":
            mode = {"e_tag": etag}
        # never multipart: a multipart upload cannot carry the write's condition
        result = obstore.put(self._store, key, data, mode=mode, use_multipart=False)
        return str(result["e_tag"] or "")

    async def aget(self, key: str) -> AFetched:
        """:meth:`get` on obstore's async client (no thread)."""
        result = await obstore.get_async(self._store, key)
        meta = result.meta

        async def read() -> bytes:
            return bytes(await result.bytes_async())

        return AFetched(int(meta["size"]), str(meta["e_tag"] or ""), read)

    async def aput(self, key: str, data: bytes, condition: str, etag: str | None) -> str:
        """:meth:`put` on obstore's async client (no thread)."""
        mode: Any = "overwrite"
        if condition == "create":
            mode = "create"
        elif condition == "if_match":
            mode = {"e_tag": etag}
        result = await obstore.put_async(self._store, key, data, mode=mode, use_multipart=False)
        return str(result["e_tag"] or "")

    def lister(self, prefix: str, start_after: str | None) -> Lister:
        """The pages of a listing of ``prefix`` (a full key prefix), strictly after
        ``start_after``."""
        return Lister(self._store, prefix, start_after)


Entry = tuple[str, str, int, float]  # full key, etag, size, last modified (epoch seconds)


class Lister:
    """A listing that survives a failed page: after an error, the next call starts over
    just after the last key it returned (S3Store's retry loop calls it again).

    obstore lists *directories* (``a`` lists ``a/…`` only), so a prefix that does not end
    with ``/`` lists its parent directory from just below the prefix, keeps the keys that
    start with it and stops at the first key past them: keys sharing a prefix are adjacent
    in any name order, the directory order of SeaweedFS too.
    """

    def __init__(self, store: Any, prefix: str, start_after: str | None) -> None:
        self._store = store
        self._prefix = prefix
        cut = prefix.rfind("/") + 1
        self._directory = prefix if prefix.endswith("/") else prefix[:cut]
        self._offset = start_after
        if self._directory != prefix:
            below = _just_below(prefix)
            self._offset = below if start_after is None else max(start_after, below)
        self._pages: Iterator[Any] | None = None
        self._done = False

    def next_page(self) -> list[Entry] | None:
        """The next page of entries (possibly empty), or ``None`` at the end.

        Raises:
            obstore's errors, for :func:`describe`; the listing can be asked again.
        """
        if self._done:
            return None
        if self._pages is None:
            directory = self._directory.rstrip("/") or None
            stream = obstore.list(self._store, directory, offset=self._offset, chunk_size=1000)
            self._pages = iter(stream)
        try:
            page = next(self._pages, None)
        except BaseException:
            self._pages = None  # start over after the last key returned
            raise
        if page is None:
            self._done = True
            return None
        out: list[Entry] = []
        for obj in page:
            path = str(obj["path"])
            if not path.startswith(self._prefix):
                if path > self._prefix:
                    self._done = True  # past every key with the prefix
                    break
                continue
            modified = obj["last_modified"]
            out.append((path, str(obj["e_tag"] or ""), int(obj["size"]), modified.timestamp()))
        if page:
            self._offset = str(page[-1]["path"])
        return out


def _just_below(key: str) -> str:
    """A string below ``key`` and above nearly every key that does not start with it: a
    listing offset that skips what lies before a prefix in its directory."""
    last = ord(key[-1]) - 1
    if 0xD800 <= last <= 0xDFFF:  # surrogates have no UTF-8: step below them
        last = 0xD7FF
    return key[:-1] + chr(last) + "\U0010ffff"
