"""The dashboard against clients and stores that try to shut it off or exhaust it: slow
half-sent connections, oversized requests, huge journal and log segments, and a HEAD of a
download (docs/ui.md, Security and What it costs)."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.store import MemoryStore, Store
from lakeshore.streams.journal import VALUE, encode_segment
from lakeshore.ui import Board, UiServer
from lakeshore.ui.gate import Gate
from tests import jobs
from tests.forwarding import Forwarding
from tests.tiers import make_plane
from tests.waiting import poll

TOKEN = "holder-s3cret"


class Reads(Forwarding):
    """Every GET: its key, the ``max_bytes`` it asked for, and how many bytes came back."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.gets: list[tuple[str, int | None, int]] = []
        self.lock = threading.Lock()

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        data, etag = super().get(key, max_bytes)
        with self.lock:
            self.gets.append((key, max_bytes, len(data)))
        return data, etag


def serve(store: Store, **options: Any) -> UiServer:
    server = UiServer(Board(store, interval_s=0.2), ":memory:", port=0, token=TOKEN, **options)
    server.start()
    return server


def holder_get(server: UiServer, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """A request of the token holder's page, on a connection of its own."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        headers = {"Cookie": f"{server.cookie}={TOKEN}", "X-Lakeshore-UI": "1"}
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def half_sent(server: UiServer) -> socket.socket:
    """A connection that sent the start of a request and nothing more (yet)."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.sendall(b"GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
    return s


def closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.01)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


@pytest.fixture
def plane() -> Iterator[Any]:
    store = MemoryStore()
    yield make_plane(store)
    store.close()


def test_slow_half_sent_connections_do_not_keep_the_token_holder_out(plane: Any) -> None:
    """The finding: 300 half-sent connections from one address held every place before any
    of them had shown the token, and the holder's connection was closed at once."""
    server = serve(plane.store)
    slow: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:  # a header byte on each, well within any per-byte timeout
        while not stop.wait(0.5):
            for s in list(slow):
                with contextlib.suppress(OSError):  # closed by the server: what it may do
                    s.sendall(b"a")

    trickler = threading.Thread(target=trickle)
    trickler.start()
    try:
        for _ in range(300):
            slow.append(half_sent(server))
        deadline = time.monotonic() + 10
        answer: tuple[int, bytes] | None = None
        while answer is None and time.monotonic() < deadline:
            try:  # a connection accepted before the last slow ones may lose its place: again
                answer = holder_get(server, "/api/session")
            except (ConnectionError, http.client.HTTPException, TimeoutError):
                continue
        assert answer is not None and answer[0] == 200, answer
        assert sum(not closed_by_server(s) for s in slow) > 0  # the slow ones are still there
    finally:
        stop.set()
        trickler.join()
        for s in slow:
            s.close()
        server.close()


def test_a_request_trickled_a_byte_at_a_time_is_closed_at_its_header_deadline(
    plane: Any,
) -> None:
    clock = [0.0]
    server = serve(plane.store, header_deadline_s=5.0, monotonic=lambda: clock[0])
    inside = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    s = half_sent(server)
    try:
        headers = {"Cookie": f"{server.cookie}={TOKEN}", "X-Lakeshore-UI": "1"}
        inside.request("GET", "/api/session", headers=headers)
        assert inside.getresponse().read()
        for _ in range(3):  # bytes keep coming, each well within any per-byte timeout
            clock[0] += 2.0
            s.sendall(b"b")
        poll(lambda: closed_by_server(s), 10, "the half-sent connection closed")
        inside.request("GET", "/api/session", headers=headers)  # let in: no deadline
        assert inside.getresponse().status == 200
    finally:
        s.close()
        inside.close()
        server.close()


def test_a_refused_request_closes_its_connection_and_an_oversized_one_is_refused(
    plane: Any,
) -> None:
    server = serve(plane.store)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/api/session", headers={"X-Lakeshore-UI": "1"})
        refused = conn.getresponse()
        assert refused.status == 401 and refused.getheader("Connection") == "close"
        refused.read()
        big = {f"X-Pad-{i}": "p" * 40_000 for i in range(3)}  # 120 KB of header lines
        conn.request("GET", "/api/session", headers={"X-Lakeshore-UI": "1", **big})
        answer = conn.getresponse()
        assert answer.status == 431 and answer.getheader("Connection") == "close"
        conn.close()
        assert holder_get(server, "/api/session")[0] == 200
    finally:
        server.close()


class _Conn:
    def __init__(self) -> None:
        self.shut = False

    def shutdown(self, how: int) -> None:
        self.shut = True


