"""The dashboard's reader (`lakeshore.ui.Board`): what it counts, what that costs, and what it
does with hostile objects. The page itself is driven in a browser in tests/e2e."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.keys import worker_key
from lakeshore.model.record import Blob
from lakeshore.protocol.census import folder_names, list_invocations
from lakeshore.protocol.claims import Claimer
from lakeshore.store import MemoryStore, Store
from lakeshore.ui import Board
from tests import jobs
from tests.conftest import make_plane, record_key
from tests.forwarding import Forwarding
from tests.waiting import poll


class Counting(Forwarding):
    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()

    def _count(self, verb: str) -> None:
        with self.lock:
            self.calls[verb] += 1

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self._count("GET")
        return super().get(key, max_bytes)

    def list(self, prefix: str = "", start_after: str | None = None) -> Any:
        self._count("LIST")
        return super().list(prefix, start_after)

    def put(self, key: str, data: bytes, mode: Any = None) -> str:
        self._count("PUT")
        return super().put(key, data) if mode is None else super().put(key, data, mode)

    def requests(self) -> int:
        with self.lock:
            return sum(self.calls.values())


def finish(q: Any) -> None:
    """Run what is claimable until the queue stays empty for half a second."""
    dls.run_worker(q, isolation="thread", idle_exit=0.5, max_poll_s=0.02)


def _row(board: Board, ns: str = "default", queue: str = "default") -> dict[str, Any]:
    for space in board.overview()["namespaces"]:
        if space["ns"] == ns:
            for row in space["queues"]:
                if row["queue"] == queue:
                    return dict(row)
    raise AssertionError(f"{ns}/{queue} not in the overview: {board.overview()}")


def test_counts_queued_running_and_what_left_between_rounds() -> None:
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(5)]
    board = Board(q.store)
    board.poll()
    assert (_row(board)["queued"], _row(board)["running"]) == (5, 0)
    held = Claimer(q.ops("default"), "w1").claim(q.store.now())
    assert held is not None
    board.poll()
    row = _row(board)
    assert (row["queued"], row["running"], row["live"], row["estimated"]) == (4, 1, 5, False)
    q.cancel(held.record.id)  # its ticket is left to the next claimer, which drops it
    q.cancel(next(i for i in ids if i != held.record.id))
    finish(q)
    board.poll()
    row = _row(board)
    assert (row["queued"], row["running"], row["live"]) == (0, 0, 0)
    # the chart's points: [time, live, queued, running, left, arrived]
    assert [p[1] for p in row["series"]] == [5, 5, 0]
    assert [p[4] for p in row["series"]] == [0, 0, 5]


def test_an_overview_round_costs_the_same_whatever_the_finished_history() -> None:
    store = Counting(MemoryStore())
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    board = Board(store, discover_s=3600)
    [f.submit(i) for i in range(10)]
    finish(q)
    f.submit(0)
    board.poll()  # the first round also discovers the names and reads the queue records

    def round_cost() -> Counter[str]:
        store.calls.clear()
        board.poll()
        return Counter(store.calls)

    small = round_cost()
    [f.submit(i) for i in range(300)]
    finish(q)
    f.submit(0)
    round_cost()  # the round that sees the 300 leave (their tickets are gone)
    large = round_cost()
    assert large == small, (small, large)  # 30x the history, the same requests
    assert large["GET"] <= 1 and large["LIST"] <= 3, large


def test_many_tabs_cost_what_one_does() -> None:
    store = Counting(MemoryStore())
    q = make_plane(store)
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(30)]
    board = Board(store, interval_s=60, live_s=60)
    board.poll()

    def tab() -> None:
        for _ in range(20):
            board.overview()
            board.queue_page("default", "default")
            board.invocation("default", ids[3])
            board.frames("default", ids[3], -1)

    store.calls.clear()
    tab()
    one = store.requests()
    store.calls.clear()
    board = Board(store, interval_s=60, live_s=60)  # the many start as cold as the one did
    board.poll()
    store.calls.clear()
    tabs = [threading.Thread(target=tab) for _ in range(8)]
    for t in tabs:
        t.start()
    for t in tabs:
        t.join()
    assert 0 < store.requests() == one, store.calls  # 8 tabs x 20 refreshes: one read each


def test_the_read_budget_serves_stale_copies_then_refuses() -> None:
    q = make_plane(MemoryStore())
    ids = [q.udf(jobs.add_one).submit(i) for i in range(3)]
    clock = [0.0]
    board = Board(q.store, live_s=1, max_reads_per_min=2, monotonic=lambda: clock[0])
    first = board.invocation("default", ids[0])
    assert "stale" not in first
    board.invocation("default", ids[1])
    clock[0] = 5.0
    assert board.invocation("default", ids[0]) == {**first, "stale": True}
    assert board.invocation("default", ids[2])["busy"] is True
    clock[0] = 61.0  # a new minute: reads again
    assert board.invocation("default", ids[2])["record"]["id"] == ids[2]


def test_names_of_namespaces_and_queues_cost_one_list_each() -> None:
    store = Counting(MemoryStore())
    for ns, queue in [("a", "q"), ("a.b", "q"), ("a-b", "z"), ("ab", "default"), ("a", "r")]:
        p = make_plane(store, ns=ns)
        for i in range(50):
            p.udf(jobs.add_one, queue=queue).submit(i)
    store.calls.clear()
    assert sorted(folder_names(store, "lakeshore/")) == ["a", "a-b", "a.b", "ab"]
    assert store.calls["LIST"] == 5  # one per name and the one that found the end
    assert sorted(folder_names(store, "lakeshore/a/")) == ["_ids", "q", "r"]
    board = Board(store)
    board.poll()
    shown = {s["ns"]: [r["queue"] for r in s["queues"]] for s in board.overview()["namespaces"]}
    assert shown == {"a": ["q", "r"], "a-b": ["z"], "a.b": ["q"], "ab": ["default"]}
    assert _row(board, "a", "r")["queued"] == 50


@pytest.mark.seaweedfs
def test_folder_names_on_seaweedfs(seaweed_s3: Store) -> None:
    """A server that lists by walking directories must still skip folder to folder."""
    for ns in ("a", "a.b", "a-b", "ab", "b"):
        seaweed_s3.put(f"lakeshore/{ns}/default/_queue", b"x")
        seaweed_s3.put(f"lakeshore/{ns}/default/x/y", b"x")
    assert sorted(folder_names(seaweed_s3, "lakeshore/")) == ["a", "a-b", "a.b", "ab", "b"]


def test_hostile_objects_do_not_stop_the_board() -> None:
    q = make_plane(MemoryStore())
    f = q.udf(jobs.add_one)
    f.submit(1)
    bad = f.submit(2)
    ops = q.ops("default")
    held = Claimer(ops, "w1").claim(q.store.now())  # takes `good` or `bad`: both get records
    assert held is not None
    Claimer(ops, "w2").claim(q.store.now())
    q.store.put(record_key(ops, bad), b"\xc1 not a record")
    q.store.put(ops.keys.tickets_prefix + "5/not-an-id", b"junk")
    q.store.put(worker_key(q.ns, "evil"), b"\xc1")
    life = {"worker": "<b>w</b>", "seen_at": q.store.now(), "queues": ["default", "../x"]}
    q.store.put(worker_key(q.ns, "odd"), codec.encode(life))
    board = Board(q.store)
    board.poll()
    assert board.overview()["error"] is None
    row = _row(board)
    assert row["live"] == 2 and row["running"] + row["queued"] <= 2
    workers = board.overview()["namespaces"][0]["workers"]
    assert [w.get("worker") for w in workers] == ["<b>w</b>"]  # data, shown as text
    assert workers[0]["queues"] == ["default"]
    page = board.invocation("default", bad)
    assert page["record"]["state"] == "failed"  # the stub a claimer would write
    assert "CorruptRecord" in page["error"]["type"]
    assert board.queue_page("default", "default")["invocations"]


def test_a_record_pointing_outside_its_invocation_is_not_followed() -> None:
    store = MemoryStore()
    q = make_plane(store, spill_bytes=10)
    inv = q.udf(jobs.echo).submit("x" * 100)  # spilled: <id>/args
    store.put("lakeshore/other/secret", b"the other tenant's data")
    ops = q.ops("default")
    rec, _ = ops.read(inv)
    forged = rec.next_write(args=Blob(ref="lakeshore/other/secret", size=23, sha256="0" * 64))
    store.put(record_key(ops, inv), forged.to_bytes())
    board = Board(store)
    page = board.invocation("default", inv)
    assert page["args"]["shown"] is None and "outside" in page["args"]["problem"]
    with pytest.raises(dls.StoreError, match="outside its invocation"):
        board.download("default", inv, "args")


def test_values_are_clipped_and_spilled_ones_downloadable() -> None:
    store = MemoryStore()
    q = make_plane(store, spill_bytes=100)
    inv = q.udf(jobs.echo).submit("y" * 10_000)
    dls.run_worker(q, once=True, isolation="thread")
    board = Board(store)
    page = board.invocation("default", inv)
    assert page["args"]["spilled"] and page["result"]["spilled"]
    assert len(page["args"]["shown"]) < 4200 and page["args"]["shown"].endswith("characters)")
    data, name = board.download("default", inv, "result")  # type: ignore[misc]
    assert codec.decode(data) == q.result(inv) and name == f"{inv}-result.msgpack"
    assert board.invocation("default", inv)["history"][0][4] == "succeeded"


def test_list_invocations_filters_by_function_and_stops_reading() -> None:
    q = make_plane(MemoryStore())
    add, echo = q.udf(jobs.add_one), q.udf(jobs.echo)
    wanted = [echo.submit(0)]
    [add.submit(i) for i in range(40)]
    wanted.append(echo.submit(1))
    ops = q.ops("default")
    now = q.store.now()
    page = list_invocations(ops, now, fn="tests.jobs:echo", limit=5)
    assert [r.id for r in page.records] == wanted[::-1] and page.next_before is None
    short = list_invocations(ops, now, fn="tests.jobs:echo", limit=5, max_read=10)
    assert [r.id for r in short.records] == wanted[1:]  # the newest 10 read: one match
    assert short.next_before is not None  # and the cursor to go on from
    rest = list_invocations(ops, now, fn="tests.jobs:echo", before=short.next_before)
    assert [r.id for r in rest.records] == wanted[:1]


def test_the_documented_cost_of_an_idle_store() -> None:
    """docs/ui.md, 'What it costs', first row: 1 namespace, 3 idle queues, no worker."""
    store = Counting(MemoryStore())
    q = make_plane(store)
    for name in ("a", "b", "c"):
        q.configure(name, max_attempts=2)
    board = Board(store)
    store.calls.clear()
    board.poll()  # the names (and settings), then a round
    first = Counter(store.calls)
    store.calls.clear()
    board.poll()
    assert store.calls == Counter(LIST=4)  # _workers/, and each queue's _tickets/
    names = first - store.calls
    # the root: 1 namespace + the end; the namespace: 3 queues + the end; 3 queue records
    assert names == Counter(LIST=2 + 4, GET=3)
    assert 12 * 4 + sum(names.values()) == 57  # a minute of it, as the table says


def test_the_poller_sleeps_while_no_page_asks() -> None:
    from lakeshore.ui.board import IDLE_AFTER_S

    clock = [0.0]
    board = Board(MemoryStore(), monotonic=lambda: clock[0])
    assert board.watched()  # the first round, to have something to show
    board.poll()
    assert not board.watched()  # nobody asked
    board.overview()
    clock[0] += IDLE_AFTER_S - 1
    assert board.watched()
    clock[0] += 2
    assert not board.watched()  # a minute without a page: asleep
    board.start()
    try:
        board.overview()  # a page asks again: it wakes at once
        poll(lambda: board.overview()["rounds"] >= 2, 30, "a round after the wake-up")
    finally:
        board.close()
