"""The obstore client of ``S3Store``: how it is chosen, and the answers no local server
gives (409, the ambiguous 412, 403, 501, 503 forever, a huge object, a listing cut between
pages, the clock's refresh), from a scripted HTTP server on 127.0.0.1. The store contract
and the races run through obstore in test_store_contract.py and test_store_races.py."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from botocore.config import Config

from lakeshore.doctor import diagnose
from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    PermissionDenied,
    StoreError,
    StoreUnavailable,
    TooLarge,
)
from lakeshore.store import CREATE, if_match, open_store
from lakeshore.store.s3 import S3Store
from tests.conftest import FAKE_CREDS, TEST_BUCKET
from tests.seaweed import Seaweed

BUCKET = "bkt"
CUT = "cut"  # an answer that closes the connection without a response


def _error(status: int, code: str) -> tuple[int, dict[str, str], bytes]:
    body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>m</Message></Error>"
    return status, {"Content-Type": "application/xml"}, body.encode()


class Scripted:
    """An S3 endpoint that answers each request with what ``answer`` returns, and keeps
    every request it saw as ``(method, path, query, headers)``."""

    def __init__(self, answer: Callable[[str, str, dict[str, str], dict[str, str]], Any]):
        self.seen: list[tuple[str, str, dict[str, str], dict[str, str]]] = []
        self.release = threading.Event()  # ends answers that hold their connection open
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query, True).items()}
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                scripted.seen.append((self.command, parts.path, query, headers))
                out = answer(self.command, parts.path, query, headers)
                if out == CUT:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                status, hdrs, body = out
                self.send_response(status)  # adds Date, which the clock reads
                for k, v in hdrs.items():
                    self.send_header(k, v)
                if "Content-Length" not in hdrs:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                if hdrs.get("X-Hold"):
                    scripted.release.wait(30)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def count(self, method: str) -> int:
        return sum(1 for m, *_ in self.seen if m == method)


@pytest.fixture
def scripted() -> Iterator[Callable[..., tuple[Scripted, S3Store]]]:
    made: list[Scripted] = []

    def make(answer: Any, **options: Any) -> tuple[Scripted, S3Store]:
        server = Scripted(answer)
        made.append(server)
        options.setdefault("retries", 2)
        options.setdefault("backoff_base", 0.001)
        store = S3Store(
            BUCKET,
            "pre",
            endpoint_url=server.endpoint,
            transport="obstore",
            **FAKE_CREDS,
            **options,
        )
        return server, store

    yield make
    for server in made:
        server.close()


_OK_PUT = (200, {"ETag": '"e1"'}, b"")


# -- choosing the client ---------------------------------------------------------------------


def test_mock_aws_users_get_boto3_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    monkeypatch.delenv("LAKESHORE_S3_CLIENT", raising=False)
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1", **FAKE_CREDS).create_bucket(Bucket=BUCKET)
        store = open_store(f"s3://{BUCKET}/pre", region="us-east-1", **FAKE_CREDS)
        assert isinstance(store, S3Store) and store.transport == "boto3"
        etag = store.put("k", b"v", CREATE)  # intercepted by mock_aws: boto3 it is
        assert store.get("k") == (b"v", etag)
        assert "boto3" in store.client_info


def test_the_client_is_chosen_by_url_setting_or_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKESHORE_S3_CLIENT", raising=False)
    opts = {"endpoint_url": "http://127.0.0.1:9", **FAKE_CREDS}
    assert open_store(f"s3://{BUCKET}/p", **opts).transport == "boto3"  # type: ignore[attr-defined]
    url = f"s3://{BUCKET}/p?client=obstore"
    assert open_store(url, **opts).transport == "obstore"  # type: ignore[attr-defined]
    monkeypatch.setenv("LAKESHORE_S3_CLIENT", "obstore")
    store = S3Store(BUCKET, "p", **opts)  # type: ignore[arg-type]
    assert store.transport == "obstore" and "obstore" in store.client_info
    url = f"s3://{BUCKET}/p?client=boto3"  # the URL wins over the setting
    assert open_store(url, **opts).transport == "boto3"  # type: ignore[attr-defined]
    # a boto3 client handed over in code wins over the setting too
    given = boto3.client(
        "s3",
        region_name="us-east-1",
        config=Config(retries={"total_max_attempts": 1}),
        **FAKE_CREDS,
    )
    assert S3Store(BUCKET, "p", client=given).transport == "boto3"
    with pytest.raises(InvalidArgument, match="one or the other"):
        S3Store(BUCKET, "p", client=given, transport="obstore")
    with pytest.raises(InvalidArgument, match="unknown S3 client 'botox'"):
        open_store(f"s3://{BUCKET}/p?client=botox", **opts)
    monkeypatch.setenv("LAKESHORE_S3_CLIENT", "nope")
    with pytest.raises(InvalidArgument, match="LAKESHORE_S3_CLIENT"):
        S3Store(BUCKET, "p", **opts)  # type: ignore[arg-type]


def test_missing_obstore_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import lakeshore.store

    # as in a fresh process without the extra
    monkeypatch.delitem(sys.modules, "lakeshore.store.s3_obstore", raising=False)
    monkeypatch.delattr(lakeshore.store, "s3_obstore", raising=False)
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore -> ImportError
    with pytest.raises(InvalidArgument) as err:
        S3Store(BUCKET, "p", endpoint_url="http://127.0.0.1:9", transport="obstore")
    assert "pip install 'lakeshore-queue[obstore]'" in str(err.value)


# -- answers ---------------------------------------------------------------------------------


def test_no_retries_of_its_own_and_503_ends_unavailable(scripted: Any) -> None:
    server, store = scripted(lambda *a: _error(503, "SlowDown"), retries=2)
    with pytest.raises(StoreUnavailable, match="3 attempts"):
        store.put("k", b"v", CREATE)
    assert server.count("PUT") == 3  # ours only: obstore sent each attempt once
    with pytest.raises(StoreUnavailable):
        store.get("k")
    assert server.count("GET") == 3


def test_transient_then_success(scripted: Any) -> None:
    answers = iter([_error(500, "InternalError"), CUT, _OK_PUT])
    server, store = scripted(lambda *a: next(answers))
    assert store.put("k", b"v") == '"e1"'
    assert server.count("PUT") == 3


@pytest.mark.parametrize(
    "answer, error",
    [
        (_error(409, "ConditionalRequestConflict"), Conflict),
        (_error(412, "PreconditionFailed"), Conflict),
        (_error(404, "NoSuchKey"), Conflict),  # If-Match on a missing key
        (_error(403, "AccessDenied"), PermissionDenied),
        (_error(501, "NotImplemented"), StoreError),
    ],
)
def test_answers_become_the_same_errors_as_with_boto3(
    scripted: Any, answer: Any, error: type[Exception]
) -> None:
    server, store = scripted(lambda *a: answer)
    with pytest.raises(error) as err:
        store.put("k", b"v", if_match('"e0"'))
    assert server.seen[0][3]["if-match"] == '"e0"'
    assert server.count("PUT") == 1  # none of these is retried
    if answer[0] == 501:
        assert "lakeshore doctor" in str(err.value)


def test_create_sends_if_none_match(scripted: Any) -> None:
    server, store = scripted(lambda *a: _OK_PUT)
    store.put("k", b"v", CREATE)
    assert server.seen[0][3]["if-none-match"] == "*"
    assert server.seen[0][1] == f"/{BUCKET}/pre/k"


def test_ambiguous_412_is_settled_by_reading_back(scripted: Any) -> None:
    # the first PUT lands but its answer is lost; the retry meets our own write
    answers = iter([CUT, _error(412, "PreconditionFailed")])

    def answer(method: str, *_: Any) -> Any:
        if method == "GET":
            return 200, {"ETag": '"mine"'}, b"ours"
        return next(answers)

    server, store = scripted(answer)
    assert store.put("k", b"ours", CREATE) == '"mine"'
    assert server.count("PUT") == 2 and server.count("GET") == 1  # read back once
    with pytest.raises(Conflict):  # someone else's bytes: a real conflict
        answers = iter([CUT, _error(412, "PreconditionFailed")])
        store.put("k", b"theirs", CREATE)


def test_a_huge_object_is_refused_before_its_body_is_read(scripted: Any) -> None:
    # 10 MB announced, 10 bytes sent, the connection held open: reading would hang
    hold = {"ETag": '"big"', "Content-Length": str(10_000_000), "X-Hold": "1"}
    server, store = scripted(lambda *a: (200, hold, b"0123456789"), read_timeout=20.0)
    with pytest.raises(TooLarge) as err:
        store.get("big", max_bytes=1024)
    assert err.value.size == 10_000_000
    assert server.count("GET") == 1


def _page(keys: list[str], token: str | None) -> tuple[int, dict[str, str], bytes]:
    items = "".join(
        f"<Contents><Key>{k}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>"
        f'<ETag>"{k}"</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>'
        for k in keys
    )
    more = f"<NextContinuationToken>{token}</NextContinuationToken>" if token else ""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bkt</Name>'
        f"<Prefix>pre/q/</Prefix><KeyCount>{len(keys)}</KeyCount><MaxKeys>1000</MaxKeys>"
        f"<IsTruncated>{'true' if token else 'false'}</IsTruncated>{more}{items}"
        "</ListBucketResult>"
    )
    return 200, {"Content-Type": "application/xml"}, body.encode()


def test_a_listing_cut_between_pages_goes_on_after_the_last_key(scripted: Any) -> None:
    first = [f"pre/q/{i:04d}" for i in range(1000)]  # one full page, handed out before the cut
    failures = iter([_error(500, "InternalError")])

    def answer(method: str, path: str, query: dict[str, str], _: Any) -> Any:
        if "continuation-token" in query:
            return next(failures, None) or _page(["pre/q/late"], None)
        if query.get("start-after") == "pre/q/0999":  # asked again after the last key
            return _page(["pre/q/1000", "pre/q/1001"], None)
        return _page(first, "t2")

    server, store = scripted(answer)
    keys = [o.key for o in store.list("q/")]
    assert keys == [k.removeprefix("pre/") for k in first] + ["q/1000", "q/1001"]
    assert [q.get("start-after") for _, _, q, _ in server.seen] == [None, None, "pre/q/0999"]
    assert server.seen[0][2]["prefix"] == "pre/q/"


def test_a_prefix_that_is_not_a_directory(scripted: Any) -> None:
    # obstore lists directories: "q/a" must list "q/" from just below "q/a" and keep only
    # keys starting with it, stopping at the first key past them
    def answer(method: str, path: str, query: dict[str, str], _: Any) -> Any:
        return _page(["pre/q/a", "pre/q/a-c", "pre/q/a/b", "pre/q/ab", "pre/q/b", "pre/q/c"], None)

    server, store = scripted(answer)
    assert [o.key for o in store.list("q/a")] == ["q/a", "q/a-c", "q/a/b", "q/ab"]
    query = server.seen[0][2]
    assert query["prefix"] == "pre/q/"
    assert "pre/q/" < query["start-after"] < "pre/q/a"


def test_the_clock_is_probed_again_when_its_sample_is_old(scripted: Any) -> None:
    ticks = [1000.0]
    server, store = scripted(lambda *a: _page([], None), ticks=lambda: ticks[0])
    probes = lambda: sum(1 for m, _, q, _h in server.seen if q.get("max-keys") == "1")  # noqa: E731
    first = store.now()
    assert probes() == 1
    ticks[0] += 20.0
    assert store.now() == pytest.approx(first + 20.0, abs=1.0)
    assert probes() == 1  # a 20 s old sample is still fresh
    ticks[0] += 15.0
    store.now()
    assert probes() == 2
    assert store.clock_source == "server Date headers"


@pytest.mark.seaweedfs
def test_doctor_says_which_client(seaweed: Seaweed) -> None:
    store = S3Store(
        TEST_BUCKET,
        "t/doctor-obstore",
        endpoint_url=seaweed.endpoint,
        transport="obstore",
        **FAKE_CREDS,
    )
    report = diagnose(store, threads=2, rounds=2)
    assert report.safe, report.render()
    (line,) = [c for c in report.checks if c.name == "S3 client"]
    assert line.detail.startswith("obstore ") and "boto3" in line.detail
    assert "S3 client" in report.render()
