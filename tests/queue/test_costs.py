"""Bounded costs (issue 22, item 8): a size cap on every user-supplied field of the record,
topic posts through a fresh handle that do not list the whole topic, stream resumes that do
not fetch the journal before the cursor, and reads of segments and posts that are bounded.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack
import pytest

import lakeshore as dls
from bench.counting import Counting
from lakeshore import codec, keys
from lakeshore.errors import CorruptSegment, RecordError
from lakeshore.model import lifecycle
from lakeshore.model.record import LIMITS, MAX_ERROR_TEXT, Blob, Record
from lakeshore.store import MemoryStore, Store
from lakeshore.streams import journal, topic
from lakeshore.streams.journal import VALUE, encode_segment, read_segments
from lakeshore.streams.topic import Topic
from tests import jobs
from tests.handmade import handmade, put_by_hand
from tests.tiers import make_plane


def written(store: Store) -> list[str]:
    """The objects in the store beside queue records (a submit's first read creates one)."""
    return [i.key for i in store.list() if not i.key.endswith("/_queue")]


# -- record field caps --------------------------------------------------------------------


def test_submit_refuses_an_oversize_key_before_writing_anything(plane: Any) -> None:
    f = plane.udf(jobs.add_one)
    with pytest.raises(dls.InvalidArgument, match="over the limit of 1024 bytes"):
        f.submit(1, _key="k" * (20 << 20))  # the 20 MB key of the issue
    with pytest.raises(dls.InvalidArgument, match="over the limit of 1024 bytes"):
        f.submit(1, _key="é" * 513)  # 1026 bytes of UTF-8
    assert written(plane.store) == []
    inv = f.submit(1, _key="k" * 1024)  # at the cap: fine
    assert plane.get(inv).key == "k" * 1024


@pytest.mark.parametrize("key", ["a\x1b]52;c;aGk=\x07", "line\nbreak", "del\x7f", "c1\x9b2K"])
def test_submit_refuses_a_key_with_control_characters(key: str) -> None:
    q = make_plane(MemoryStore())
    with pytest.raises(dls.InvalidArgument, match="control character"):
        q.udf(jobs.add_one).submit(1, _key=key)
    assert written(q.store) == []


def test_an_oversize_scope_prefix_never_reaches_a_record() -> None:
    q = make_plane(MemoryStore())
    deep = "/".join(["segment"] * 200)  # 1599 bytes: the scope itself refuses it
    with pytest.raises(dls.InvalidArgument, match="1599 bytes"), q.scope(deep):
        q.udf(jobs.add_one).submit(1)
    assert written(q.store) == []


def test_inline_arguments_are_capped_whatever_spill_bytes_says() -> None:
    q = make_plane(MemoryStore(), spill_bytes=1 << 30)
    inv = q.udf(jobs.size_of).submit(b"x" * (2 << 20))
    rec = q.get(inv)
    assert rec.args.ref is not None and rec.args.inline is None  # spilled, not in the record
    assert len(rec.to_bytes()) < 4096  # so every heartbeat stays small
    dls.run_worker(q, once=True, isolation="thread")
    assert q.result(inv, timeout=5) == 2 << 20


def test_run_worker_refuses_an_oversize_worker_id() -> None:
    q = make_plane(MemoryStore())
    with pytest.raises(dls.InvalidArgument, match=r"lease\.worker is 300 bytes"):
        dls.run_worker(q, once=True, worker_id="w" * 300)


def test_a_worker_error_text_is_clipped_keeping_head_and_tail() -> None:
    rec = Record(id=keys.new_id(), ns="default", queue="default", fn="m:f", args=Blob(b""))
    trace = "Traceback (most recent call last):\n" + "x" * (1 << 20) + "\nValueError: the end"
    error = {"type": "ValueError", "message": "m" * (1 << 20), "traceback": trace}
    running = lifecycle.claim(rec, "w", "t", 1.0)
    failed = lifecycle.fail(running, "t", error, 1.0, retry=False)
    assert failed.error is not None
    assert all(len(v.encode()) <= MAX_ERROR_TEXT for v in failed.error.values())
    assert failed.error["traceback"].startswith("Traceback (most recent call last):")
    assert failed.error["traceback"].endswith("ValueError: the end")
    assert "bytes cut" in failed.error["traceback"]
    assert Record.from_bytes(failed.to_bytes()).error == failed.error  # readable again
    killed = lifecycle.cancel(rec, 1.0, reason="r" * (1 << 20))
    assert killed.error is not None and len(killed.error["message"]) <= MAX_ERROR_TEXT


OVERSIZE = {
    "key": "k" * (LIMITS["key"] + 1),
    "fn": "tests.jobs:" + "f" * LIMITS["fn"],
    "prefix": "p" * (LIMITS["prefix"] + 1),
    "fn_pickle": b"\x80" * (LIMITS["fn_pickle"] + 1),
    "wid": "w" * (LIMITS["wid"] + 1),
    "input_hash": "h" * (LIMITS["input_hash"] + 1),
    # error: clipped on read, not refused (tests/queue/test_error_caps.py); inline args and
    # results: bounded on read by the record's size only (0.3.0 kept them up to spill_bytes)
    "journal": {"attempt": 0, "frames": 0, "ended": False, **{f"x{i}": 0 for i in range(9)}},
}


@pytest.mark.parametrize("field", sorted(OVERSIZE))
def test_a_record_with_an_oversize_field_is_refused_when_read(field: str) -> None:
    q = make_plane(MemoryStore())
    inv = keys.new_id()
    data = msgpack.packb(handmade(q, inv, **{field: OVERSIZE[field]}), use_bin_type=True)
    with pytest.raises(RecordError, match=field):
        Record.from_bytes(data)


def test_a_record_of_0_3_0_with_a_large_inline_argument_still_runs(atomic_store: Store) -> None:
    q = make_plane(atomic_store)
    inv = keys.new_id()
    # inline, as 0.3.0 with spill_bytes=2 MiB wrote it
    big = codec.encode((("x" * (LIMITS["blob.inline"] + 10),), {}))
    rec = handmade(q, inv, fn="tests.jobs:length", args={"inline": big})
    put_by_hand(q, inv, msgpack.packb(rec, use_bin_type=True))
    dls.run_worker(q, isolation="thread", once=True, allow=["tests.jobs:*"])
    assert q.result(inv, timeout=5) == LIMITS["blob.inline"] + 10


def test_a_queued_record_with_an_oversize_key_is_failed_and_good_work_runs(
    atomic_store: Store,
) -> None:
    q = make_plane(atomic_store)
    inv = keys.new_id()
    put_by_hand(q, inv, msgpack.packb(handmade(q, inv, key="k" * 5000), use_bin_type=True))
    good = q.udf(jobs.add_one).submit(1)
    dls.run_worker(q, isolation="thread", idle_exit=0.3, max_poll_s=0.05)
    assert q.result(good, timeout=5) == 2
    rec = q.get(inv)
    assert rec.state == "failed" and rec.error is not None
    assert rec.error["type"] == "CorruptRecord" and "over the limit" in rec.error["message"]


# -- topics -------------------------------------------------------------------------------


def _posts(store: Store, ns: str, name: str, seqs: range) -> None:
    """Posts written straight to the store (what many producers would have left)."""
    for seq in seqs:
        body = codec.encode({"post": f"{seq:016x}", "payload": codec.encode(seq)})
        store.put(keys.topic_seq_key(ns, name, seq), encode_segment(0, seq, [(VALUE, body)]))


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> int:
    """A page of 10 keys, so that a topic of a few hundred posts is many pages long."""
    monkeypatch.setattr(topic, "_PAGE", 10, raising=False)
    return 10


def test_a_fresh_handle_posts_without_listing_the_whole_topic(
    atomic_store: Store, small_pages: int, report: list[str]
) -> None:
    _posts(atomic_store, "default", "t", range(300))
    metered = Counting(atomic_store)
    assert Topic(metered, "default", "t").post("new") == 300
    # one page from the start, one or two from near the tail: not the 300 keys of the topic
    assert metered.counts["keys"] <= 3 * small_pages, metered.counts["keys"]
    report.append(
        f"topic post, fresh handle {atomic_store.url[:40]:<40} 300 posts, pages of "
        f"{small_pages}: {metered.counts['keys']} keys listed (0.3.0: 300)"
    )
    assert [f.seq for f in Topic(atomic_store, "default", "t").stream(since=299)] == [299, 300]


@pytest.mark.parametrize(
    "holes",
    [range(0, 120), range(15, 290), range(31, 80), range(10, 299)],
    ids=["trimmed-head", "wide-hole", "hole-on-a-probe", "all-but-ends"],
)
def test_a_fresh_handle_finds_the_true_tail_across_holes(holes: range, small_pages: int) -> None:
    store = MemoryStore()
    _posts(store, "default", "t", range(300))
    for seq in holes:
        store.delete(keys.topic_seq_key("default", "t", seq))
    assert Topic(store, "default", "t").post("new") == 300


def test_q_topic_keeps_one_handle_per_name(small_pages: int) -> None:
    store = Counting(MemoryStore())
    q = make_plane(store)
    assert q.topic("t") is q.topic("t") and q.topic("t") is not q.topic("u")
    _posts(store.inner, q.ns, "t", range(200))
    store.reset()
    for i in range(50):  # the per-call form of the issue: each call used to list it all
        assert q.topic("t").post(i) == 200 + i
    assert store.counts["keys"] <= 3 * small_pages + 50, store.counts["keys"]


def test_threads_sharing_one_handle_get_each_seq_once() -> None:
    q = make_plane(MemoryStore())
    per, threads = 100, 4

    def post(p: int) -> None:
        for i in range(per):
            q.topic("shared").post({"p": p, "i": i})

    workers = [threading.Thread(target=post, args=(p,)) for p in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    frames = list(q.topic("shared").stream())
    assert [f.seq for f in frames] == list(range(per * threads))
    assert len({(f.value["p"], f.value["i"]) for f in frames}) == per * threads


def test_an_oversize_post_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "MAX_FRAME_BYTES", 100)
    q = make_plane(MemoryStore())
    with pytest.raises(dls.InvalidArgument, match="over the frame limit of 100 bytes"):
        q.topic("t").post(b"x" * 200)
    assert list(q.store.list()) == []


# -- streams ------------------------------------------------------------------------------


def test_resuming_far_into_a_journal_fetches_only_the_segments_from_since(
    store: Store, report: list[str]
) -> None:
    metered = Counting(store)
    q = make_plane(metered)
    n = 3000  # at least three segments: a segment holds 1024 frames at most
    inv = q.udf(jobs.count_to).submit(n)
    dls.run_worker(q, once=True, isolation="thread")
    prefix = q.plane.ops("default").keys.journal_prefix(inv, 1)
    segments = [i.key for i in store.list(prefix)]
    assert len(segments) >= 3
    metered.reset()
    assert [f.value for f in q.stream(inv, since=n - 1)] == [n - 1]
    fetched = [k for k, _ in metered.gets if k.startswith(prefix)]
    # the segment holding since (and the END's, when the last flush left it alone)
    assert len(fetched) <= 2 and fetched[-1] == segments[-1], fetched
    report.append(
        f"stream resume {store.url[:40]:<40} since={n - 1}: {len(fetched)} of "
        f"{len(segments)} segments fetched"
    )


def test_segment_and_post_reads_are_bounded(store: Store) -> None:
    metered = Counting(store)
    q = make_plane(metered)
    inv = q.udf(jobs.count_to).submit(3)
    dls.run_worker(q, once=True, isolation="thread")
    t = q.topic("t")
    t.post(1)
    t.close()
    metered.reset()
    assert [f.value for f in q.stream(inv)] == [0, 1, 2]
    assert [f.value for f in t.stream()] == [1]
    assert [f.value for f in t.listen(timeout=0)] == [1]
    reads = [(k, m) for k, m in metered.gets if "/journal/" in k or "/_topics/" in k]
    assert reads and all(m is not None for _, m in reads), reads


def test_an_oversize_segment_is_refused_without_being_fetched() -> None:
    store = MemoryStore()
    prefix = "lakeshore/default/default/x/journal/0001/"
    store.put(prefix + "000000000000", encode_segment(1, 0, [(VALUE, b"\xc0" * 500)]))
    with pytest.raises(CorruptSegment, match="more than any segment"):
        list(read_segments(store, prefix, max_bytes=100))


def test_a_segment_whose_key_names_another_first_seq_is_corrupt() -> None:
    store = MemoryStore()
    prefix = "lakeshore/default/default/x/journal/0001/"
    store.put(prefix + "000000000000", encode_segment(1, 0, [(VALUE, b"\xc0")]))
    store.put(prefix + "000000000001", encode_segment(1, 7, [(VALUE, b"\xc0")]))
    with pytest.raises(CorruptSegment, match="not the 1 its key names"):
        list(read_segments(store, prefix))


def test_a_stream_writer_refuses_an_oversize_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "MAX_FRAME_BYTES", 100)
    store = MemoryStore()
    w = journal.JournalWriter(store, lambda s: f"j/{s:012d}", 1)
    with pytest.raises(dls.InvalidArgument, match="frame limit"):
        w.add(b"x" * 101)
    for _ in range(3):  # 60 + 60 > 100: the writer flushes before the batch grows past it
        w.add(b"y" * 60)
    w.close()
    assert [i.size < 200 for i in store.list("j/")] == [True, True, True]
