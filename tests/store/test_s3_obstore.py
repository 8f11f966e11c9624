"""The obstore client of ``S3Store``: how it is chosen (the default whenever it can act as
boto3 would; boto3 for everything under moto's ``mock_aws``, without credentials to hand
over, with settings only obstore reads, or once the bucket answers from another region),
and the answers no local server gives (409, the ambiguous 412, 403, 501, 503 forever, a huge
object, a listing cut between pages, the clock's refresh), from a scripted HTTP server on
127.0.0.1. The store contract and the races run on both clients in test_store_contract.py
and test_store_races.py."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from botocore.config import Config
from ulid import ULID

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
from tests.seaweed import Seaweed
from tests.tiers import FAKE_CREDS, TEST_BUCKET

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
        options.setdefault("transport", "obstore")
        options = {**FAKE_CREDS, **options}
        store = S3Store(BUCKET, "pre", endpoint_url=server.endpoint, **options)
        return server, store

    yield make
    for server in made:
        server.close()


_OK_PUT = (200, {"ETag": '"e1"'}, b"")


# -- choosing the client ---------------------------------------------------------------------


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No AWS setting of this machine reaches the test: no variables, no config files, no
    instance metadata; the test writes what it needs (config files go in the returned
    folder)."""
    import os

    for name in list(os.environ):
        if name.startswith("AWS_") or name in ("LAKESHORE_S3_CLIENT", "REQUESTS_CA_BUNDLE"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return tmp_path


def _fake_s3(method: str, path: str, query: dict[str, str], _: Any) -> Any:
    """Plausible answers for boto3 and obstore alike: any object holds b"v"."""
    if method == "PUT":
        return _OK_PUT
    if method == "GET" and "list-type" in query:
        return _page(["pre/k"], None)
    if method == "GET":
        return 200, {"ETag": '"e1"', "Content-Type": "application/octet-stream"}, b"v"
    return 204, {}, b""


def _client_of(headers: dict[str, str]) -> str:
    return "obstore" if "object_store" in headers.get("user-agent", "") else "boto3"


def test_the_default_is_obstore_and_boto3_or_obstore_can_be_forced(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = {"endpoint_url": "http://127.0.0.1:9", **FAKE_CREDS}
    default = open_store(f"s3://{BUCKET}/p", **opts)
    assert isinstance(default, S3Store) and default.transport == "obstore"
    assert default.transport_reason == "the default" and "obstore" in default.client_info
    assert open_store(f"s3://{BUCKET}/p?client=auto", **opts).transport == "obstore"  # type: ignore[attr-defined]
    url = f"s3://{BUCKET}/p?client=boto3"
    forced = open_store(url, **opts)
    assert forced.transport == "boto3"  # type: ignore[attr-defined]
    assert forced.client_info.endswith("client=boto3 asks for it")  # type: ignore[attr-defined]
    monkeypatch.setenv("LAKESHORE_S3_CLIENT", "boto3")
    assert S3Store(BUCKET, "p", **opts).transport == "boto3"  # type: ignore[arg-type]
    url = f"s3://{BUCKET}/p?client=obstore"  # the URL wins over the setting
    assert open_store(url, **opts).transport == "obstore"  # type: ignore[attr-defined]
    assert open_store(f"s3://{BUCKET}/p?client=auto", **opts).transport == "obstore"  # type: ignore[attr-defined]
    monkeypatch.setenv("LAKESHORE_S3_CLIENT", "obstore")
    store = S3Store(BUCKET, "p", **opts)  # type: ignore[arg-type]
    assert store.transport == "obstore" and "LAKESHORE_S3_CLIENT=obstore" in store.client_info
    url = f"s3://{BUCKET}/p?client=boto3"
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


def test_mock_aws_users_get_boto3_by_default(aws_env: Path) -> None:
    from moto import mock_aws

    with mock_aws():
        boto3.client("s3", region_name="us-east-1", **FAKE_CREDS).create_bucket(Bucket=BUCKET)
        store = open_store(f"s3://{BUCKET}/pre", region="us-east-1", **FAKE_CREDS)
        assert isinstance(store, S3Store) and store.transport == "boto3"
        etag = store.put("k", b"v", CREATE)  # intercepted by mock_aws: boto3 it is
        assert store.get("k") == (b"v", etag)
        assert [o.key for o in store.list()] == ["k"]
        assert "boto3" in store.client_info and "mock_aws" in store.transport_reason


def test_a_store_opened_before_mock_aws_gives_every_request_to_boto3_inside_it(
    aws_env: Path,
) -> None:
    """A plane made at import time, a test wrapped in mock_aws afterwards: the client is
    chosen at each request, not once."""
    from moto import mock_aws

    store = open_store(f"s3://{BUCKET}/pre", region="us-east-1", **FAKE_CREDS)
    assert isinstance(store, S3Store) and store.transport == "obstore"
    with mock_aws():
        boto3.client("s3", region_name="us-east-1", **FAKE_CREDS).create_bucket(Bucket=BUCKET)
        assert store.transport == "boto3"
        etag = store.put("k", b"v", CREATE)
        assert store.get("k") == (b"v", etag)
        assert [o.key for o in store.list()] == ["k"]
        store.delete("k", if_match=etag)
        assert list(store.list()) == []
    assert store.transport == "obstore"  # the mock is over


def test_obstore_missing_the_default_falls_back_and_forcing_it_says_how_to_install(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lakeshore.store

    # as in a fresh process where obstore cannot be imported
    monkeypatch.delitem(sys.modules, "lakeshore.store.s3_obstore", raising=False)
    monkeypatch.delattr(lakeshore.store, "s3_obstore", raising=False)
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore -> ImportError
    opts = {"endpoint_url": "http://127.0.0.1:9", **FAKE_CREDS}
    store = S3Store(BUCKET, "p", **opts)  # type: ignore[arg-type]
    assert store.transport == "boto3"
    assert store.transport_reason.startswith("obstore is not installed")
    with pytest.raises(InvalidArgument) as err:
        S3Store(BUCKET, "p", transport="obstore", **opts)  # type: ignore[arg-type]
    assert "pip install 'obstore" in str(err.value)


def test_a_profile_alone_signs_both_clients_as_one_identity_at_one_endpoint(
    aws_env: Path, scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user with only AWS_PROFILE: its keys, region and endpoint come from the config
    files, and obstore gets all three, as boto3 does."""
    server, _ = scripted(_fake_s3)
    (aws_env / "config").write_text(
        f"[profile team]\nregion = eu-west-3\nendpoint_url = {server.endpoint}\n"
    )
    (aws_env / "credentials").write_text(
        "[team]\naws_access_key_id = TEAMKEY\naws_secret_access_key = team-secret\n"
    )
    monkeypatch.setenv("AWS_PROFILE", "team")
    store = open_store(f"s3://{BUCKET}/pre")
    assert isinstance(store, S3Store) and store.transport == "obstore"
    etag = store.put("k", b"v", CREATE)
    assert store.get("k") == (b"v", etag)
    store.delete("k")  # boto3's request
    seen = [(m, _client_of(h), h.get("authorization", "")) for m, _, _, h in server.seen]
    assert [(m, c) for m, c, _ in seen] == [
        ("PUT", "obstore"),
        ("GET", "obstore"),
        ("DELETE", "boto3"),
    ]
    for _m, _c, auth in seen:
        assert "Credential=TEAMKEY/" in auth and "/eu-west-3/s3/" in auth


def test_without_credentials_to_hand_over_boto3_carries_everything(aws_env: Path) -> None:
    store = S3Store(BUCKET, "p", endpoint_url="http://127.0.0.1:9")
    assert store.transport == "boto3"
    assert "no credentials" in store.transport_reason


def test_settings_only_obstore_reads_keep_boto3(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # boto3 ignores AWS_ENDPOINT: obstore alone would send its requests there
    monkeypatch.setenv("AWS_ENDPOINT", "http://127.0.0.1:9")
    store = S3Store(BUCKET, "p", **FAKE_CREDS)  # type: ignore[arg-type]
    assert store.transport == "boto3" and "$AWS_ENDPOINT" in store.transport_reason
    # an endpoint of the store's own overrides it for both clients
    assert (
        S3Store(BUCKET, "p", endpoint_url="http://127.0.0.1:9", **FAKE_CREDS).transport == "obstore"
    )  # type: ignore[arg-type]
    monkeypatch.setenv("AWS_SKIP_SIGNATURE", "true")  # obstore would not sign
    store = S3Store(BUCKET, "p", endpoint_url="http://127.0.0.1:9", **FAKE_CREDS)  # type: ignore[arg-type]
    assert store.transport == "boto3" and "$AWS_SKIP_SIGNATURE" in store.transport_reason


def _redirect_obstore(method: str, path: str, query: dict[str, str], headers: Any) -> Any:
    """A bucket in another region than the store's: S3 answers 301 without a Location, which
    boto3 follows on AWS (here: boto3 is simply answered) and obstore cannot."""
    if _client_of(headers) == "obstore":
        return _error(301, "PermanentRedirect")
    return _fake_s3(method, path, query, headers)


@pytest.mark.parametrize("first", ["get", "put", "list"])
def test_a_bucket_in_another_region_moves_the_default_store_to_boto3(
    aws_env: Path, scripted: Any, first: str
) -> None:
    server, store = scripted(_redirect_obstore, transport=None)
    assert store.transport == "obstore"
    if first == "get":
        assert store.get("k") == (b"v", '"e1"')
    elif first == "put":
        assert store.put("k", b"v") == '"e1"'
    else:
        assert [o.key for o in store.list()] == ["k"]
    assert store.transport == "boto3" and "another region" in store.transport_reason
    assert store.put("k2", b"v") == '"e1"'
    assert [_client_of(h) for *_, h in server.seen] == ["obstore", "boto3", "boto3"]
    # forced, obstore stays, and the error says what to do
    _, forced = scripted(_redirect_obstore)
    with pytest.raises(StoreError, match="wrong region") as err:
        forced.get("k")
    assert "region" in err.value.todo
    assert forced.transport == "obstore"


@pytest.mark.parametrize("verb", ["aget", "aput"])
@pytest.mark.parametrize("retries", [0, 2])
def test_the_async_verbs_move_to_boto3_as_the_blocking_ones(
    aws_env: Path, scripted: Any, verb: str, retries: int
) -> None:
    """A redirect on the last attempt left to the async verbs still goes through boto3."""
    import asyncio

    server, store = scripted(_redirect_obstore, transport=None, retries=retries)
    if verb == "aget":
        assert asyncio.run(store.aget("k")) == (b"v", '"e1"')
    else:
        assert asyncio.run(store.aput("k", b"v")) == '"e1"'
    assert store.transport == "boto3" and not store.native_async
    assert [_client_of(h) for *_, h in server.seen] == ["obstore", "boto3"]


def _tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate it signed for 127.0.0.1: (CA bundle, certificate, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> x509.Certificate:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            ip = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
            b = b.add_extension(x509.SubjectAlternativeName([ip]), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    pem = serialization.Encoding.PEM
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(cert("test CA", ca_key, "test CA", ca_key, True).public_bytes(pem))
    paths[1].write_bytes(cert("127.0.0.1", key, "test CA", ca_key, False).public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def test_a_ca_bundle_boto3_trusts_is_trusted_by_obstore_too(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ssl

    bundle, certificate, key = _tls_files(aws_env)
    server = Scripted(_fake_s3)
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certificate, key)
        server.server.socket = context.wrap_socket(server.server.socket, server_side=True)
        endpoint = server.endpoint.replace("http://", "https://")
        monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
        store = S3Store(BUCKET, "pre", endpoint_url=endpoint, retries=0, **FAKE_CREDS)  # type: ignore[arg-type]
        assert store.transport == "obstore"
        assert store.put("k", b"v") == '"e1"'
        store.delete("k")  # boto3, trusting the same bundle
        assert [(m, _client_of(h)) for m, _, _, h in server.seen] == [
            ("PUT", "obstore"),
            ("DELETE", "boto3"),
        ]
        monkeypatch.setenv("AWS_CA_BUNDLE", str(aws_env / "missing.pem"))
        store = S3Store(BUCKET, "pre", endpoint_url=endpoint, **FAKE_CREDS)  # type: ignore[arg-type]
        assert store.transport == "boto3" and "missing.pem" in store.transport_reason
    finally:
        server.close()


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
def test_the_default_client_on_seaweedfs_is_obstore(
    seaweed: Seaweed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's URL with no client: obstore sends GET, PUT and LIST, boto3 is made only for
    what obstore cannot send (deletes, the clock), and the doctor says so."""
    monkeypatch.delenv("LAKESHORE_S3_CLIENT", raising=False)
    url = f"s3://{TEST_BUCKET}/t/default-client-{ULID()}?endpoint_url={seaweed.endpoint}"
    with open_store(url, **FAKE_CREDS) as store:
        assert isinstance(store, S3Store) and store.transport == "obstore"
        etag = store.put("k", b"v", CREATE)
        assert store.get("k") == (b"v", etag)
        assert [o.key for o in store.list()] == ["k"]
        assert store._client is None  # no boto3 client was needed so far
        store.delete("k", if_match=etag)
        assert list(store.list()) == []
        report = diagnose(store, threads=2, rounds=2)
    assert report.safe, report.render()
    (line,) = [c for c in report.checks if c.name == "S3 client"]
    assert line.detail.startswith("obstore ") and "boto3" in line.detail
    assert "(the default)" in line.detail and "S3 client" in report.render()
