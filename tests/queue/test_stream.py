"""Streams: generator yields as a durable, resumable journal, read by id from any process."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from tests import jobs
from tests.tiers import make_plane


def _serve(q: Any, **kw: Any) -> threading.Thread:
    t = threading.Thread(target=dls.run_worker, args=(q,), kwargs=kw, daemon=True)
    t.start()
    return t


def test_stream_snippet(q: Any) -> None:
    gen = q.udf(jobs.count_to)  # the one binding line
    inv = gen.submit(5)
    cursor = 2
    seen = []
    dls.run_worker(q, once=True)
    # -- the snippet, as written in the spec ------------------------------------------------
    for frame in q.stream(inv, since=cursor):
        ...
        seen.append((frame.seq, frame.value, frame.attempt))
    # ---------------------------------------------------------------------------------------
    assert seen == [(2, 2, 1), (3, 3, 1), (4, 4, 1)]
    assert q.result(inv) == [0, 1, 2, 3, 4]  # result and stream agree


def test_live_frames_before_the_body_ends(q: Any, tmp_path: Path) -> None:
    """The first yield is visible while the body still runs (age-based flush), without
    timing anything: the body waits until the reader has seen it."""
    flag = tmp_path / "seen"
    inv = q.udf(jobs.hold_after_first).submit(str(flag))
    worker = _serve(q, once=True)
    frames = []
    for frame in q.stream(inv, timeout=60):
        frames.append(frame.value)
        if frame.value == "first":
            flag.write_text("reader saw it")
    worker.join(30)
    assert frames == ["first", "second"]


def test_fast_generator_batches_frames(atomic_plane: Any, report: list[str]) -> None:
    q = atomic_plane
    n = 10_000
    inv = q.udf(jobs.count_to).submit(n)
    reader_out: list[int] = []
    reader = threading.Thread(target=lambda: reader_out.extend(f.value for f in q.stream(inv)))
    reader.start()  # reads live while the body runs
    dls.run_worker(q, once=True)
    reader.join(120)
    assert reader_out == list(range(n))
    segments = list(q.store.list(q.plane.ops("default").keys.journal_prefix(inv, 1)))
    assert len(segments) <= n // 50, f"{len(segments)} PUTs for {n} frames"
    report.append(f"stream {q.store.url[:40]:<40} {n} frames in {len(segments)} segments")
    assert q.get(inv).journal == {"attempt": 1, "frames": n + 1, "ended": True}  # + END


def test_resume_after_disconnect(q: Any) -> None:
    n = 1_000
    inv = q.udf(jobs.count_to).submit(n)
    dls.run_worker(q, once=True)
    cut = random.Random(7).randrange(1, n - 1)
    first_part = []
    for frame in q.stream(inv):
        first_part.append(frame.seq)
        if frame.seq == cut:
            break  # the reader drops off
    rest = [f.seq for f in q.stream(inv, since=first_part[-1] + 1)]
    assert first_part + rest == list(range(n))


def test_two_live_readers_both_get_everything(atomic_plane: Any) -> None:
    q = atomic_plane
    n = 3_000
    inv = q.udf(jobs.count_to).submit(n)
    outs: list[list[int]] = [[], []]
    readers = [
        threading.Thread(target=lambda out=out: out.extend(f.value for f in q.stream(inv)))
        for out in outs
    ]
    for r in readers:
        r.start()
    dls.run_worker(q, once=True)
    for r in readers:
        r.join(120)
    assert outs[0] == outs[1] == list(range(n))


def test_retry_replaces_a_failed_attempts_frames(q: Any, tmp_path: Path) -> None:
    inv = q.udf(jobs.flaky_stream).submit(str(tmp_path / "m"), 40)
    frames: list[Any] = []
    reader = threading.Thread(target=lambda: frames.extend(q.stream(inv, timeout=60)))
    reader.start()
    dls.run_worker(q, max_jobs=2, idle_exit=10)
    reader.join(60)
    assert not reader.is_alive()
    final = [f for f in frames if f.attempt == 2]
    assert [f.value for f in final] == list(range(40))  # complete, and no error raised
    assert all(f.attempt in (1, 2) for f in frames)
    assert [f.value for f in q.stream(inv)] == list(range(40))  # later readers: attempt 2 only
    assert q.result(inv) == list(range(40))


def test_failed_stream_raises_after_its_frames(q: Any) -> None:
    inv = q.udf(jobs.bad_stream, max_attempts=1).submit(3)
    dls.run_worker(q, once=True)
    got = []
    with pytest.raises(dls.Failed, match="stream broke"):
        for frame in q.stream(inv):
            got.append(frame.value)
    assert got == [0, 1, 2]
    with pytest.raises(dls.Failed):
        q.result(inv)


def test_stream_waits_with_a_timeout_and_of_plain_bodies(q: Any) -> None:
    inv = q.udf(jobs.count_to).submit(3)
    with pytest.raises(dls.NotFinished) as err:
        list(q.stream(inv, timeout=0.05))
    assert err.value.since == 0
    plain = q.udf(jobs.add_one).submit(1)
    dls.run_worker(q, max_jobs=2, idle_exit=5)
    assert list(q.stream(plain)) == []
    with pytest.raises(dls.InvalidArgument):
        q.stream(inv, since=-1)


def test_stream_in_a_child_process_body(tmp_path: Path) -> None:
    q = make_plane(dls.open_store(f"file://{tmp_path}/p"))
    inv = q.udf(jobs.count_to).submit(500)
    assert dls.run_worker(q, once=True, isolation="process") == 1
    assert [f.value for f in q.stream(inv)] == list(range(500))


def test_reader_in_another_process(atomic_store: Any) -> None:
    """A 10,000-yield generator read live by a process that never saw the submit."""
    import os

    store = atomic_store
    if store.url == ":memory:":
        pytest.skip("a memory store lives in one process; the thread readers above cover it")
    q = make_plane(store)
    url, env = store.url, None
    if url.startswith("s3://"):
        url = f"{url}?endpoint_url={store.client.meta.endpoint_url}"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "lakeshore-test", "AWS_SECRET_ACCESS_KEY": "x"}
    n = 10_000
    inv = q.udf(jobs.count_to).submit(n)
    code = (
        "import lakeshore as dls, sys;"
        "q = dls.Dispatch(sys.argv[1]);"
        "vals = [f.value for f in q.stream(sys.argv[2], timeout=120)];"
        "print(len(vals), vals == list(range(int(sys.argv[3]))))"
    )
    reader = subprocess.Popen(
        [sys.executable, "-c", code, url, inv, str(n)], stdout=subprocess.PIPE, text=True, env=env
    )
    dls.run_worker(q, once=True)
    out, _ = reader.communicate(timeout=180)
    assert out.split() == [str(n), "True"]


def test_async_stream(plane: Any) -> None:
    import asyncio

    q = plane
    inv = q.udf(jobs.async_count).submit(4)
    dls.run_worker(q, once=True)

    async def read() -> list[int]:
        return [f.value async for f in q.astream(inv, since=1)]

    assert asyncio.run(read()) == [1, 2, 3]


def test_resume_with_a_cursor_of_a_replaced_attempt(q: Any, tmp_path: Path) -> None:
    inv = q.udf(jobs.flaky_stream).submit(str(tmp_path / "m"), 10)
    dls.run_worker(q, max_jobs=2, idle_exit=10)
    assert q.get(inv).attempt == 2
    # A reader that stopped at seq 4 of attempt 1 resumes: attempt 2 replaced those frames.
    assert [f.seq for f in q.stream(inv, since=5, attempt=1)] == list(range(10))
    assert [f.seq for f in q.stream(inv, since=5, attempt=2)] == list(range(5, 10))


def test_unsendable_yield_fails_without_retry(plane: Any) -> None:
    inv = plane.udf(jobs.yields_a_lock).submit()
    dls.run_worker(plane, once=True)
    with pytest.raises(dls.Failed, match="UnsendableValue"):
        plane.result(inv)
    rec = plane.get(inv)
    assert rec.attempt == 1 and rec.journal == {"attempt": 1, "frames": 2, "ended": True}


def test_a_yield_over_the_frame_cap_fails_without_retry(
    plane: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lakeshore.streams import journal

    monkeypatch.setattr(journal, "MAX_FRAME_BYTES", 1000)  # read at call time, in this process
    inv = plane.udf(jobs.yields_padding).submit(3, 2000)
    dls.run_worker(plane, once=True, isolation="thread")
    with pytest.raises(dls.Failed, match=r"UnsendableValue.*frame limit of 1000"):
        plane.result(inv, timeout=10)  # a retried attempt would leave it queued
    assert plane.get(inv).attempt == 1


def test_plain_failure_writes_no_journal(plane: Any) -> None:
    inv = plane.udf(jobs.fail_always, max_attempts=1).submit("x")
    dls.run_worker(plane, once=True)
    assert plane.get(inv).journal is None
    assert list(plane.store.list(plane.plane.ops("default").keys.journal_prefix(inv, 1))) == []
