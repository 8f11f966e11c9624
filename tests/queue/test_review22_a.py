"""Review of issue 22 (reviewer A): regressions found by trying to break the hardening."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.cli import main
from lakeshore.keys import new_id
from lakeshore.model import lifecycle
from lakeshore.protocol import gc
from lakeshore.protocol.admission import SLOT_REPAIR_AGE_S, acquire_slot
from tests import jobs
from tests.conftest import make_plane
from tests.queue.test_least_privilege import NS, principals  # noqa: F401  (the fixture, by name)

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
    ops = plane.ops("jobs")
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
    ops = q.ops("jobs")
    rec, etag = ops.read(inv)
    ops.cas(lifecycle.cancel(rec, q.store.now(), "its worker died"), etag)  # slot leaked
    real_now = type(q.store).now
    monkeypatch.setattr(type(q.store), "now", lambda s: real_now(s) + SLOT_REPAIR_AGE_S + 5)
    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    code = main(["gc", "--url", url])
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    assert list(q.store.list(ops.keys.slots_prefix)) == [], (out, err)


# -- found, not fixed (design decisions): strict xfails that document them ---------------------


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


def test_a_producer_cannot_trim_a_topic_and_a_worker_can(request: pytest.FixtureRequest) -> None:
    """docs/s3.md: producers post and read topics; trimming deletes posts, a worker's grant."""
    roles = request.getfixturevalue("principals")
    t = roles["producer"].plane().topic("news")
    t.post(1)
    t.post(2)
    with pytest.raises(dls.PermissionDenied):
        t.trim(keep_last=1)
    assert roles["worker"].plane().topic("news").trim(keep_last=1) == 1


def test_the_doctor_runs_with_a_workers_credentials_inside_its_namespace(
    request: pytest.FixtureRequest,
) -> None:
    from lakeshore.doctor import diagnose

    worker = request.getfixturevalue("principals")["worker"]
    assert diagnose(worker.store, threads=2, rounds=1, ns=NS).safe
