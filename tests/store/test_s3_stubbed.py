"""Error shapes no local server produces, through botocore's Stubber (boto3 itself is real):
409 ConditionalRequestConflict, the ambiguous 412 of a retried conditional PUT, 404 on
If-Match, throttling, a missing bucket, a refusal, and LocalStack's 501 on DELETE with
If-Match (then also end to end: SeaweedFS behind a proxy that answers such deletes the way
LocalStack does, with the doctor and an invocation on top)."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.response import StreamingBody
from botocore.stub import Stubber
from ulid import ULID

import lakeshore as dls
from lakeshore.doctor import diagnose
from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StoreError,
    StoreUnavailable,
)
from lakeshore.keys import QueueKeys
from lakeshore.store import CREATE, if_match
from lakeshore.store.s3 import S3Store
from tests import jobs
from tests.faultproxy import FaultProxy
from tests.seaweed import Seaweed
from tests.tiers import FAKE_CREDS, TEST_BUCKET, make_plane

BUCKET = "bkt"


def _client() -> Any:
    """A boto3 client that sends nothing by itself and retries nothing (S3Store retries)."""
    return boto3.client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
        config=Config(retries={"total_max_attempts": 1}),
    )


@pytest.fixture
def stubbed() -> Iterator[tuple[S3Store, Stubber]]:
    client = _client()
    store = S3Store(BUCKET, "pre", client=client, retries=3, backoff_base=0.001)
    with Stubber(client) as stub:
        yield store, stub
        stub.assert_no_pending_responses()


def _put_params(key: str, data: bytes, **cond: str) -> dict[str, Any]:
    return {"Bucket": BUCKET, "Key": f"pre/{key}", "Body": data, **cond}


def _error(
    stub: Stubber, op: str, code: str, status: int, params: dict[str, Any] | None = None
) -> None:
    stub.add_client_error(
        op, service_error_code=code, http_status_code=status, expected_params=params
    )


def _get_ok(stub: Stubber, key: str, data: bytes, etag: str) -> None:
    stub.add_response(
        "get_object",
        {"Body": StreamingBody(io.BytesIO(data), len(data)), "ETag": etag},
        {"Bucket": BUCKET, "Key": f"pre/{key}"},
    )


def test_sdk_retries_are_off_for_our_own_client() -> None:
    store = S3Store(BUCKET, region="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    assert store.client.meta.config.retries["total_max_attempts"] == 1
    assert store.client.meta.config.read_timeout >= 10


def test_a_client_that_retries_by_itself_is_refused() -> None:
    client = boto3.client(
        "s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )
    with pytest.raises(InvalidArgument, match="retries requests itself"):
        S3Store(BUCKET, client=client)


def test_region_and_addressing(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    creds = {"aws_access_key_id": "x", "aws_secret_access_key": "y"}
    plain = S3Store(BUCKET, **creds)
    assert plain.client.meta.region_name == "eu-west-3"
    assert plain.client.meta.config.s3["addressing_style"] == "auto"
    local = S3Store(BUCKET, endpoint_url="http://127.0.0.1:9", **creds)
    assert local.client.meta.config.s3["addressing_style"] == "path"
    virtual = S3Store(BUCKET, endpoint_url="http://127.0.0.1:9", path_style=False, **creds)
    assert virtual.client.meta.config.s3["addressing_style"] == "virtual"


def test_409_conditional_request_conflict_is_a_conflict(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    _error(
        stub,
        "put_object",
        "ConditionalRequestConflict",
        409,
        _put_params("k", b"v", IfMatch='"e1"'),
    )
    with pytest.raises(Conflict) as err:
        store.put("k", b"v", if_match('"e1"'))
    assert err.value.key == "k"


def test_412_is_a_conflict_without_read_back(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    _error(stub, "put_object", "PreconditionFailed", 412, _put_params("k", b"v", IfNoneMatch="*"))
    with pytest.raises(Conflict):
        store.put("k", b"v", CREATE)  # first attempt: nothing uncertain, no GET follows


def test_404_on_if_match_is_a_conflict(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    _error(stub, "put_object", "NoSuchKey", 404, _put_params("k", b"v", IfMatch='"e1"'))
    with pytest.raises(Conflict):
        store.put("k", b"v", if_match('"e1"'))


def test_ambiguous_412_after_a_lost_response_is_a_success(stubbed: tuple[S3Store, Stubber]) -> None:
    """The first PUT landed but its answer was lost (here: a 503 in its place); the retry
    meets its own write and gets 412. Reading back shows our bytes: the write succeeded."""
    store, stub = stubbed
    data = b'{"rev": 7, "wid": "w-123"}'
    _error(stub, "put_object", "SlowDown", 503, _put_params("rec", data, IfMatch='"e1"'))
    _error(stub, "put_object", "PreconditionFailed", 412, _put_params("rec", data, IfMatch='"e1"'))
    _get_ok(stub, "rec", data, '"e2"')
    assert store.put("rec", data, if_match('"e1"')) == '"e2"'


def test_ambiguous_412_with_someone_elses_bytes_is_a_conflict(
    stubbed: tuple[S3Store, Stubber],
) -> None:
    store, stub = stubbed
    _error(stub, "put_object", "InternalError", 500, _put_params("rec", b"mine", IfNoneMatch="*"))
    _error(
        stub, "put_object", "PreconditionFailed", 412, _put_params("rec", b"mine", IfNoneMatch="*")
    )
    _get_ok(stub, "rec", b"theirs", '"e9"')
    with pytest.raises(Conflict):
        store.put("rec", b"mine", CREATE)


def test_throttling_is_retried_then_succeeds(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    _error(stub, "get_object", "SlowDown", 503)
    _error(stub, "get_object", "InternalError", 500)
    _get_ok(stub, "k", b"v", '"e1"')
    assert store.get("k") == (b"v", '"e1"')


def test_retries_exhausted_is_store_unavailable(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    for _ in range(4):  # retries=3: four attempts in all
        _error(stub, "get_object", "SlowDown", 503)
    with pytest.raises(StoreUnavailable) as err:
        store.get("k")
    assert err.value.status == 503
    assert "safe to retry" in str(err.value)


def test_missing_bucket_is_not_a_missing_key(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    _error(stub, "get_object", "NoSuchBucket", 404)
    with pytest.raises(StoreError) as err:
        store.get("k")
    assert not isinstance(err.value, NotFound)
    assert "bucket 'bkt' does not exist" in str(err.value)


def test_access_denied(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    _error(stub, "put_object", "AccessDenied", 403)
    with pytest.raises(PermissionDenied) as err:
        store.put("k", b"v")
    assert err.value.code == "AccessDenied"


def test_delete_if_match_412_on_missing_key_is_quiet(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    _error(stub, "delete_object", "PreconditionFailed", 412)
    _error(stub, "head_object", "404", 404, {"Bucket": BUCKET, "Key": "pre/gone"})
    store.delete("gone", if_match='"e1"')  # absent either way: not an error


def test_delete_if_match_412_on_changed_key_is_a_conflict(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    _error(stub, "delete_object", "PreconditionFailed", 412)
    stub.add_response("head_object", {"ETag": '"e2"'}, {"Bucket": BUCKET, "Key": "pre/k"})
    with pytest.raises(Conflict) as err:
        store.delete("k", if_match='"e1"')
    assert 'if_match("e1")' in str(err.value)


def test_list_strips_the_prefix_and_follows_pages(stubbed: tuple[S3Store, Stubber]) -> None:
    import datetime as dt

    store, stub = stubbed
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def page(keys: list[str]) -> list[dict[str, Any]]:
        return [{"Key": f"pre/{k}", "ETag": '"e"', "Size": 1, "LastModified": when} for k in keys]

    stub.add_response(
        "list_objects_v2",
        {"Contents": page(["q/1", "q/2"]), "IsTruncated": True, "NextContinuationToken": "t1"},
        {"Bucket": BUCKET, "Prefix": "pre/q/", "StartAfter": "pre/q/0"},
    )
    stub.add_response(
        "list_objects_v2",
        {"Contents": page(["q/3"]), "IsTruncated": False},
        {"Bucket": BUCKET, "Prefix": "pre/q/", "ContinuationToken": "t1"},
    )
    infos = list(store.list("q/", start_after="q/0"))
    assert [i.key for i in infos] == ["q/1", "q/2", "q/3"]
    assert infos[0].last_modified == when.timestamp()


# -- servers without conditional deletes (LocalStack: 501 NotImplemented) ----------------------


def _delete_501(stub: Stubber, key: str, etag: str) -> None:
    _error(
        stub,
        "delete_object",
        "NotImplemented",
        501,
        {"Bucket": BUCKET, "Key": f"pre/{key}", "IfMatch": etag},
    )


def _head(stub: Stubber, key: str, etag: str | None) -> None:
    if etag is None:
        _error(stub, "head_object", "404", 404, {"Bucket": BUCKET, "Key": f"pre/{key}"})
    else:
        stub.add_response("head_object", {"ETag": etag}, {"Bucket": BUCKET, "Key": f"pre/{key}"})


def _plain_delete(stub: Stubber, key: str) -> None:
    # expected_params without IfMatch: a conditional DELETE here would fail the stub
    stub.add_response("delete_object", {}, {"Bucket": BUCKET, "Key": f"pre/{key}"})


def test_delete_if_match_501_falls_back_to_head_then_delete(
    stubbed: tuple[S3Store, Stubber], caplog: pytest.LogCaptureFixture
) -> None:
    store, stub = stubbed
    assert store.conditional_delete == "server"
    _delete_501(stub, "k", '"e1"')
    _head(stub, "k", '"e1"')
    _plain_delete(stub, "k")
    with caplog.at_level("WARNING", logger="lakeshore.store"):
        store.delete("k", if_match='"e1"')
    assert store.conditional_delete == "emulated"
    warnings = [r for r in caplog.records if r.name == "lakeshore.store"]
    assert len(warnings) == 1 and "not atomic" in warnings[0].getMessage()


def test_delete_fallback_costs_one_501_per_store_and_warns_once(
    stubbed: tuple[S3Store, Stubber], caplog: pytest.LogCaptureFixture
) -> None:
    store, stub = stubbed
    _delete_501(stub, "a", '"e1"')
    _head(stub, "a", '"e1"')
    _plain_delete(stub, "a")
    # From now on: HEAD, then a plain DELETE, with no conditional DELETE in between.
    _head(stub, "b", '"e2"')
    _plain_delete(stub, "b")
    _head(stub, "c", '"e3"')
    _plain_delete(stub, "c")
    with caplog.at_level("WARNING", logger="lakeshore.store"):
        store.delete("a", if_match='"e1"')
        store.delete("b", if_match='"e2"')
        store.delete("c", if_match="e3")  # an unquoted etag names the same version
    assert len([r for r in caplog.records if r.name == "lakeshore.store"]) == 1


def test_delete_fallback_raises_conflict_on_another_etag(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    _delete_501(stub, "k", '"e1"')
    _head(stub, "k", '"e2"')  # and no DELETE may follow: the stub would refuse it
    with pytest.raises(Conflict) as err:
        store.delete("k", if_match='"e1"')
    assert err.value.key == "k" and 'if_match("e1")' in str(err.value)
    _head(stub, "k", '"e2"')
    with pytest.raises(Conflict):
        store.delete("k", if_match='"e1"')  # also once emulating


def test_delete_fallback_on_a_missing_key_is_quiet(stubbed: tuple[S3Store, Stubber]) -> None:
    store, stub = stubbed
    _delete_501(stub, "gone", '"e1"')
    _head(stub, "gone", None)  # absent: what a real conditional delete also accepts
    store.delete("gone", if_match='"e1"')
    assert store.conditional_delete == "emulated"


def test_delete_fallback_is_learnt_per_store_instance(stubbed: tuple[S3Store, Stubber]) -> None:
    """No process-wide state: another store (maybe another endpoint) finds out for itself."""
    store, stub = stubbed
    other = S3Store(BUCKET, "pre", client=store.client, retries=0)
    for s in (store, other):
        _delete_501(stub, "k", '"e1"')
        _head(stub, "k", '"e1"')
        _plain_delete(stub, "k")
        s.delete("k", if_match='"e1"')
    assert store.conditional_delete == other.conditional_delete == "emulated"


def test_other_store_errors_on_conditional_delete_still_raise(
    stubbed: tuple[S3Store, Stubber],
) -> None:
    store, stub = stubbed
    _error(stub, "delete_object", "AccessDenied", 403)
    with pytest.raises(PermissionDenied):
        store.delete("k", if_match='"e1"')
    assert store.conditional_delete == "server"


# LocalStack's answer, as recorded against its S3 provider (localstack/localstack#13894).
_NOT_IMPLEMENTED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NotImplemented</Code>'
    b"<Message>A header you provided implies functionality that is not implemented</Message>"
    b"<Header>If-Match</Header></Error>"
)


class _NoConditionalDelete(FaultProxy):
    """SeaweedFS behind a proxy that answers DELETE with If-Match the way LocalStack does."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.refused = 0
        self._count = threading.Lock()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        if h.command == "DELETE" and h.headers.get("If-Match"):
            with self._count:
                self.refused += 1
            return self._reply(h, 501, _NOT_IMPLEMENTED)
        return super()._handle(h)


