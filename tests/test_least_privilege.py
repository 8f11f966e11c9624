"""The IAM policies in docs/iam/, enforced by moto: a producer can submit and read results
but cannot claim or delete; a worker runs jobs; a janitor collects but never writes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.gc import collect
from tests import jobs
from tests.conftest import make_plane

DOCS = Path(__file__).resolve().parent.parent / "docs" / "iam"
BUCKET, PREFIX, NS = "lakeshore-iam", "team", "default"


def policy(name: str) -> str:
    text = (DOCS / f"{name}.json").read_text()
    return text.replace("BUCKET", BUCKET).replace("PREFIX", PREFIX).replace("NAMESPACE", NS)


@pytest.fixture
def principals(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """S3 stores for a producer, a worker and a janitor, each with its documented policy."""
    from moto import mock_aws, settings
    from moto.core.authorization import ActionAuthenticatorMixin

    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "admin")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "admin")
    import boto3

    from lakeshore.store.s3 import S3Store

    # the admin's setup calls run unauthenticated; every later request is checked
    # (what moto's set_initial_no_auth_action_count decorator does, for a fixture)
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 1 + 3 * 3)
    monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        iam = boto3.client("iam", region_name="us-east-1")
        stores = {}
        for name in ("producer", "worker", "janitor"):
            iam.create_user(UserName=name)
            iam.put_user_policy(UserName=name, PolicyName=name, PolicyDocument=policy(name))
            key = iam.create_access_key(UserName=name)["AccessKey"]
            stores[name] = S3Store(
                BUCKET,
                PREFIX,
                region="us-east-1",
                aws_access_key_id=key["AccessKeyId"],
                aws_secret_access_key=key["SecretAccessKey"],
            )
        yield stores


def test_each_role_can_do_its_job_and_nothing_else(principals: dict[str, Any]) -> None:
    producer = make_plane(principals["producer"])
    worker = make_plane(principals["worker"])
    janitor = make_plane(principals["janitor"])
    f = producer.udf(jobs.add_one)
    inv = f.submit(41)
    keyed = f.submit(1, _key="nightly")
    assert f.submit(1, _key="nightly") == keyed

    # the producer cannot claim: listing the ready hints is out of its reach
    with pytest.raises(dls.PermissionDenied):
        producer.ops("default").claim("producer-pretending", producer.store.now())
    # ... nor delete anything
    with pytest.raises(dls.PermissionDenied):
        producer.store.delete(producer.ops("default").keys.record(inv))

    worker.udf(jobs.add_one)
    assert dls.run_worker(worker, max_jobs=2, idle_exit=0.5, isolation="thread") == 2
    assert producer.result(inv, timeout=30) == 42  # results readable by the producer
    assert producer.status(keyed) == "succeeded"

    # the janitor removes what expired, and cannot write anything
    rep = collect(janitor.ops("default"), janitor.settings, 0.0, janitor.store.now() + 1)
    assert sorted(rep.expired) == sorted([inv, keyed])
    with pytest.raises(dls.NotFound):
        producer.get(inv)
    with pytest.raises(dls.PermissionDenied):
        janitor.store.put(janitor.ops("default").keys.record(inv), b"x")


def test_policies_are_valid_json_with_placeholders() -> None:
    for name in ("producer", "worker", "janitor"):
        doc = json.loads((DOCS / f"{name}.json").read_text())
        assert doc["Version"] == "2012-10-17" and doc["Statement"]
        assert "BUCKET" in json.dumps(doc)
