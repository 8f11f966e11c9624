"""The store tiers and the helpers tests share to make planes on them.

Fixtures live in ``conftest.py``; what a test imports by name lives here, so that no test
imports another test module or ``conftest``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from ulid import ULID

from lakeshore.errors import LakeshoreError
from lakeshore.store import LocalStore, MemoryStore, Store, open_store
from tests.seaweed import Seaweed

TEST_BUCKET = "lakeshore-test"
# Any credentials do: the SeaweedFS gateway runs with authentication off, moto accepts all.
FAKE_CREDS = {"aws_access_key_id": "lakeshore-test", "aws_secret_access_key": "lakeshore-test"}


S3URL_ENV = "LAKESHORE_TEST_S3_URL"


def s3url() -> str | None:
    """The optional tier's store URL, if the environment names one."""
    return os.environ.get(S3URL_ENV, "").strip() or None


def seaweed_store(server: Seaweed, **options: Any) -> Store:
    """A fresh, empty S3Store on the session's SeaweedFS (unique prefix per call)."""
    from lakeshore.store.s3 import S3Store

    options.setdefault("read_timeout", 30.0)  # contended losers can wait seconds
    return S3Store(
        TEST_BUCKET, f"t/{ULID()}", endpoint_url=server.endpoint, **FAKE_CREDS, **options
    )


def make_tier_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if kind == "memory":
        return MemoryStore()
    if kind == "local":
        return LocalStore(tmp_path / "store")
    if kind == "moto":
        store: Store = request.getfixturevalue("moto_store")
        return store
    if kind == "seaweedfs-boto3":
        return seaweed_store(request.getfixturevalue("seaweed"), transport="boto3")
    # the default client: obstore for GET, PUT and LIST, or what $LAKESHORE_S3_CLIENT names
    # (the whole tier then runs on that client)
    return seaweed_store(request.getfixturevalue("seaweed"))


def s3url_for_test() -> str:
    """The optional tier's URL with a fresh prefix below its own, so tests never meet."""
    parts = urlsplit(s3url() or "")
    path = f"{parts.path.rstrip('/')}/t/{ULID()}"
    return urlunsplit(parts._replace(path=path))


def empty_prefix(url: str) -> None:
    # Best effort, with a store of its own (the test may have closed its store): the tier
    # may be a bucket someone pays for, so leave nothing behind.
    with contextlib.suppress(LakeshoreError), open_store(url) as s:
        for info in list(s.list()):
            s.delete(info.key)


ALL_TIERS = [
    "memory",
    "local",
    "moto",
    pytest.param("seaweedfs", marks=pytest.mark.seaweedfs),
    # only when the variable is set: an unset optional tier adds no skipped tests
    *([pytest.param("s3url", marks=pytest.mark.s3url)] if s3url() else []),
]
ATOMIC_TIERS = ["memory", "local", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)]
BOTO3_TIER = pytest.param("seaweedfs-boto3", marks=pytest.mark.seaweedfs)


def tier_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The body of the ``store`` fixture, for modules that add tiers (``BOTO3_TIER``)."""
    if request.param == "s3url":
        url = s3url_for_test()
        with open_store(url) as s:
            yield s
        empty_prefix(url)
        return
    s = make_tier_store(request.param, request, tmp_path)
    yield s
    s.close()


def date_clock_lease(store: Store, lease_s: float) -> float:
    """``lease_s``, or 3 s on an S3 store: its clock comes from one-second ``Date`` headers
    and sharpens in steps that a shorter lease cannot absorb (see ``run_worker``'s warning)."""
    from lakeshore.store.s3 import S3Store

    return max(lease_s, 3.0) if isinstance(store, S3Store) else lease_s


def make_plane(store: Store, **options: Any) -> Any:
    """A Dispatch on ``store`` with test-friendly timings (short backoff and lease)."""
    import lakeshore as dls

    options.setdefault("retry_backoff_s", 0.05)
    options.setdefault("lease_s", 3.0)
    return dls.Dispatch(store.url, store=store, **options)


def record_key(ops: Any, inv: str) -> str:
    """Where the record of ``inv`` lives now, for tests that read or rewrite it by hand:
    ``<id>/record`` once anything has moved the invocation (a claim, a cancel, a timeout),
    before that its ticket, which holds the record as submitted. ``ops`` is a ``QueueOps``."""
    key = ops.keys.record(inv)
    if any(info.key == key for info in ops.store.list(key)):
        return str(key)
    ticket = ops.keys.ticket_of_id(inv)
    return str(key if ticket is None else ticket)


def create_bucket(endpoint: str, timeout: float = 60.0) -> None:
    """The test bucket on the S3 server at ``endpoint``, made once the server answers."""
    import boto3
    import botocore.exceptions

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **FAKE_CREDS)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.create_bucket(Bucket=TEST_BUCKET)
            return
        except botocore.exceptions.ClientError as e:
            if e.response["Error"].get("Code") in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                return
            if time.monotonic() > deadline:
                raise
        except botocore.exceptions.BotoCoreError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.25)  # the filer behind the gateway may still be starting
