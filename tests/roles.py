"""The roles of docs/iam/ as principals on one moto bucket, each S3 store behind its role's
policy as the simulator (tests/iam_sim.py) evaluates it; ``admin`` is the bucket owner."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from tests import iam_sim
from tests.tiers import make_plane

BUCKET, PREFIX, NS = "lakeshore-iam", "team", "default"
BASE = f"{PREFIX}/lakeshore/{NS}/"


def policy(role: str) -> dict[str, Any]:
    return iam_sim.load(role, BUCKET, PREFIX, NS)


@dataclasses.dataclass
class Principal:
    role: str
    store: Any
    enforcer: iam_sim.Enforcer

    def plane(self) -> Any:
        return make_plane(self.store)


@contextlib.contextmanager
def principals_on_moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Principal]]:
    """An S3 store per role on one moto bucket, each behind its role's policy (simulated),
    plus ``admin`` with no policy (the bucket owner, for setting scenes up)."""
    from moto import mock_aws

    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    import boto3

    from lakeshore.store.s3 import S3Store
    from tests.moto_keys import close_buffers_when_unreferenced

    close_buffers_when_unreferenced(monkeypatch)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        out = {}
        for role in (*iam_sim.ROLES, "admin"):
            store = S3Store(BUCKET, PREFIX, region="us-east-1")
            every = {"Version": "2012-10-17", "Statement": []}  # admin: recorded, not checked
            pol = policy(role) if role != "admin" else every
            enforcer = iam_sim.Enforcer(pol)
            if role != "admin":
                enforcer.attach(store.client)
            out[role] = Principal(role, store, enforcer)
        yield out
