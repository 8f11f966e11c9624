"""The dashboard's server over HTTP, without a browser: the token, the Host check, CSRF on
actions, what the responses carry (never credentials), and `lakeshore ui` itself."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.store import MemoryStore, Store
from lakeshore.ui import Board, UiServer
from lakeshore.ui.server import public_url
from tests import jobs
from tests.tiers import FAKE_CREDS, make_plane
from tests.waiting import poll

ROOT = Path(__file__).resolve().parents[2]


class Client:
    """One HTTP connection to the server, with the headers a test chooses."""

    def __init__(self, server: UiServer) -> None:
        self.port = server.port

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = json.dumps(body).encode() if body is not None else None
            sent = {"Content-Type": "application/json", "X-Lakeshore-UI": "1", **(headers or {})}
            conn.request(method, path, body=data, headers=sent)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def json(self, path: str, **headers: str) -> Any:
        status, _, body = self.call("GET", path, headers=headers)
        assert status == 200, (status, body)
        return json.loads(body)


def serve(store: Store, **options: Any) -> UiServer:
    server = UiServer(Board(store, interval_s=0.2), store.url or ":memory:", port=0, **options)
    server.start()
    return server


@pytest.fixture
def plane() -> Iterator[Any]:
    store = MemoryStore()
    yield make_plane(store)
    store.close()


def test_read_only_by_default_and_actions_need_the_csrf_token(plane: Any) -> None:
    inv = plane.udf(jobs.add_one).submit(1)
    for allow in (False, True):
        server = serve(plane.store, allow_actions=allow)
        try:
            c = Client(server)
            session = c.json("/api/session")
            assert session["actions"] is allow
            good = {"X-CSRF-Token": session["csrf"]}
            body = {"ns": "default", "id": inv}
            assert c.call("POST", "/api/cancel", body)[0] == 403  # no token
            assert c.call("POST", "/api/cancel", body, {"X-CSRF-Token": "x" * 43})[0] == 403
            foreign = {**good, "Origin": "http://evil.example"}
            assert c.call("POST", "/api/cancel", body, foreign)[0] == 403
            assert plane.status(inv) == "queued"
            status, _, answer = c.call("POST", "/api/cancel", body, good)
            if not allow:
                assert status == 403 and b"actions are off" in answer
                assert plane.status(inv) == "queued"
            else:
                assert status == 200 and json.loads(answer)["ok"] is True
                assert plane.status(inv) == "killed"
                status, _, answer = c.call("POST", "/api/retry", body, good)
                assert status == 200 and plane.status(inv) == "queued"
                status, _, answer = c.call("POST", "/api/retry", body, good)
                assert status == 409, answer  # still live: a conflict, said as such
                assert c.call("POST", "/api/cancel", {"ns": "default"}, good)[0] == 400
                assert c.call("POST", "/api/cancel", "[1]", good)[0] == 400
                assert c.call("POST", "/api/delete", body, good)[0] == 404
            too_big = {**good, "Content-Length": str(1 << 20)}
            assert c.call("GET", "/api/session")[0] == 200
            status, _, _ = c.call("POST", "/api/cancel", None, too_big)
            assert status == 413
        finally:
            server.close()


def test_a_token_is_required_off_loopback_and_checked_everywhere(plane: Any) -> None:
    with pytest.raises(dls.InvalidArgument, match="without a token"):
        UiServer(Board(plane.store), ":memory:", host="0.0.0.0", port=0)
    server = serve(plane.store, token="s3cret-token")
    try:
        c = Client(server)
        assert server.url.endswith("/?token=s3cret-token")
        for path in ("/", "/api/session", "/api/overview", "/static/app.js"):
            assert c.call("GET", path)[0] == 401, path
        assert c.call("GET", "/?token=wrong")[0] == 401
        status, headers, _ = c.call("GET", "/?token=s3cret-token")
        assert status == 303 and headers["location"] == "/"
        cookie = headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        jar = {"Cookie": cookie.split(";", 1)[0]}
        assert c.call("GET", "/api/session", headers=jar)[0] == 200
        assert cookie.startswith(f"lakeshore_ui_{server.port}=")  # per port: per dashboard
        assert (
            c.call("GET", "/api/session", headers={"Cookie": cookie.replace("token", "toke")})[0]
            == 401
        )
    finally:
        server.close()


def test_a_token_must_go_into_a_url_and_a_cookie_as_it_is(plane: Any) -> None:
    for bad in ("Zm9v+YmFy/YmF6==", "a&b=cdefgh", "pass word!", "a;b=cdefgh", "short"):
        with pytest.raises(dls.InvalidArgument, match="letters, digits"):
            UiServer(Board(plane.store), ":memory:", port=0, token=bad)


def test_the_token_never_reaches_the_log(plane: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = serve(plane.store, token="s3cret-token")
    try:
        with caplog.at_level("DEBUG", logger="lakeshore.ui"):
            assert Client(server).call("GET", "/api/overview?token=s3cret-token")[0] == 303
        assert "GET /api/overview" in caplog.text and "s3cret" not in caplog.text
    finally:
        server.close()


def test_without_a_token_only_a_loopback_host_is_answered(plane: Any) -> None:
    server = serve(plane.store)
    try:
        c = Client(server)
        assert c.call("GET", "/api/session", headers={"Host": f"127.0.0.1:{c.port}"})[0] == 200
        assert c.call("GET", "/api/session", headers={"Host": f"localhost:{c.port}"})[0] == 200
        # a page elsewhere that points its own name at 127.0.0.1 (DNS rebinding) gets nothing
        status, _, body = c.call("GET", "/api/overview", headers={"Host": "evil.example"})
        assert status == 421 and b"Host" in body
    finally:
        server.close()


def test_only_the_page_may_call_the_api(plane: Any) -> None:
    """A cross-site page can send a plain GET (it cannot read the answer); without the
    page's header it is refused before the store is read."""
    inv = plane.udf(jobs.add_one).submit(1)
    server = serve(plane.store)
    try:
        c = Client(server)
        bare = {"X-Lakeshore-UI": "0"}
        for path in ("/api/session", "/api/overview", "/api/queue", f"/api/invocation?id={inv}"):
            status, _, body = c.call("GET", path, headers=bare)
            assert status == 403 and b"not a request of the dashboard" in body, path
        download = f"/api/download?id={inv}&what=args"
        assert c.call("GET", download, headers={"Sec-Fetch-Site": "cross-site", **bare})[0] == 403
        assert c.call("GET", download, headers={"Sec-Fetch-Site": "same-origin", **bare})[0] == 200
        many = "&".join(f"f{i}=1" for i in range(40))
        assert c.call("GET", f"/api/session?{many}")[0] == 400  # answered, not dropped
        assert c.call("GET", "/api/session")[0] == 200
    finally:
        server.close()


