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
from tests.forwarding import Forwarding
from tests.tiers import make_plane, record_key
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
    held = Claimer(q.plane.ops("default"), "w1").claim(q.store.now())
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
    dls.run_worker(q, once=True, isolation="thread")  # ids[0] has a record, the rest tickets

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


def test_the_budget_counts_store_requests_then_serves_stale_copies() -> None:
    q = make_plane(MemoryStore())
    ids = [q.udf(jobs.add_one).submit(i) for i in range(3)]
    clock = [0.0]
    board = Board(q.store, live_s=1, max_requests_per_min=5, monotonic=lambda: clock[0])
    first = board.invocation("default", ids[0])
    spent = board.pages.budget.spent()
    assert "stale" not in first and spent >= 3  # the requests of the read, not one "read"
    board.invocation("default", ids[1])  # starts within the budget, may end past it
    clock[0] = 5.0
    assert board.invocation("default", ids[0]) == {**first, "stale": True}
    assert board.invocation("default", ids[2])["busy"] is True
    assert board.download("default", ids[2], "args") is None  # downloads spend it too
    clock[0] = 61.0  # a new minute: reads again
    assert board.invocation("default", ids[2])["record"]["id"] == ids[2]


def test_varied_filters_cannot_buy_unbounded_reads() -> None:
    store = Counting(MemoryStore())
    q = make_plane(store)
    [q.udf(jobs.add_one).submit(i) for i in range(400)]
    board = Board(store, max_requests_per_min=2000)
    store.calls.clear()

    def tab(n: int) -> None:
        for k in range(20):  # a new filter each time: no copy to share
            board.queue_page("default", "default", fn=f"m:f{n}-{k}", limit=200)

    tabs = [threading.Thread(target=tab, args=(n,)) for n in range(16)]
    for t in tabs:
        t.start()
    for t in tabs:
        t.join()
    # reads side by side: the store refuses the pages past the budget, request by request
    assert 2000 <= store.requests() <= 2000 + 16, store.calls


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
    ops = q.plane.ops("default")
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
    ops = q.plane.ops("default")
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
    assert len(page["args"]["shown"]) < 4200 and "..." in page["args"]["shown"]  # elided
    data, name = board.download("default", inv, "result")  # type: ignore[misc]
    assert codec.decode(data) == q.result(inv) and name == f"{inv}-result.msgpack"
    assert board.invocation("default", inv)["history"][0][4] == "succeeded"


def test_list_invocations_filters_by_function_and_stops_reading() -> None:
    q = make_plane(MemoryStore())
    add, echo = q.udf(jobs.add_one), q.udf(jobs.echo)
    wanted = [echo.submit(0)]
    [add.submit(i) for i in range(40)]
    wanted.append(echo.submit(1))
    ops = q.plane.ops("default")
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
    from lakeshore.ui.overview import IDLE_AFTER_S

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


def test_a_tombstone_in_a_ticket_is_not_counted_as_queued() -> None:
    q = make_plane(MemoryStore())
    live = q.udf(jobs.add_one).submit(1)
    ops = q.plane.ops("default")
    from lakeshore.keys import new_id

    dead = new_id()
    assert ops.fence(dead, q.store.now(), "its submitter died")  # a failed record in the ticket
    board = Board(q.store)
    for _ in range(2):  # the second round knows the tombstone by its etag
        board.poll()
        row = _row(board)
        assert (row["queued"], row["running"], row["live"]) == (1, 0, 1), row
    assert q.status(live) == "queued"


def test_a_planted_key_among_the_signs_of_life_does_not_stop_the_overview(
    moto_store: Store,
) -> None:
    from lakeshore.keys import workers_prefix

    q = make_plane(moto_store)
    q.udf(jobs.add_one).submit(1)
    dls.run_worker(q, once=True, isolation="thread")
    client = moto_store.client  # type: ignore[attr-defined]
    # a key no lakeshore store would write (S3 takes it): reading it is refused
    planted = moto_store.prefix + workers_prefix("default") + "x/../y"  # type: ignore[attr-defined]
    client.put_object(Bucket=moto_store.bucket, Key=planted, Body=b"x")  # type: ignore[attr-defined]
    board = Board(moto_store)
    board.poll()
    overview = board.overview()
    assert overview["error"] is None and overview["namespaces"][0]["problems"] == []
    assert len(overview["namespaces"][0]["workers"]) == 1  # the real one still shown