def test_waiting_connections_never_take_the_places_of_those_let_in() -> None:
    clock = [0.0]
    gate = Gate(
        max_connections=2,
        max_waiting=4,
        max_waiting_per_client=2,
        deadline_s=5,
        monotonic=lambda: clock[0],
    )
    a1, a2, a3 = _Conn(), _Conn(), _Conn()
    for c in (a1, a2, a3):  # one address: its oldest waiting one goes
        assert gate.arrive(c, "10.0.0.1")
    assert a1.shut and not a2.shut and not a3.shut
    b = [_Conn() for _ in range(3)]
    for c in b:
        assert gate.arrive(c, "10.0.0.2")
    assert b[0].shut and not a2.shut  # another address's flood does not evict a2
    assert gate.counts() == (4, 0)
    held = [_Conn(), _Conn()]
    for c in held:  # the first closes the oldest waiting one (a2): the pool is full
        assert gate.arrive(c, "127.0.0.1") and gate.let_in(c)
    assert a2.shut and gate.counts() == (3, 2)  # the waiting ones never held the two places
    late = _Conn()
    assert gate.arrive(late, "127.0.0.1") and not gate.let_in(late)  # every place taken
    assert not gate.let_in(a1)  # closed while waiting: never let in
    clock[0] = 6.0
    gate.sweep()
    assert late.shut and a3.shut and b[2].shut and not any(c.shut for c in held)
    for c in (a1, a2, a3, *b, late):
        gate.leave(c)
    gate.leave(held[0])
    assert gate.counts() == (0, 1)
    with pytest.raises(dls.InvalidArgument):
        Gate(max_connections=1, max_waiting=2, max_waiting_per_client=3, deadline_s=1)


def test_a_flood_beyond_every_place_is_closed_at_once() -> None:
    gate = Gate(max_connections=1, max_waiting=1, max_waiting_per_client=1, deadline_s=5)
    conns = [_Conn() for _ in range(3)]
    assert all(gate.arrive(c, "10.0.0.1") for c in conns)  # each closes the one before
    assert not gate.arrive(_Conn(), "10.0.0.1")  # the closed ones have not left yet
    for c in conns:
        gate.leave(c)
    assert gate.arrive(_Conn(), "10.0.0.1")


def _plant(store: Store, key: str, attempt: int, first: int, payload: bytes) -> int:
    data = encode_segment(attempt, first, [(VALUE, payload)])
    store.put(key, data)
    return len(data)


def test_a_huge_journal_or_log_segment_is_named_not_read_whole() -> None:
    """The finding: a 250 MiB segment was read whole by a page (6 pages took the server to
    2.3 GB). Here 8 MiB ones, over the dashboard's bound, in a journal and in the logs."""
    store = Reads(MemoryStore())
    q = make_plane(store)
    inv = q.udf(jobs.squares).submit(3)
    dls.run_worker(q, once=True, isolation="thread")
    keys = q.plane.ops("default").keys
    clock = [0.0]
    board = Board(store, monotonic=lambda: clock[0])
    assert len(board.frames("default", inv, -1)["frames"]) == 3
    huge = codec.encode("x" * (8 << 20))
    journal = _plant(store, keys.journal(inv, 1, 4), 1, 4, huge)
    _plant(store, keys.journal(inv, 1, 5), 1, 5, codec.encode("after"))
    logs = _plant(store, keys.logs(inv, 1, 0), 1, 0, huge)
    _plant(store, keys.logs(inv, 1, 1), 1, 1, codec.encode("later line\n"))
    store.gets.clear()
    clock[0] = 100.0  # the page is read again
    page = board.invocation("default", inv)
    frames = board.frames("default", inv, 2)["frames"]
    assert [f["seq"] for f in frames] == [4, 5]
    assert f"a segment of {journal} bytes" in frames[0]["value"]
    assert "not shown" in frames[0]["value"] and "after" in frames[1]["value"]
    text = page["logs"][-1]["text"]
    assert f"a segment of {logs} bytes" in text and text.endswith("later line\n")
    segments = [g for g in store.gets if "/journal/" in g[0] or "/logs/" in g[0]]
    assert segments and max(size for _, _, size in segments) < 1 << 20, segments
    assert all(m is not None and m < 8 << 20 for _, m, _ in segments), segments


def test_a_segment_larger_than_its_listing_said_stops_the_stream() -> None:
    class Lying(Reads):
        def list(self, prefix: str = "", start_after: str | None = None) -> Any:
            for info in super().list(prefix, start_after):
                lies = "/journal/" in info.key
                yield dataclasses.replace(info, size=min(info.size, 10)) if lies else info

    store = Lying(MemoryStore())
    q = make_plane(store)
    inv = q.udf(jobs.squares).submit(1)
    dls.run_worker(q, once=True, isolation="thread")
    keys = q.plane.ops("default").keys
    _plant(store, keys.journal(inv, 1, 2), 1, 2, codec.encode("y" * 4096))
    board = Board(store, max_segment_bytes=1024)
    page = board.frames("default", inv, -1)
    assert "larger than listed" in page["problem"]
    assert all(size <= 1024 for key, _, size in store.gets if "/journal/" in key)


def test_head_of_a_download_reads_no_value() -> None:
    store = Reads(MemoryStore())
    q = make_plane(store, spill_bytes=10)
    inv = q.udf(jobs.echo).submit("v" * 5000)
    args_key = q.plane.ops("default").keys.args(inv)
    server = serve(store)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        headers = {"Cookie": f"{server.cookie}={TOKEN}", "Sec-Fetch-Site": "same-origin"}
        conn.request("HEAD", f"/api/download?id={inv}&what=args", headers=headers)
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b""
        assert [g for g in store.gets if g[0] == args_key] == []
        conn.request("GET", f"/api/download?id={inv}&what=args", headers=headers)
        body = conn.getresponse().read()
        assert int(head.getheader("Content-Length", "-1")) == len(body) > 5000
        assert "attachment" in (head.getheader("Content-Disposition") or "")
        assert [g[0] for g in store.gets if g[0] == args_key] == [args_key]
        conn.close()
    finally:
        server.close()
