"""gc hardening (issue 22): one bad queue never stops gc for the namespace, numbers are
finite where they are set and where they are read, finding the queues does not list what
they hold, and a slow submit's spilled arguments are never collected.

Time is never slept away: expiry is waited for by polling the store's clock with a deadline,
and a slow submit is made slow by an id minted in the past or a fake clock moved forward
inside admission.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from ulid import ULID

import lakeshore as dls
import lakeshore.protocol.gc as gc_module
import lakeshore.submit as sub
from bench.counting import Counting
from lakeshore import codec
from lakeshore.cli import build_parser, main
from lakeshore.keys import QueueKeys, band, id_index, new_id, topic_seq_key, worker_key
from lakeshore.model import lifecycle
from lakeshore.model.queue_config import QueueConfig
from lakeshore.protocol import gc
from lakeshore.protocol.admission import SLOT_REPAIR_AGE_S, acquire_slot
from lakeshore.protocol.gc import collect, parse_age
from lakeshore.protocol.steps import ORPHAN_GRACE_S
from lakeshore.store import LocalStore, MemoryStore, PutMode, Store
from lakeshore.store.base import OVERWRITE
from tests import jobs
from tests.commands import run
from tests.forwarding import Forwarding
from tests.tiers import make_plane


def finish(q: Any, ids: list[str], queues: list[str]) -> None:
    dls.run_worker(
        q, queues=queues, isolation="thread", max_jobs=len(ids), idle_exit=0.5, max_poll_s=0.02
    )
    for i in ids:
        assert q.status(i) == "succeeded"


def wait_store_clock_past(store: Store, t: float) -> None:
    deadline = time.monotonic() + 10
    while store.now() <= t:
        assert time.monotonic() < deadline, "the store's clock did not move"
        time.sleep(0.01)  # polling a clock we do not control, with a deadline


# -- item 6: one queue never stops gc for the namespace ------------------------------------


def test_gc_skips_a_queue_without_retention_and_still_collects_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    adhoc = q.udf(queue="adhoc")(jobs.add_one).submit(1)  # a first submit: no retention
    q.configure("jobs", result_retention_s=0.01)
    done = [q.udf(queue="jobs")(jobs.add_one).submit(i) for i in range(2)]
    finish(q, [adhoc, *done], ["adhoc", "jobs"])
    wait_store_clock_past(q.store, max(q.get(i).finished_at or 0 for i in done) + 0.01)

    code, out, err = run(capsys, "gc", "--yes", "--url", url)
    assert code == 0, err
    assert "adhoc: skipped (no retention" in out
    assert "jobs: removed 2 invocation(s)" in out
    for i in done:
        with pytest.raises(dls.NotFound):
            q.get(i)
    assert q.status(adhoc) == "succeeded"  # kept: it has no retention


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_gc_reports_a_hostile_queue_record_and_collects_the_other_queues(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: float
) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    evil = q.udf(queue="evil")(jobs.add_one).submit(1)
    done = [q.udf(queue="zeta")(jobs.add_one).submit(i) for i in range(2)]
    finish(q, [evil, *done], ["evil", "zeta"])
    # anyone who can write the queue's folder can write this: a retention gc cannot use
    hostile = msgpack.packb({"result_retention_s": bad, "rev": 3, "wid": "x", "v": 1})
    q.store.put(QueueKeys("default", "evil").queue_record, hostile)

    code, out, err = run(capsys, "gc", "--older-than", "0s", "--yes", "--url", url)
    assert code == 2  # something failed, and the exit code says so
    assert "zeta: removed 2 invocation(s)" in out
    [line] = [ln for ln in err.splitlines() if "evil" in ln]
    assert line.startswith("lakeshore: ") and " — " in line
    assert q.status(evil) == "succeeded"  # its retention is unknown: left alone
    for i in done:
        with pytest.raises(dls.NotFound):
            q.get(i)


def test_non_finite_retention_is_refused_where_it_is_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    q = make_plane(MemoryStore())
    for bad in (math.inf, math.nan):
        for name in ("result_retention_s", "timeout_s", "lease_s", "deadline_cutoff_s"):
            with pytest.raises(dls.InvalidArgument, match="finite"):
                q.configure("jobs", **{name: bad})
        with pytest.raises(dls.InvalidArgument, match="finite"):
            q.configure("jobs", retry_backoff_s=bad)
        with pytest.raises(dls.InvalidArgument):
            QueueConfig(result_retention_s=bad)
        with pytest.raises(dls.InvalidArgument, match="finite"):
            dls.Dispatch(":memory:", lease_s=bad)
        with pytest.raises(dls.InvalidArgument, match="finite"):
            dls.Dispatch(":memory:", retry_backoff_s=bad)
        with pytest.raises(dls.InvalidArgument, match="finite"):
            q.udf(jobs.add_one).submit(1, _timeout_s=bad)
        with pytest.raises(dls.InvalidArgument, match="finite"):
            q.udf(jobs.add_one).submit(1, _deadline_s=bad)
    url = f"file://{tmp_path}/plane"
    for text in ("inf", "nan", "1e400"):
        code, _, err = run(
            capsys, "queue", "set", "jobs", f"result_retention_s={text}", "--create", "--url", url
        )
        assert code == 2 and "finite" in err, err


@pytest.mark.parametrize("age", ["nan", "inf", "1e400", "nand", "-inf"])
def test_gc_older_than_that_is_not_finite_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], age: str
) -> None:
    with pytest.raises(dls.InvalidArgument, match="not an age"):
        parse_age(age)
    url = f"file://{tmp_path}/plane"
    dls.Dispatch(url).udf(jobs.add_one).submit(1)
    code, _, err = run(capsys, "gc", f"--older-than={age}", "--yes", "--url", url)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "not an age" in lines[0] and " — " in lines[0]


def test_gc_with_a_retention_longer_than_the_epoch_removes_nothing_and_does_not_crash() -> None:
    q = make_plane(MemoryStore())
    inv = q.udf(jobs.add_one).submit(1)
    finish(q, [inv], ["default"])
    report = collect(q.plane.ops("default"), q.plane.settings, 1e300, q.store.now())
    assert report.expired == [] and q.status(inv) == "succeeded"
    with pytest.raises(dls.InvalidArgument, match="finite"):
        collect(q.plane.ops("default"), q.plane.settings, math.nan, q.store.now())


def test_cli_float_options_refuse_nan_and_inf() -> None:
    parser = build_parser()
    inv = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    for argv in (
        ["wait", inv, "--timeout", "nan"],
        ["result", inv, "--timeout", "inf"],
        ["tail", inv, "--timeout", "1e400"],
        ["logs", inv, "--follow", "--timeout", "nan"],
        ["worker", "--idle-exit", "nan"],
        ["worker", "--lease", "inf"],
        ["worker", "--grace", "nan"],
        ["worker", "--max-poll", "inf"],
    ):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 2, argv


# -- item 8, third bullet: finding the queues does not list what they hold ----------------


def test_queue_names_skips_over_every_folder_on_every_store(store: Store) -> None:
    ns = "default"
    names = ["a", "a-b", "a.b", "a0", "a0b", "b", "jobs"]
    for name in names:
        keys = QueueKeys(ns, name)
        store.put(keys.queue_record, QueueConfig().to_bytes())
        store.put(keys.record("01ARZ3NDEKTSV4RRFFQ69G5FAV"), b"x")
    for seq in range(30):
        store.put(topic_seq_key(ns, "news", seq), b"post")
    store.put(id_index(ns, "01ARZ3NDEKTSV4RRFFQ69G5FAV"), b"a")
    store.put(worker_key(ns, "w1"), b"life")
    store.put(f"lakeshore/{ns}/stray-object", b"not a folder")
    counting = Counting(store)
    # in the store's listing order, which for these names differs between S3 and SeaweedFS
    assert sorted(gc_module.queue_names(counting, ns)) == sorted(names)
    # one key per folder (7 queues, _ids, _topics, _workers) and the stray object
    assert counting.counts["keys"] == len(names) + 4


def test_gc_finds_the_queues_without_listing_a_long_topic(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    report: list[str],
) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    inv = q.udf(jobs.add_one).submit(1)
    finish(q, [inv], ["default"])
    listed = {"keys": 0}
    real_list = LocalStore.list

    def counting_list(self: LocalStore, prefix: str = "", start_after: Any = None) -> Any:
        for info in real_list(self, prefix, start_after):
            listed["keys"] += 1
            yield info

    counts = {}
    for posts in (0, 1500):
        for seq in range(posts):
            q.store.put(topic_seq_key("default", "news", seq), b"post")
        monkeypatch.setattr(LocalStore, "list", counting_list)
        listed["keys"] = 0
        code, _, err = run(capsys, "gc", "--older-than", "1d", "--yes", "--url", url)
        monkeypatch.setattr(LocalStore, "list", real_list)
        assert code == 0, err
        counts[posts] = listed["keys"]
    assert counts[1500] == counts[0] + 1  # one more folder (_topics), not 1500 more keys
    assert counts[1500] < 20
    report.append(
        f"gc beside a topic: {counts[0]} keys listed with 0 posts, {counts[1500]} with 1500 posts"
    )


# -- item 10: a slow submit's spilled arguments are never collected -----------------------


class GcBeforeTicket(Forwarding):
    """Runs gc right before the submit's ticket write: the submit has written its spilled
    arguments and is about to publish."""

    def __init__(self, inner: Store, gc: Any) -> None:
        super().__init__(inner)
        self.gc = gc
        self.reports: list[Any] = []

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        if "/_tickets/" in key and not self.reports:
            self.reports.append(self.gc())
        return self.inner.put(key, data, mode)


def _gc_before_each_ticket(inner: Store) -> tuple[Any, GcBeforeTicket]:
    """A plane (spilling all but tiny arguments) whose store runs gc right before a submit
    writes its ticket: the moment a folder exists without a ticket or a record."""
    holder: dict[str, Any] = {}

    def gc() -> Any:
        q = holder["q"]
        return collect(q.plane.ops("default"), q.plane.settings, 0.0, q.store.now() + 1.0)

    store = GcBeforeTicket(inner, gc)
    holder["q"] = make_plane(store, spill_bytes=64)
    return holder["q"], store


def test_gc_leaves_alone_the_spilled_arguments_of_a_submit_whose_id_is_old(
    atomic_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the id was minted before an admission wait of two orphan graces (it can block 60 s)
    old = str(ULID.from_timestamp(atomic_store.now() - 2 * ORPHAN_GRACE_S))
    old_id = old[:-1] + band(5)  # made for the default priority, as new_id(5) makes ids
    monkeypatch.setattr(sub, "new_id", lambda priority, at=None: old_id)
    q, store = _gc_before_each_ticket(atomic_store)
    inv = q.udf(jobs.size_of).submit(b"z" * 1000)  # spilled: its folder exists before its ticket
    assert inv == old_id
    [report] = store.reports
    assert report.orphans == [] and report.objects == []
    assert q.status(inv) == "queued"  # published, not fenced out
    finish(q, [inv], ["default"])
    assert q.result(inv) == 1000  # and its arguments are still there


class FakeClockMemory(MemoryStore):
    """A memory store whose clock (``now`` and every object's write time) moves by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.t = time.time()  # ids are minted from the machine's clock: start beside it
        self._clock = lambda: self.t


def test_gc_leaves_alone_a_submit_that_waited_in_admission_past_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inner = FakeClockMemory()
    q, store = _gc_before_each_ticket(inner)
    q.configure("default", max_depth=10)  # admission runs
    real_admit = sub.admit

    def slow_admit(*args: Any, **kwargs: Any) -> Any:
        inner.t += 2 * ORPHAN_GRACE_S  # the queue was full this long
        return real_admit(*args, **kwargs)

    monkeypatch.setattr(sub, "admit", slow_admit)
    inv = q.udf(jobs.size_of).submit(b"z" * 1000)
    [report] = store.reports
    assert report.orphans == [] and report.objects == []
    assert q.status(inv) == "queued"
    assert q.store.get(q.plane.ops("default").keys.args(inv))[0]  # its spilled arguments


def test_gc_still_sweeps_a_folder_whose_newest_object_is_old(atomic_store: Store) -> None:
    q = make_plane(atomic_store)
    ops = q.plane.ops("default")
    crashed = "01ARZ3NDEKTSV4RRFFQ69G5FAV"  # 2016: a submit that died long ago
    q.store.put(ops.keys.args(crashed), codec.encode(((b"o",), {})))
    now = q.store.now()
    assert collect(ops, q.plane.settings, 0.0, now).orphans == []  # written just now: in flight
    report = collect(ops, q.plane.settings, 0.0, now + 2 * ORPHAN_GRACE_S)
    assert report.orphans == [crashed]
    assert q.get(crashed).error["type"] == "SubmitAbandoned"  # type: ignore[index]
    with pytest.raises(dls.NotFound):
        q.store.get(ops.keys.args(crashed))


# -- gc's queue discovery ends, whatever keys a writer of the namespace put in a folder -------


@pytest.mark.parametrize("odd", ["\U0001f600", "\ufffd", "\ufffdz", "\uffff"])
def test_queue_names_ends_with_a_key_sorting_past_its_cursor(store: Any, odd: str) -> None:
    """Anyone who may write the namespace (a producer) can put a key under a queue folder
    whose name sorts after the U+FFFD cursor (an emoji: UTF-8 F0 > EF): queue_names then
    listed the same folder again for ever, and `lakeshore gc` never returned."""
    store.put("lakeshore/default/jobs/01JD2K7Q000000000000000000/record", b"x")
    store.put(f"lakeshore/default/jobs/{odd}", b"x")
    store.put("lakeshore/default/later/01JD2K7Q000000000000000000/record", b"x")
    found = list(itertools.islice(gc.queue_names(store, "default"), 20))
    assert sorted(found) == ["jobs", "later"]


# -- the slot sweep never fences a submit that just took a slot -------------------------------


def test_a_slot_retaken_between_the_listing_and_the_read_is_not_fenced(
    atomic_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc (or a worker's repair) lists the slots, then reads each one's holder. A leaked
    slot that is freed and taken by a new submit in between names the new submit, whose
    record is not written yet (it is milliseconds old): it was judged by the listed slot's
    age and fenced, so a healthy submit failed as 'too slow'. The read must be of the
    version that was listed."""
    plane = make_plane(atomic_store)
    plane.configure("jobs", max_depth=1)
    ops = plane.plane.ops("jobs")
    ended = plane.udf(jobs.add_one, queue="jobs").submit(1)
    rec, etag = ops.read(ended)
    ops.cas(lifecycle.cancel(rec, atomic_store.now(), "its worker died"), etag)  # slot leaked
    slot = ops.keys.slot(0)
    fresh = new_id()
    real_get = atomic_store.get
    done: list[bool] = []

    def get(key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        if key == slot and not done:
            done.append(True)
            atomic_store.delete(slot)  # the dead worker's slot freed meanwhile (a repair)...
            assert acquire_slot(ops, fresh, 1) is not None  # ...and retaken
        return real_get(key, max_bytes)

    monkeypatch.setattr(atomic_store, "get", get)
    later = atomic_store.now() + SLOT_REPAIR_AGE_S + 1
    assert gc.free_leaked_slots(ops, later) == []
    monkeypatch.undo()
    assert done
    with pytest.raises(dls.NotFound):
        ops.read(fresh)  # no tombstone: the submit that holds the slot can still publish
    assert [
        atomic_store.get(i.key)[0].split(b" ")[0].decode()
        for i in atomic_store.list(ops.keys.slots_prefix)
    ] == [fresh]


# -- an interactive gc frees the leaked slots its plan shows -----------------------------------


class _Terminal:
    """A stdin that is a terminal, with the answer the person typed."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        return self.answer


def test_interactive_gc_frees_a_leaked_slot_it_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc sweeps leaked admission slots; asked at a terminal, its plan showed the slot ('would
    remove 0 invocation(s), 1 object(s)') and then said 'nothing to delete' and left the
    max_depth queue full, though `gc --yes` frees it."""
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    q.configure("jobs", max_depth=1, result_retention_s=3600)
    inv = q.udf(jobs.add_one, queue="jobs").submit(1)
    ops = q.plane.ops("jobs")
    rec, etag = ops.read(inv)
    ops.cas(lifecycle.cancel(rec, q.store.now(), "its worker died"), etag)  # slot leaked
    real_now = type(q.store).now
    monkeypatch.setattr(type(q.store), "now", lambda s: real_now(s) + SLOT_REPAIR_AGE_S + 5)
    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    code = main(["gc", "--url", url])
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    assert list(q.store.list(ops.keys.slots_prefix)) == [], (out, err)


# -- a queue gc emptied -------------------------------------------------------------------------


def test_a_queue_emptied_by_gc_reads_as_empty_and_set_asks_for_create(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Submits no longer write `_queue`, so a queue gc has emptied has no objects left: the
    commands that only read show it empty with a note; `queue set` asks for --create, as it
    does for a typo, since nothing tells the two apart."""
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    inv = q.udf(jobs.add_one, queue="jobs").submit(1)
    dls.run_worker(
        q,
        queues=["jobs"],
        isolation="thread",
        idle_exit=0.3,
        max_poll_s=0.02,
        allow=["tests.jobs:*"],
    )
    assert q.result(inv) == 2
    assert main(["gc", "--older-than", "0", "--yes", "--url", url]) == 0
    capsys.readouterr()
    for command in (["status", "jobs"], ["ls", "jobs"], ["queue", "show", "jobs"]):
        assert main([*command, "--url", url]) == 0, command
        assert "queue 'jobs' in namespace 'default' has no invocations" in capsys.readouterr().err
    assert main(["gc", "-q", "jobs", "--older-than", "0", "--yes", "--url", url]) == 0
    assert main(["queue", "set", "jobs", "max_depth=5", "--url", url]) == 2
    assert "--create" in capsys.readouterr().err
    assert main(["queue", "set", "jobs", "max_depth=5", "--create", "--url", url]) == 0