def test_every_answer_carries_the_protective_headers(plane: Any) -> None:
    server = serve(plane.store)
    try:
        c = Client(server)
        for path in ("/", "/static/app.js", "/api/session", "/api/nothing"):
            _, headers, _ = c.call("GET", path)
            assert "script-src 'self'" in headers["content-security-policy"], path
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["x-frame-options"] == "DENY"
        page = c.call("GET", "/")[2].decode()
        assert "<script" in page and "inline" not in page and "onclick" not in page
    finally:
        server.close()


def test_bad_requests_are_answered_and_the_server_goes_on(plane: Any) -> None:
    server = serve(plane.store)
    try:
        c = Client(server)
        assert c.call("GET", "/api/invocation?id=not-an-id")[0] == 400
        assert c.call("GET", "/api/invocation?id=01M8VMKFK2MM7661NNQJHN8X34")[0] == 404
        assert c.call("GET", "/api/queue?queue=../x")[0] == 400
        assert c.call("GET", "/api/queue?state=lost")[0] == 400
        assert c.call("GET", "/api/frames?id=01M8VMKFK2MM7661NNQJHN8X34&after=x")[0] == 400
        assert c.call("GET", "/api/download?id=01M8VMKFK2MM7661NNQJHN8X34&what=code")[0] == 400
        assert c.call("GET", "/api/session")[0] == 200
    finally:
        server.close()


def test_credentials_never_reach_the_page(moto_store: Store) -> None:
    q = make_plane(moto_store)
    inv = q.udf(jobs.add_one).submit(1)
    dls.run_worker(q, once=True, isolation="thread")
    secret = FAKE_CREDS["aws_secret_access_key"]
    key_id = FAKE_CREDS["aws_access_key_id"]
    url = f"s3://{key_id}:{secret}@bucket/prefix?endpoint_url=http://127.0.0.1:9&token={secret}"
    assert public_url(url) == "s3://bucket/prefix"
    server = UiServer(Board(moto_store, interval_s=0.2), url, port=0, allow_actions=True)
    server.start()
    try:
        c = Client(server)
        poll(lambda: c.json("/api/overview")["rounds"] > 0, 30, "a round of the overview")
        seen = b"".join(
            c.call("GET", path)[2]
            for path in (
                "/",
                "/static/app.js",
                "/api/session",
                "/api/overview",
                "/api/queue",
                f"/api/invocation?id={inv}",
                f"/api/frames?id={inv}",
            )
        )
        assert seen and secret.encode() not in seen and key_id.encode() not in seen
    finally:
        server.close()


def test_the_lakeshore_ui_command_serves_the_store(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    q = dls.Dispatch(url)
    inv = q.udf(jobs.add_one).submit(1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lakeshore", "ui", "--url", url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("lakeshore ui: http://127.0.0.1:") and "read-only" in line
        port = int(line.split("127.0.0.1:", 1)[1].split("/", 1)[0])
        token = line.split("?token=", 1)[1].split()[0]  # a token even on loopback
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/api/overview", headers={"X-Lakeshore-UI": "1"})
        refused = conn.getresponse()
        assert refused.status == 401 and refused.read()
        conn.request("GET", f"/?token={token}")
        answer = conn.getresponse()
        answer.read()
        page = {"Cookie": answer.getheader("Set-Cookie", "").split(";")[0], "X-Lakeshore-UI": "1"}

        def queued() -> bool:
            conn.request("GET", "/api/overview", headers=page)
            data = json.loads(conn.getresponse().read())
            rows = [r for s in data["namespaces"] for r in s["queues"]]
            return any(r["queue"] == "default" and r["queued"] == 1 for r in rows)

        poll(queued, 30, "the submitted invocation in the overview")
        conn.request("GET", f"/api/invocation?id={inv}", headers=page)
        assert json.loads(conn.getresponse().read())["record"]["state"] == "queued"
        conn.close()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    missing = subprocess.run(
        [sys.executable, "-m", "lakeshore", "ui", "--url", f"file://{tmp_path}/nothing"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert missing.returncode == 2 and "lakeshore:" in missing.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "lakeshore", "ui", "--url", url, "--no-token", "--host", "::"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2 and "needs a token" in bad.stderr