class Failing(Forwarding):
    """A store whose LISTs fail, as told (an OS error: no lakeshore error at all)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.fail: BaseException | None = None

    def list(self, prefix: str = "", start_after: str | None = None) -> Any:
        if self.fail is not None:
            raise self.fail
        return super().list(prefix, start_after)


def test_a_round_that_meets_any_exception_is_said_and_the_rounds_go_on() -> None:
    store = Failing(MemoryStore())
    q = make_plane(store)
    q.udf(jobs.add_one).submit(1)
    board = Board(store, interval_s=0.05)
    store.fail = OSError(24, "Too many open files")
    board.start()
    try:
        board.overview()
        poll(lambda: "Too many open files" in str(board.overview()["error"]), 30, "the error")
        store.fail = None
        poll(lambda: board.overview()["error"] is None, 30, "a round after the error")
        assert _row(board)["queued"] == 1
    finally:
        board.close()


def test_a_blip_in_a_stream_is_said_and_read_again() -> None:
    store = Failing(MemoryStore())
    q = make_plane(store)
    inv = q.udf(jobs.squares).submit(3)
    dls.run_worker(q, once=True, isolation="thread")
    clock = [0.0]
    board = Board(store, live_s=1, monotonic=lambda: clock[0])
    store.fail = dls.StoreUnavailable("list", "a network blip", "retry")
    page = board.invocation("default", inv)
    assert "trying again" in page["stream"]["problem"]
    assert "trying again" in page["logs_problem"]
    store.fail = None
    clock[0] = 100.0
    frames = board.frames("default", inv, -1)
    assert frames["problem"] is None and [f["seq"] for f in frames["frames"]] == [0, 1, 2]


def test_a_long_journal_is_read_from_its_newest_frames() -> None:
    from lakeshore.ui.following import MAX_FRAMES

    store = Counting(MemoryStore())
    q = make_plane(store)
    inv = q.udf(jobs.squares).submit(3000)
    dls.run_worker(q, once=True, isolation="thread")
    segments = len(list(store.list(q.plane.ops("default").keys.journal_prefix(inv, 1))))
    board = Board(store)
    store.calls.clear()
    frames = board.frames("default", inv, -1)["frames"]
    assert len(frames) == 500 and frames[0]["seq"] == 3000 - MAX_FRAMES
    assert store.calls["GET"] < segments / 2 + 10, (store.calls, segments)


def test_a_spilled_value_is_read_once_and_only_from_its_own_key() -> None:
    store = Counting(MemoryStore())
    q = make_plane(store, spill_bytes=10)
    a = q.udf(jobs.echo).submit("SECRET-OF-A" * 10)
    b = q.udf(jobs.echo).submit("b" * 100)
    ops = q.plane.ops("default")
    rec_b, _ = ops.read(b)
    rec_a, _ = ops.read(a)
    forged = rec_b.next_write(args=rec_a.args)  # b's record names a's arguments
    store.put(record_key(ops, b), forged.to_bytes())
    clock = [0.0]
    board = Board(store, live_s=1, monotonic=lambda: clock[0])
    page = board.invocation("default", b)
    assert page["args"]["shown"] is None and "outside" in page["args"]["problem"]
    assert "SECRET" in board.invocation("default", a)["args"]["shown"]
    clock[0] = 10.0
    store.calls.clear()
    board.invocation("default", a)
    assert store.calls["GET"] == 2  # its record and ticket: the spilled value is known


def test_long_logs_are_read_from_their_newest_segments() -> None:
    from lakeshore.streams.journal import JournalWriter

    store = Counting(MemoryStore())
    q = make_plane(store)
    inv = q.udf(jobs.add_one).submit(1)
    dls.run_worker(q, once=True, isolation="thread")
    ops = q.plane.ops("default")
    writer = JournalWriter(store, lambda seq: ops.keys.logs(inv, 1, seq), 1, flush_frames=1)
    for i in range(400):  # a segment each
        writer.add(codec.encode(f"line {i} " + "x" * 2000 + "\n"))
    writer.close()
    segments = len(list(store.list(ops.keys.logs_prefix(inv))))
    board = Board(store)
    store.calls.clear()
    page = board.invocation("default", inv)
    text = page["logs"][-1]["text"]
    assert "line 399" in text and "line 0 " not in text
    assert store.calls["GET"] < 5 + segments // 2, (store.calls, segments)


def test_a_missing_id_is_remembered_for_an_interval() -> None:
    store = Counting(MemoryStore())
    q = make_plane(store)
    for name in ("a", "b", "c", "d"):
        q.configure(name, max_attempts=2)
    board = Board(store, interval_s=5)
    board.poll()
    store.calls.clear()
    missing = "01M8VMKFK2MM7661NNQJHN8X34"
    for _ in range(10):
        with pytest.raises(dls.NotFound):
            board.invocation("default", missing)
    assert store.requests() <= 4  # the id index, the default queue: once, not ten times


def test_pages_of_namespaces_not_shown_are_refused() -> None:
    q = make_plane(MemoryStore(), ns="team-a")
    inv = q.udf(jobs.add_one).submit(1)
    board = Board(q.store, ["team-b"])
    with pytest.raises(dls.NotFound, match="not shown here"):
        board.invocation("team-a", inv)
    with pytest.raises(dls.NotFound, match="not shown here"):
        board.queue_page("team-a", "default")
    assert Board(q.store, ["team-a"]).invocation("team-a", inv)["record"]["id"] == inv