@pytest.mark.seaweedfs
def test_a_server_without_conditional_deletes_end_to_end(
    seaweed: Seaweed, report: list[str]
) -> None:
    with _NoConditionalDelete(seaweed.endpoint) as proxy:
        prefix = f"t/{ULID()}"
        with S3Store(TEST_BUCKET, prefix, endpoint_url=proxy.endpoint, **FAKE_CREDS) as store:
            r = diagnose(store, threads=2, rounds=1)  # the races are not the point here
        names = [c.name for c in r.checks]
        assert names.index("conditional delete") == names.index("delete-if-match") + 1
        finding = r.checks[names.index("conditional delete")]
        assert not finding.ok and not finding.required and "not atomic" in finding.detail
        assert finding.line().lstrip().startswith("warn")
        assert r.checks[names.index("delete-if-match")].ok  # the emulation keeps the contract
        assert r.safe, r.render()  # conditional PUTs are atomic here: still SAFE
        assert proxy.refused == 1  # one 501, then HEAD + DELETE for every later probe

        # The queue keeps working; its conditional deletes (the finished invocation's admission
        # slot) go through the emulation of a fresh store, which finds out on its own.
        with S3Store(TEST_BUCKET, prefix, endpoint_url=proxy.endpoint, **FAKE_CREDS) as store:
            q = make_plane(store)
            q.configure("default", max_depth=4)
            inv = q.udf(jobs.add_one).submit(41)
            assert dls.run_worker(q, once=True) == 1
            assert q.result(inv, timeout=30) == 42
            assert store.conditional_delete == "emulated"
            assert list(store.list(QueueKeys(q.ns, "default").tickets_prefix)) == []
        assert proxy.refused == 2
    report.append("S3 without conditional deletes (501, as LocalStack): emulated; doctor SAFE")


