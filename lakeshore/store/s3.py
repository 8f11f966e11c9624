"""``S3Store``: the store contract on an S3 bucket (or any server with real conditional writes).

The only module of lakeshore that imports boto3 (and the only importer of
:mod:`lakeshore.store.s3_obstore`); nothing above it sees an S3 answer or a botocore error.
GET, PUT and LIST go through obstore by default, DELETE, HEAD and the clock through boto3
(obstore has no conditional DELETE and shows no ``Date``); boto3 carries everything where
obstore could not act exactly as boto3 would.

Both clients run with their own retries off: a retried conditional PUT whose first try landed
would come back 412. This module retries, and settles such an ambiguous 412 by reading the
object back (our exact bytes: our write). One translation table (:data:`_BY_CODE`,
:data:`_BY_STATUS`) turns every answer into the lakeshore error tree. The store clock comes
from ``Date`` headers against the monotonic clock, so neither a step of the local clock nor a
minority of wrong headers moves it. A server without conditional deletes gets them emulated
(a HEAD, then a DELETE), which is not atomic. Details: docs/store-contract.md#s3store.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import logging
import math
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import boto3
import botocore.exceptions as bex
import botocore.session
from botocore.config import Config
from botocore.configprovider import ConfiguredEndpointProvider

from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    LakeshoreError,
    NotFound,
    PermissionDenied,
    StoreError,
    StoreUnavailable,
)
from lakeshore.store.base import (
    OVERWRITE,
    ObjectInfo,
    PutMode,
    Store,
    check_data,
    check_key,
    check_prefix,
    conflict,
    not_found,
    too_large,
)

__all__ = ["CLIENTS", "CLIENT_ENV", "S3Store"]

CLIENTS = ("auto", "boto3", "obstore")
CLIENT_ENV = "LAKESHORE_S3_CLIENT"  # the client when neither URL nor code names one

T = TypeVar("T")
log = logging.getLogger("lakeshore.store")

# The translation table: S3 error code first, HTTP status as the fallback (HEAD responses
# carry no body, so no code). Causes: what the caller can do about it.
_BY_CODE: dict[str, str] = {
    "NoSuchKey": "not_found",
    "PreconditionFailed": "conflict",
    "ConditionalRequestConflict": "conflict",
    "NoSuchBucket": "no_bucket",
    "AccessDenied": "denied",
    "InvalidAccessKeyId": "denied",
    "SignatureDoesNotMatch": "denied",
    "ExpiredToken": "denied",
    "SlowDown": "transient",
    "InternalError": "transient",
    "ServiceUnavailable": "transient",
    "RequestTimeout": "transient",
    "OperationAborted": "transient",
    "NotImplemented": "unsupported",
    # the request went to another region than the bucket's (boto3 follows these itself on
    # AWS endpoints; obstore does not)
    "PermanentRedirect": "wrong_region",
    "AuthorizationHeaderMalformed": "wrong_region",
}
_BY_STATUS: dict[int, str] = {
    404: "not_found",
    412: "conflict",
    409: "conflict",
    403: "denied",
    401: "denied",
    500: "transient",
    502: "transient",
    503: "transient",
    504: "transient",
    501: "unsupported",
    301: "wrong_region",
}
_TRANSIENT_IO = (bex.ConnectionError, bex.HTTPClientError, bex.IncompleteReadError)
_CLOCK_SAMPLES = 64
_CLOCK_WINDOW_S = 10.0  # samples older than this no longer count (the newest always does)
# Honest samples differ by Date's truncation (up to a second) plus the difference of two
# responses' latencies: a sample further than this above the median of the recent ones is a
# wrong Date (a node whose clock is ahead), not a sharper one, and is left out.
_AGREE_S = 1.5
# With obstore only boto3's requests (deletes, clock probes) carry a Date the store can see: a
# clock probe refreshes the samples when the newest is older than this, and samples count for
# longer, so the maximum still spans several one-second truncations.
_PROBE_EVERY_S = 30.0
_OBSTORE_CLOCK_WINDOW_S = 90.0
# When the sample that made the estimate sharpest ages out, the estimate drops by up to a
# second (Date's truncation) plus a response's latency: now() holds still through a drop
# this small rather than run backwards (a retry written "due now" would look not due yet).
# A larger drop is the server's own clock stepping back, and is followed.
_HOLD_BACK_S = 1.5
_CA_BUNDLE_MAX = 16 * 1024 * 1024  # a PEM bundle; certifi's is about 300 kB


def _classify(e: BaseException) -> tuple[str, int | None, str]:
    """Return ``(cause, http_status, code)`` for an exception of either client."""
    if isinstance(e, bex.ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        cause = _BY_CODE.get(code) or _BY_STATUS.get(status or 0, "other")
        return cause, status, code
    if isinstance(e, _TRANSIENT_IO):
        return "transient", None, type(e).__name__
    obs = sys.modules.get("lakeshore.store.s3_obstore")  # loaded only when a store uses it
    if obs is not None and isinstance(e, obs.ERRORS):
        status, code, io_failed = obs.describe(e)
        if io_failed:
            return "transient", None, code
        if status is None and code not in _BY_CODE:
            return "config", None, code  # no answer quoted: credentials, endpoint, …
        return _BY_CODE.get(code) or _BY_STATUS.get(status or 0, "other"), status, code
    return "config", None, type(e).__name__


class S3Store(Store):
    """A store under ``s3://bucket/prefix``.

    Args:
        bucket: the bucket; it must exist (``lakeshore doctor`` says so if not).
        prefix: every key lives under this prefix; ``""`` for the bucket root.
        endpoint_url: an S3-compatible server; default from ``AWS_ENDPOINT_URL(_S3)`` or AWS.
        region: default from ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else ``us-east-1``.
        aws_access_key_id: credentials; default: boto3's usual chain (environment, config
            files, instance roles).
        aws_secret_access_key: the secret that goes with ``aws_access_key_id``.
        aws_session_token: a session token for temporary credentials.
        profile: a named profile of the AWS config files.
        path_style: ``True`` path-style, ``False`` virtual-hosted addressing; default: path
            style when an endpoint URL is set (local and self-hosted servers rarely serve
            virtual-host names), else boto3's automatic choice.
        max_pool_connections: HTTP connections kept open; size it to the threads that share
            the store (default 64).
        connect_timeout: seconds to wait for a connection.
        read_timeout: seconds to wait for a response; keep it long (>= 10 s), because a
            server may hold a contended conditional write for seconds.
        retries: attempts after the first for transient failures.
        backoff_base: seconds of the first pause between retries; it doubles after each.
        backoff_cap: longest pause between retries, in seconds (each pause is also
            jittered by a random factor between 0.5 and 1.5).
        local_clock: this machine's wall clock, used only when the server sends no ``Date``
            (in-process fakes); tests inject skew and steps. Leases never use it.
        ticks: the clock that measures time between responses; never stepped
            (``time.monotonic``).
        client: a ready boto3 S3 client (tests with ``botocore.stub.Stubber``); overrides the
            connection arguments above. It must be built with
            ``Config(retries={"total_max_attempts": 1})``: SDK retries of conditional writes
            would turn some successful writes into conflicts.
        transport: which client sends GET, PUT and LIST: ``"auto"`` (obstore whenever it
            can act as boto3 would, else boto3; see :attr:`transport_reason`), ``"boto3"``
            or ``"obstore"`` (forced). DELETE, HEAD and the clock always go through boto3.
            Default: ``$LAKESHORE_S3_CLIENT``, else ``"auto"``.

    Raises:
        InvalidArgument: the bucket name or prefix is malformed, ``client`` retries, the
            transport is unknown, or obstore is forced but not installed.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        profile: str | None = None,
        path_style: bool | None = None,
        max_pool_connections: int = 64,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        retries: int = 6,
        backoff_base: float = 0.05,
        backoff_cap: float = 2.0,
        client: Any = None,
        transport: str | None = None,
        local_clock: Callable[[], float] = time.time,
        ticks: Callable[[], float] = time.monotonic,
    ) -> None:
        if not bucket or "/" in bucket:
            raise InvalidArgument(
                "S3Store", f"bad bucket name {bucket!r}", "pass the bucket alone, e.g. 'my-bucket'"
            )
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix, "S3Store prefix")
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.url = f"s3://{bucket}/{prefix}".rstrip("/")
        self.retries = retries
        self._local_clock = local_clock  # the wall clock: only for servers without Date
        self._ticks = ticks
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        # (ticks when sampled, server time - ticks): the newest samples, oldest first
        self._offsets: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=_CLOCK_SAMPLES
        )
        self._no_date = False
        self._probe = self.prefix  # where the clock's first LIST goes (see probe_within)
        self._rng = random.Random()
        self._rng_lock = threading.Lock()
        self._files_options: dict[str, Any] = {}
        # Learnt from the server, per instance: another endpoint behind another store may differ.
        self._emulated_delete = False
        self._emulated_lock = threading.Lock()
        named, self._transport_reason = _choose_transport(transport, client)
        self._auto = named == "auto"
        self._clock_window = _CLOCK_WINDOW_S
        self._now_lock = threading.Lock()
        self._last_now = -math.inf  # the last now() returned (see _HOLD_BACK_S)
        self._probe_lock = threading.Lock()
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._make_client: Callable[[], Any] | None = None
        self._obstore: Any = None
        self._obstore_errors: tuple[type[Exception], ...] = ()
        self._obstore_region = ""
        self._leave_lock = threading.Lock()
        self._errors: tuple[type[Exception], ...] = (bex.ClientError, bex.BotoCoreError)
        if client is not None:
            if client.meta.config.retries.get("total_max_attempts") != 1:
                raise InvalidArgument(
                    "S3Store",
                    "the given boto3 client retries requests itself",
                    'build it with Config(retries={"total_max_attempts": 1}); S3Store retries',
                )
            self._adopt(client)
            return
        core = botocore.session.get_session()  # kept: it answers what boto3 will use
        session = boto3.session.Session(
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            profile_name=profile,
            region_name=region,
            botocore_session=core,
        )
        # resolved once and handed to both clients, so they cannot go to different servers
        endpoint = endpoint_url or _configured_endpoint(core)
        if path_style is None and endpoint:
            path_style = True
        region_name = region or _region_from_env() or session.region_name or "us-east-1"

        def make_boto3() -> Any:
            addressing = {None: "auto", True: "path", False: "virtual"}[path_style]
            config = Config(
                retries={"total_max_attempts": 1},  # retries are ours: see the module docstring
                max_pool_connections=max_pool_connections,
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                s3={"addressing_style": addressing},
                # CRC checksums only where S3 requires them (botocore's default before 1.36):
                # records are small and checked by their codec, spilled values by sha256, and
                # several S3-compatible servers reject the newer default's headers
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            )
            return session.client(
                "s3", endpoint_url=endpoint, region_name=region_name, config=config
            )

        credentials: dict[str, str] = {}
        for name, option, value in (
            ("key", "access_key_id", aws_access_key_id),
            ("secret", "secret_access_key", aws_secret_access_key),
            ("token", "token", aws_session_token),
            ("profile", "", profile),
        ):
            if value:
                self._files_options[name] = value
                if option:
                    credentials[option] = value
        if named == "auto":
            why_not = _why_not_obstore(core, session, credentials, endpoint)
            if why_not is not None:
                self._transport_reason = why_not
                log.info("S3Store %s: boto3 carries every request: %s", self.url, why_not)
                named = "boto3"
        if named == "boto3":
            self._adopt(make_boto3())
            return
        from lakeshore.store import s3_obstore  # InvalidArgument with the install hint

        # boto3 serves what obstore cannot (conditional DELETE, the Date clock); it is made
        # on first use
        self._make_client = make_boto3
        self._clock_window = _OBSTORE_CLOCK_WINDOW_S
        self._obstore_region = region_name
        self._obstore = s3_obstore.ObstoreTransport(
            bucket,
            endpoint_url=endpoint,
            region=region_name,
            # no endpoint means AWS itself, where DNS-safe buckets are addressed by virtual
            # host (what boto3's "auto" picks too)
            virtual_hosted=(not path_style)
            if path_style is not None
            else (None if endpoint else "." not in bucket),
            credentials=credentials,
            session=session,
            root_certificate=_read_ca_bundle(core),
            max_pool_connections=max_pool_connections,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        self._obstore_errors = s3_obstore.ERRORS
        self._errors = (*self._errors, *s3_obstore.ERRORS)

    def _adopt(self, client: Any) -> None:
        client.meta.events.register("after-call.s3", self._sample_clock)
        self._client = client

    @property
    def client(self) -> Any:
        """The boto3 client; with obstore made on first use, for DELETE, HEAD and the clock."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    assert self._make_client is not None
                    self._adopt(self._make_client())
        return self._client

    @property
    def transport(self) -> str:
        """Which client sends GET, PUT and LIST now: ``"obstore"`` or ``"boto3"``."""
        return "boto3" if self._data_path() is None else "obstore"

    @property
    def transport_reason(self) -> str:
        """Why :attr:`transport` is what it is, for the doctor and logs."""
        if self._obstore is not None and self._data_path() is None:
            return "moto's mock_aws is active, and it intercepts botocore only"
        return self._transport_reason

    @property
    def client_info(self) -> str:
        """Which client sends which requests and why, for ``lakeshore doctor``."""
        if self.transport == "boto3":
            return f"boto3 {boto3.__version__} for every request: {self.transport_reason}"
        from lakeshore.store import s3_obstore

        return (
            f"obstore {s3_obstore.version()} for GET, PUT and LIST; boto3 "
            f"{boto3.__version__} for DELETE, HEAD and the clock's Date ({self.transport_reason})"
        )

    def _data_path(self) -> Any:
        """The obstore transport if it sends this request, else ``None`` (boto3 does)."""
        obs = self._obstore
        if obs is not None and self._auto and _botocore_mocked():
            return None
        return obs

    def _left_obstore(self, e: Exception) -> bool:
        """After an obstore request failed with ``e``: whether the store has now left obstore
        for good, so that the request goes again through boto3. In "auto" only, when the
        bucket answered from another region: boto3 follows S3's redirects, obstore cannot."""
        if not self._auto or _classify(e)[0] != "wrong_region":
            return False
        with self._leave_lock:
            if self._obstore is None:
                return True  # another thread left already
            self._obstore = None
            self._clock_window = _CLOCK_WINDOW_S
            self._transport_reason = (
                f"the bucket answered from another region than {self._obstore_region!r}, and "
                "boto3 follows S3's redirects"
            )
        log.warning(
            "S3Store %s: boto3 carries every request from now on: %s; pass the bucket's "
            "region (region=, ?region= or $AWS_REGION) to use the faster obstore client",
            self.url,
            self._transport_reason,
        )
        return True

    def location(self) -> tuple[str, dict[str, Any]] | None:
        # s3fs reaches the bucket the way our client does: same endpoint, region, addressing
        # and (when they were given explicitly) credentials; otherwise the same AWS chain.
        meta = self.client.meta
        addressing = (getattr(meta.config, "s3", None) or {}).get("addressing_style", "auto")
        options: dict[str, Any] = {
            "client_kwargs": {"endpoint_url": meta.endpoint_url, "region_name": meta.region_name},
            "config_kwargs": {"s3": {"addressing_style": addressing}},
        }
        return self.url, options | self._files_options

    # -- plumbing --------------------------------------------------------------------------

    def _k(self, key: str) -> str:
        return self.prefix + key

    def _sample_clock(self, http_response: Any = None, **_: Any) -> None:
        headers = getattr(http_response, "headers", None) or {}
        # Real responses carry a case-insensitive mapping; in-process servers a plain dict.
        date = next((v for k, v in headers.items() if k.lower() == "date"), None)
        if not date:
            return
        try:
            server = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            return
        # Date has one-second resolution and is truncated, so each sample underestimates the
        # offset by up to a second; the largest recent sample that agrees with the others
        # converges on the truth (see _agreed_offset).
        # Measured against the monotonic clock, not the wall clock: a step of this machine's
        # wall clock must not move the store's clock.
        ticks = self._ticks()
        self._offsets.append((ticks, server - ticks))

    def _backoff_s(self, attempt: int) -> float:
        with self._rng_lock:
            jitter = self._rng.random()
        return float(min(self.backoff_cap, self.backoff_base * 2**attempt) * (0.5 + jitter))

    def _sleep_backoff(self, attempt: int) -> None:
        time.sleep(self._backoff_s(attempt))

    def _error(self, op: str, key: str, e: Exception) -> LakeshoreError:
        cause, status, code = _classify(e)
        where = f"{op} {self.url}/{key}" if key else f"{op} {self.url}"
        if cause == "not_found" and key:
            return not_found(key, self.url, op)
        if cause == "conflict":
            err = conflict(op, key, "the request's condition", self.url)
            err.details.update(status=status, code=code)
            return err
        if cause in ("no_bucket", "not_found"):
            return StoreError(
                where,
                f"bucket {self.bucket!r} does not exist",
                "create it (aws s3 mb) or fix the URL",
                status=status,
                code=code,
            )
        if cause == "denied":
            return PermissionDenied(
                where,
                f"the server refused the request ({code or status})",
                "check the credentials and the bucket policy for this prefix",
                status=status,
                code=code,
            )
        if cause == "wrong_region":
            return StoreError(
                where,
                f"the server says the request went to the wrong region ({code or status})",
                "pass the bucket's region: region=, ?region= in the URL, or $AWS_REGION",
                status=status,
                code=code,
            )
        if cause == "unsupported":
            return StoreError(
                where,
                f"the server does not implement this request ({code or status})",
                "lakeshore needs conditional writes: run `lakeshore doctor` on this URL",
                status=status,
                code=code,
            )
        if cause == "transient":
            return StoreUnavailable(
                where,
                f"still failing after {self.retries + 1} attempts ({code or status})",
                "check the endpoint and network; the operation is safe to retry",
                status=status,
                code=code,
            )
        if cause == "config":
            return StoreError(
                where, f"{code}: {e}", "check the S3 URL, endpoint and credentials", code=code
            )
        return StoreError(
            where, f"unexpected answer {code or status}: {e}", "see the server logs", status=status
        )

    def _retrying(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """Run an idempotent request, retrying transient failures with jittered backoff."""
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except self._errors as e:
                if _classify(e)[0] != "transient" or attempt == self.retries:
                    raise self._error(op, key, e) from e
            self._sleep_backoff(attempt)
        raise AssertionError("unreachable")

    # -- the contract ----------------------------------------------------------------------

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        check_key(key, "get")

        def fetch() -> tuple[bytes, str]:
            obs = self._data_path()
            if obs is not None:
                try:
                    got = obs.get(self._k(key))
                except self._obstore_errors as e:
                    if not self._left_obstore(e):
                        raise
                else:
                    if max_bytes is not None and got.size > max_bytes:
                        raise too_large(key, self.url, got.size, max_bytes)  # body left unread
                    return got.read(), got.etag
            resp = self.client.get_object(Bucket=self.bucket, Key=self._k(key))
            size = resp.get("ContentLength")
            if max_bytes is not None and isinstance(size, int) and size > max_bytes:
                resp["Body"].close()  # the length is known before the body is read
                raise too_large(key, self.url, size, max_bytes)
            return resp["Body"].read(), resp["ETag"]  # read inside: a cut stream is retried

        return self._retrying("get", key, fetch)

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        check_key(key, "put")
        data = check_data(data, f"put {key}")
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._k(key), "Body": data}
        if mode.name == "create":
            kwargs["IfNoneMatch"] = "*"
        elif mode.name == "if_match":
            kwargs["IfMatch"] = mode.etag
        uncertain = False  # did an earlier attempt possibly reach the server and land?
        for attempt in range(self.retries + 1):
            try:
                obs = self._data_path()
                if obs is not None:
                    try:
                        return str(obs.put(kwargs["Key"], data, mode.name, mode.etag))
                    except self._obstore_errors as e:
                        if not self._left_obstore(e):  # else: a definite no, sent again
                            raise
                return str(self.client.put_object(**kwargs)["ETag"])
            except self._errors as e:
                cause = _classify(e)[0]
                lost = cause == "conflict" or (cause == "not_found" and mode.name == "if_match")
                if lost:
                    if uncertain:
                        mine = self._landed(key, data)
                        if mine is not None:
                            return mine
                    raise conflict("put", key, mode, self.url) from e
                if cause != "transient" or attempt == self.retries:
                    raise self._error("put", key, e) from e
                uncertain = True
            self._sleep_backoff(attempt)
        raise AssertionError("unreachable")

    # -- the async verbs: obstore's async client while obstore sends GET and PUT -----------

    @property
    def native_async(self) -> bool:
        return self._data_path() is not None

    async def aget(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        """:meth:`get` on obstore's async client: the same retries and errors, no thread;
        through boto3 (a thread) when obstore does not send this store's GETs.

        Raises:
            as :meth:`get`.
        """
        check_key(key, "get")
        for attempt in range(self.retries + 1):
            obs = self._data_path()
            if obs is None:
                break
            try:
                got = await obs.aget(self._k(key))
                if max_bytes is not None and got.size > max_bytes:
                    raise too_large(key, self.url, got.size, max_bytes)  # body left unread
                return await got.read(), got.etag
            except self._obstore_errors as e:
                if self._left_obstore(e):
                    break  # sent again through boto3, even after the last attempt
                if _classify(e)[0] != "transient" or attempt == self.retries:
                    raise self._error("get", key, e) from e
            await asyncio.sleep(self._backoff_s(attempt))
        else:
            raise AssertionError("unreachable")
        return await asyncio.to_thread(self.get, key, max_bytes)

    async def aput(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        """:meth:`put` on obstore's async client: the same retries, the same read-back of an
        ambiguous conditional write, no thread; through boto3 (a thread) when obstore does
        not send this store's PUTs.

        Raises:
            as :meth:`put`.
        """
        check_key(key, "put")
        data = check_data(data, f"put {key}")
        uncertain = False  # did an earlier attempt possibly reach the server and land?
        for attempt in range(self.retries + 1):
            obs = self._data_path()
            if obs is None:
                break
            try:
                return str(await obs.aput(self._k(key), data, mode.name, mode.etag))
            except self._obstore_errors as e:
                if self._left_obstore(e):
                    break  # a definite no: sent again through boto3
                cause = _classify(e)[0]
                lost = cause == "conflict" or (cause == "not_found" and mode.name == "if_match")
                if lost:
                    mine = await self._alanded(key, data) if uncertain else None
                    if mine is not None:
                        return mine
                    raise conflict("put", key, mode, self.url) from e
                if cause != "transient" or attempt == self.retries:
                    raise self._error("put", key, e) from e
                uncertain = True
            await asyncio.sleep(self._backoff_s(attempt))
        else:
            raise AssertionError("unreachable")
        try:
            return await asyncio.to_thread(self.put, key, data, mode)
        except Conflict:
            mine = await self._alanded(key, data) if uncertain else None
            if mine is None:
                raise
            return mine

    async def _alanded(self, key: str, data: bytes) -> str | None:
        """:meth:`_landed`, awaited."""
        try:
            current, etag = await self.aget(key)
        except (NotFound, PermissionDenied):
            return None
        return etag if current == data else None

    async def anow(self) -> float:
        """:meth:`now`, without a thread while the clock's samples are fresh: a thread only
        when a clock probe is due (the first call, then every ``_PROBE_EVERY_S``)."""
        samples = self._offsets
        fresh = self._no_date or (
            bool(samples)
            and (self._data_path() is None or self._ticks() - samples[-1][0] <= _PROBE_EVERY_S)
        )
        return self.now() if fresh else await asyncio.to_thread(self.now)

    def _landed(self, key: str, data: bytes) -> str | None:
        """After an ambiguous conditional write: the etag if the object holds our bytes."""
        try:
            current, etag = self.get(key)
        except NotFound:
            return None
        except PermissionDenied:
            # a key this role may create but not read (a producer's admission slot): it
            # cannot tell, so the write counts as lost; one that did land is a leak, freed
            # like any other
            return None
        return etag if current == data else None

    def delete(self, key: str, if_match: str | None = None) -> None:
        """Delete ``key``; with ``if_match``, only while its etag is that one.

        Some S3-compatible servers (LocalStack) answer a ``DELETE`` with ``If-Match`` with 501
        NotImplemented. The first such answer is remembered on this instance (one 501 round
        trip per store, a warning logged once); from then on a conditional delete is emulated:
        a ``HEAD`` compares the etag (``Conflict`` if it differs, nothing to do if the object
        is gone), then a plain ``DELETE`` follows.

        The emulation is **not atomic**: a write that lands in the narrow window between the
        ``HEAD`` and the ``DELETE`` is deleted with the object. lakeshore deletes
        conditionally only admission slots and rate tokens, a tombstone it takes back, and
        what ``lakeshore gc`` expires, so it takes another writer rewriting that very key
        within those milliseconds; rare, but a server that checks ``If-Match`` itself is safer.
        ``lakeshore doctor`` reports which of the two a store does.
        """
        check_key(key, "delete")
        kwargs = self._loc(key)
        if if_match is None:
            self._retrying("delete", key, lambda: self.client.delete_object(**kwargs))
            return
        if self._emulated_delete:
            self._delete_after_head(key, if_match)
            return
        kwargs["IfMatch"] = if_match
        try:
            self._retrying("delete", key, lambda: self.client.delete_object(**kwargs))
        except NotFound:
            return
        except Conflict as e:
            # Servers answer 412 for a missing key as well as for a changed one; only the
            # latter is a conflict: the contract says an absent key is not an error. A role
            # that may not read the key (a producer's admission slot) cannot tell them apart:
            # either way nothing was deleted, which a conflict says.
            try:
                changed = self._exists(key)
            except PermissionDenied:
                changed = True
            if changed:
                raise conflict("delete", key, PutMode("if_match", if_match), self.url) from e
        except StoreError as e:
            cause = e.__cause__
            if not isinstance(cause, bex.ClientError) or _classify(cause)[0] != "unsupported":
                raise
            self._learn_no_conditional_delete(cause)
            self._delete_after_head(key, if_match)

    def delete_many(self, keys: Sequence[str]) -> None:
        """One ``DeleteObjects`` request per 1000 keys (unconditional, quiet mode).

        Raises:
            InvalidArgument: a key is malformed (nothing is deleted).
            PermissionDenied: the server refused a key. StoreError: it failed another key.
        """
        for key in keys:
            check_key(key, "delete")
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            batch = {"Objects": [{"Key": self._k(k)} for k in chunk], "Quiet": True}

            def send(batch: dict[str, Any] = batch) -> Any:
                return self.client.delete_objects(Bucket=self.bucket, Delete=batch)

            answer = self._retrying("delete", chunk[0], send)
            failed = [e for e in answer.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if failed:
                code, key = str(failed[0].get("Code", "")), str(failed[0].get("Key", ""))
                error = PermissionDenied if code == "AccessDenied" else StoreError
                raise error(
                    f"delete {key}",
                    f"the server refused {len(failed)} of {len(chunk)} keys of a batch delete "
                    f"({code}: {failed[0].get('Message', '')})",
                    "check the credentials and the bucket policy for this prefix",
                    key=key,
                )

    @property
    def conditional_delete(self) -> str:
        """How ``delete(key, if_match=…)`` works on this server, as far as this instance
        has seen: ``"server"`` (the server checks ``If-Match``; also before the first
        conditional delete) or ``"emulated"`` (``HEAD`` then ``DELETE``; not atomic)."""
        return "emulated" if self._emulated_delete else "server"

    def _learn_no_conditional_delete(self, cause: bex.ClientError) -> None:
        with self._emulated_lock:
            if self._emulated_delete:
                return  # another thread met the 501 at the same time and warned already
            self._emulated_delete = True
        _, status, code = _classify(cause)
        log.warning(
            "delete %s: the server does not implement DELETE with If-Match (%s), so this "
            "store now emulates conditional deletes with HEAD then DELETE, which is not "
            "atomic — prefer a server that implements them (AWS S3, SeaweedFS); "
            "`lakeshore doctor` reports it",
            self.url,
            code or status,
        )

    def _delete_after_head(self, key: str, if_match: str) -> None:
        """The conditional delete for servers without one: compare, then delete."""
        current = self._etag(key)
        if current is None:
            return  # gone already: what the server's conditional delete would also accept
        if _bare_etag(current) != _bare_etag(if_match):
            raise conflict("delete", key, PutMode("if_match", if_match), self.url)
        self._retrying("delete", key, lambda: self.client.delete_object(**self._loc(key)))

    def _loc(self, key: str) -> dict[str, Any]:
        return {"Bucket": self.bucket, "Key": self._k(key)}

    def _etag(self, key: str) -> str | None:
        try:
            head = self._retrying("head", key, lambda: self.client.head_object(**self._loc(key)))
        except NotFound:
            return None
        return str(head["ETag"])

    def _exists(self, key: str) -> bool:
        return self._etag(key) is not None

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        obs = self._data_path()
        if obs is not None:
            try:
                for info in self._list_obstore(obs, prefix, start_after):
                    yield info
                    start_after = info.key
                return
            except _LeftObstore:
                pass  # boto3 goes on after the last key listed
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._k(prefix)}
        if start_after is not None:
            kwargs["StartAfter"] = self._k(start_after)
        strip = len(self.prefix)
        while True:
            page = self._retrying("list", prefix, lambda: self.client.list_objects_v2(**kwargs))
            for obj in page.get("Contents", ()):
                yield ObjectInfo(
                    obj["Key"][strip:],
                    obj["ETag"],
                    int(obj["Size"]),
                    obj["LastModified"].timestamp(),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token
            kwargs.pop("StartAfter", None)

    def _list_obstore(self, obs: Any, prefix: str, start_after: str | None) -> Iterator[ObjectInfo]:
        after = self._k(start_after) if start_after is not None else None
        pages = obs.lister(self._k(prefix), after)
        strip = len(self.prefix)

        def next_page() -> Any:
            try:
                return pages.next_page()
            except self._obstore_errors as e:
                if self._left_obstore(e):
                    raise _LeftObstore from e
                raise

        while True:
            page = self._retrying("list", prefix, next_page)
            if page is None:
                return
            for path, etag, size, modified in page:
                yield ObjectInfo(path[strip:], etag, size, modified)

    def probe_within(self, prefix: str) -> None:
        check_prefix(prefix, "probe_within")
        self._probe = self._k(prefix)

    def now(self) -> float:
        if not self._offsets and not self._no_date:
            # No response seen yet: one cheap request gives the server's Date.
            self._probe_clock()
            self._no_date = not self._offsets
        elif self._data_path() is not None and not self._no_date:
            self._refresh_clock()
        samples = list(self._offsets)  # a snapshot: response hooks append concurrently
        if not samples:
            # Only in-process fakes omit Date (moto's HEAD); they share this machine's clock.
            return self._local_clock()
        ticks = self._ticks()
        recent = [off for at, off in samples if ticks - at <= self._clock_window]
        estimate = ticks + _agreed_offset(recent or [samples[-1][1]])
        with self._now_lock:
            if self._last_now - _HOLD_BACK_S < estimate < self._last_now:
                estimate = self._last_now
            self._last_now = estimate
        return estimate

    def _probe_clock(self) -> None:
        # A one-key LIST through boto3 (obstore shows no headers), where the client is
        # granted listing (probe_within): a role confined to one namespace may not list the
        # store's whole prefix.
        probe = self._probe
        self._retrying(
            "clock",
            "",
            lambda: self.client.list_objects_v2(Bucket=self.bucket, Prefix=probe, MaxKeys=1),
        )

    def _refresh_clock(self) -> None:
        """With obstore, few responses reach the Date hook: probe again when the newest
        sample is old, so a step of the server's clock is followed. One thread probes; the
        others go on with the samples there are, and so does everyone if the probe fails
        (the newest sample still counts: the store is down, not its clock)."""
        samples = self._offsets
        if samples and self._ticks() - samples[-1][0] <= _PROBE_EVERY_S:
            return
        if not self._probe_lock.acquire(blocking=False):
            return
        try:
            self._probe_clock()
        except LakeshoreError as e:
            log.info("store clock %s: refresh failed, using older samples (%s)", self.url, e)
        finally:
            self._probe_lock.release()

    @property
    def clock_source(self) -> str:
        """Where ``now()`` comes from: the server's Date headers, or the local clock."""
        if self._offsets:
            return "server Date headers"
        return "local clock (server sends no Date)" if self._no_date else "not read yet"

    def close(self) -> None:
        if self._client is not None:  # with obstore, boto3 may never have been needed
            self._client.close()


def _why_not_obstore(
    core: Any, session: Any, credentials: dict[str, str], endpoint: str | None
) -> str | None:
    """Why obstore cannot send a store's GET, PUT and LIST as its boto3 client would (to the
    same server, as the same identity, trusting the same certificates), or ``None``."""
    try:
        from lakeshore.store import s3_obstore
    except InvalidArgument as e:
        return f"obstore is not installed ({e.what})"
    differs = s3_obstore.settings_only_obstore_reads(endpoint_given=endpoint is not None)
    if differs:
        names = ", ".join(f"${name}" for name in differs)
        return f"{names} set, which obstore would follow and boto3 ignores"
    if not credentials and session.get_credentials() is None:
        # boto3 fails such requests itself (NoCredentialsError), while obstore's own chain
        # could sign as another identity than boto3's deletes
        return "boto3's credential chain found no credentials to hand over to obstore"
    bundle = _ca_bundle(core)
    if bundle is not None and _read_ca_bundle(core) is None:
        return f"the CA bundle {bundle!r} cannot be read"
    return None


class _LeftObstore(Exception):
    """A listing's page met the redirect that made the store leave obstore (never raised
    out of the store)."""


def _botocore_mocked() -> bool:
    """Whether moto's ``mock_aws`` is active in this process: it answers botocore's requests
    (its ``botocore_stubber``, enabled while a mock is on) and nobody else's, so obstore
    would bypass it. moto is looked up, never imported."""
    models = sys.modules.get("moto.core.models")
    stubber = getattr(models, "botocore_stubber", None)
    return bool(getattr(stubber, "enabled", False))


def _agreed_offset(offsets: list[float]) -> float:
    """The clock offset the recent samples support: the largest one at most ``_AGREE_S``
    above their (lower) median.

    Every honest sample underestimates (``Date`` is truncated, responses take time), so the
    largest honest one is the sharpest; the median keeps a wrong one from being taken for
    it. While fewer than half of the samples are wrong, by any amount in either direction,
    the median lies among the honest ones: the sharpest honest sample is kept, and a wrong
    one lifts the estimate at most ``_AGREE_S`` above that median. Taking the lower of two
    middle samples also ignores a wrong half that is ahead, the direction that would expire
    leases early. A step of the server's own clock moves the median once most samples show
    it (a step back once half do)."""
    ordered = sorted(offsets)
    median = ordered[(len(ordered) - 1) // 2]
    return ordered[bisect.bisect_right(ordered, median + _AGREE_S) - 1]


def _bare_etag(etag: str) -> str:
    # Servers quote etags ("…") and may mark them weak (W/"…"); If-Match compares the value.
    return etag.removeprefix("W/").strip('"')


def _region_from_env() -> str | None:
    # botocore reads AWS_DEFAULT_REGION only; AWS_REGION is what the AWS docs and Lambda use.
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def _configured_endpoint(core: Any) -> str | None:
    """The endpoint boto3 takes when none is passed: ``$AWS_ENDPOINT_URL_S3``,
    ``$AWS_ENDPOINT_URL`` or the config file's (its ``services`` section or the profile),
    unless ``$AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` says to ignore them."""
    if core.get_config_variable("ignore_configured_endpoint_urls"):
        return None
    found = ConfiguredEndpointProvider(
        full_config=core.full_config, scoped_config=core.get_scoped_config(), client_name="s3"
    ).provide()
    return str(found) if found else None


def _ca_bundle(core: Any) -> str | None:
    """The CA bundle boto3 verifies TLS with instead of its own, if one is configured:
    ``$AWS_CA_BUNDLE`` or the profile's ``ca_bundle``, else ``$REQUESTS_CA_BUNDLE``."""
    found = core.get_config_variable("ca_bundle") or os.environ.get("REQUESTS_CA_BUNDLE")
    return str(found) if found else None


def _read_ca_bundle(core: Any) -> bytes | None:
    """The PEM certificates of the configured CA bundle, for obstore (which adds them to
    the roots it trusts); ``None`` if there is none or it cannot be read."""
    path = _ca_bundle(core)
    if path is None:
        return None
    try:
        with open(os.path.expanduser(path), "rb") as f:
            return f.read(_CA_BUNDLE_MAX) or None
    except OSError:
        return None


def _choose_transport(transport: str | None, client: Any) -> tuple[str, str]:
    """The client named in code (or the URL), else in ``$LAKESHORE_S3_CLIENT``, else
    ``"auto"``; with the reason the store reports."""
    from_env = os.environ.get(CLIENT_ENV, "").strip().lower()
    named = transport or from_env or "auto"
    source = f"client={named}" if transport else f"${CLIENT_ENV}={named}"
    if named not in CLIENTS:
        raise InvalidArgument(
            "S3Store", f"unknown S3 client {named!r} ({source})", f"use one of {list(CLIENTS)}"
        )
    if client is not None:
        if named == "obstore" and transport:
            raise InvalidArgument(
                "S3Store",
                f"a boto3 client was passed together with transport={named!r}",
                "pass one or the other",
            )
        # a boto3 client handed over in code wins over the environment
        return "boto3", "a boto3 client was handed over in code"
    if named == "auto":
        return "auto", "the default"
    return named, f"{source} asks for it"
