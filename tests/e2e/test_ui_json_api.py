"""The dashboard's JSON API read by a script: the token in an ``Authorization: Bearer``
header is all it needs (no cookie, no page header); without the token, or with a wrong
one, every endpoint is refused, and the API stays read-only (docs/ui.md#the-json-api)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.store import MemoryStore
from lakeshore.ui import Board, UiServer
from tests import jobs
from tests.tiers import make_plane
from tests.waiting import poll

TOKEN = "a-script-token-123"


def get(server: UiServer, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """What a script does: one GET with urllib, the answer as JSON."""
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read() or b"null")


@pytest.fixture
def served() -> Iterator[tuple[Any, UiServer, list[str]]]:
    store = MemoryStore()
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(3)]
    assert dls.run_worker(q, isolation="thread", max_jobs=1) == 1
    server = UiServer(Board(store, interval_s=0.2), ":memory:", port=0, token=TOKEN)
    server.start()
    try:
        yield q, server, ids
    finally:
        server.close()
        store.close()


def test_a_script_with_the_token_reads_the_overview_and_a_queue(
    served: tuple[Any, UiServer, list[str]],
) -> None:
    _, server, ids = served
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def counted() -> Any:
        status, data = get(server, "/api/overview", auth)
        assert status == 200, data
        rows = [r for ns in data["namespaces"] for r in ns["queues"]]
        return next((r for r in rows if r["queue"] == "default" and r["live"] == 2), None)

    row = poll(counted, 30, "the queue in the overview")
    assert (row["queued"], row["running"], row["estimated"]) == (2, 0, False)

    status, page = get(server, "/api/queue?ns=default&queue=default&limit=2", auth)
    assert status == 200
    assert [r["id"] for r in page["invocations"]] == sorted(ids, reverse=True)[:2]
    assert page["next_before"] == sorted(ids, reverse=True)[1]
    status, page = get(server, "/api/queue?queue=default&state=succeeded", auth)
    assert [r["id"] for r in page["invocations"]] == [ids[0]]

    status, inv = get(server, f"/api/invocation?id={ids[0]}", auth)
    assert status == 200 and inv["record"]["state"] == "succeeded"
    assert inv["result"]["shown"] == "1"
    status, session = get(server, "/api/session", auth)
    assert status == 200 and session["actions"] is False

    # the scheme's name is case-insensitive, as HTTP has it
    assert get(server, "/api/session", {"Authorization": f"bearer {TOKEN}"})[0] == 200


def test_without_the_token_a_script_is_refused(
    served: tuple[Any, UiServer, list[str]],
) -> None:
    _, server, ids = served
    page = {"X-Lakeshore-UI": "1"}  # what the page sends: the cookie is what it lacks here
    for path in ("/api/overview", "/api/queue?queue=default", f"/api/invocation?id={ids[0]}"):
        for headers in (
            {},
            page,
            {**page, "Authorization": "Bearer wrong-token-456"},
            {**page, "Authorization": f"Basic {TOKEN}"},
            {**page, "Authorization": f"Bearer {TOKEN}x"},
        ):
            status, data = get(server, path, headers)
            assert status == 401, (path, headers, data)
            assert "Authorization: Bearer" in data["error"]


def test_the_token_header_reads_but_does_not_act(
    served: tuple[Any, UiServer, list[str]],
) -> None:
    q, server, ids = served
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    body = json.dumps({"ns": "default", "id": ids[1]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/api/cancel", data=body, headers=auth, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    with e.value:
        assert e.value.code == 403  # no CSRF token; and actions are off anyway
    assert q.status(ids[1]) == "queued"