class _Response:
    def __init__(self, server_time: float) -> None:
        from email.utils import formatdate

        self.headers = {"Date": formatdate(server_time, usegmt=True)}


def test_the_clock_holds_still_when_its_sharpest_sample_ages_out_and_follows_a_real_step() -> None:
    ticks = [100.0]
    store = S3Store(BUCKET, "pre", client=_client(), ticks=lambda: ticks[0])
    server = 1_800_000_000.0  # the server's time at tick 100

    def respond(late: float = 0.0) -> None:  # a response whose Date was truncated by `late`
        store._sample_clock(http_response=_Response(server + ticks[0] - 100.0 - late))

    respond()  # sent just as the server's second began: the sharpest sample
    seen = [store.now()]
    while ticks[0] < 115.0:  # later Dates lose most of a second each; the first ages out
        ticks[0] += 0.25
        respond(late=0.9)
        seen.append(store.now())
    assert seen == sorted(seen)  # it never ran backwards
    assert seen[-1] == pytest.approx(server + 15.0 - 0.9, abs=0.3)  # and caught up
    while ticks[0] < 130.0:  # the server's clock steps back 5 s: followed
        ticks[0] += 0.25
        respond(late=5.9)
    assert store.now() == pytest.approx(server + 30.0 - 5.9, abs=0.3)
