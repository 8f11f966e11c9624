"""Topics: many producers, each seq claimed by a create-only write; readers replay or listen."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.store import Store
from tests.tiers import FAKE_CREDS


def test_design_snippet(q: Any) -> None:
    t = q.topic("progress")
    t.post({"step": 1})
    frames = list(t.stream(since=0))
    assert [(f.seq, f.value) for f in frames] == [(0, {"step": 1})]


def _producer_code(url: str) -> str:
    return (
        "import sys, lakeshore as dls;"
        f"t = dls.Dispatch({url!r}).topic('load');"
        "[t.post({'p': sys.argv[1], 'i': i}) for i in range(int(sys.argv[2]))]"
    )


def _check(frames: list[dls.Frame], producers: int, per: int) -> None:
    assert [f.seq for f in frames] == list(range(producers * per))  # each seq once, none skipped
    posted = {(f.value["p"], f.value["i"]) for f in frames}
    assert len(posted) == producers * per  # no frame lost or duplicated
    for p in {f.value["p"] for f in frames}:  # each producer's posts keep their order
        mine = [f.value["i"] for f in frames if f.value["p"] == p]
        assert mine == sorted(mine)


@pytest.mark.slow
def test_many_producer_processes(atomic_store: Store, report: list[str]) -> None:
    store = atomic_store
    producers = 4
    per = 500
    if store.url == ":memory:":
        q = dls.Dispatch(store.url, store=store)
        t = q.topic("load")

        def post(p: str) -> None:
            mine = dls.Dispatch(store.url, store=store).topic("load")
            for i in range(per):
                mine.post({"p": p, "i": i})

        threads = [threading.Thread(target=post, args=(f"t{i}",)) for i in range(producers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
    else:
        url = store.url
        env = None
        if url.startswith("s3://"):
            import os

            endpoint = store.client.meta.endpoint_url  # type: ignore[attr-defined]
            url = f"{url}?endpoint_url={endpoint}"
            env = {
                **os.environ,
                "AWS_ACCESS_KEY_ID": FAKE_CREDS["aws_access_key_id"],
                "AWS_SECRET_ACCESS_KEY": FAKE_CREDS["aws_secret_access_key"],
            }
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _producer_code(url), f"p{i}", str(per)], env=env
            )
            for i in range(producers)
        ]
        for p in procs:
            assert p.wait(600) == 0
        t = dls.Dispatch(store.url, store=store).topic("load")
    frames = list(t.stream())
    _check(frames, producers, per)
    two = [list(t.stream()), list(t.listen(timeout=0.05))]
    assert [f.seq for f in two[0]] == [f.seq for f in two[1]] == list(range(producers * per))
    n = producers * per
    report.append(
        f"topic {store.url[:40]:<40} {producers} producers x {per} posts: 0..{n - 1} once"
    )


def test_close_listen_and_refuse(plane: Any) -> None:
    t = plane.topic("jobs")
    for i in range(3):
        t.post(i)
    got: list[int] = []
    listener = threading.Thread(target=lambda: got.extend(f.value for f in t.listen(since=1)))
    listener.start()
    end_seq = t.close()
    listener.join(30)
    assert not listener.is_alive() and got == [1, 2] and end_seq == 3
    with pytest.raises(dls.TopicClosed):
        t.post(99)
    with pytest.raises(dls.TopicClosed):
        plane.topic("jobs").post(99)  # another handle learns it from the store
    assert [f.value for f in t.stream()] == [0, 1, 2]


def test_listen_times_out_quietly_and_resumes(plane: Any) -> None:
    t = plane.topic("quiet")
    t.post("a")
    assert [f.value for f in t.listen(timeout=0.05)] == ["a"]
    t.post("b")
    assert [f.value for f in t.listen(since=1, timeout=0.05)] == ["b"]


def test_trim_keeps_the_newest_and_the_numbering(plane: Any) -> None:
    t = plane.topic("trimmed")
    for i in range(10):
        t.post(i)
    assert t.trim(keep_last=3) == 7
    assert [f.seq for f in t.stream()] == [7, 8, 9]
    assert t.trim(keep_last=0) == 2  # the newest always stays
    fresh = plane.topic("trimmed")
    assert fresh.post("next") == 10  # numbering survives trimming
    assert [f.seq for f in fresh.stream()] == [9, 10]
    with pytest.raises(dls.InvalidArgument):
        t.trim()
    assert t.trim(older_than_s=3600) == 0


def test_bad_topic_names(plane: Any) -> None:
    with pytest.raises(dls.InvalidArgument):
        plane.topic("Bad Name")


def test_a_post_that_claims_to_be_an_error_is_refused_as_corrupt(q: Any) -> None:
    """Topics end with END and never write ERROR: a post tagged ERROR (a hostile writer) is
    not handed out as if it were a value."""
    from lakeshore import codec
    from lakeshore.keys import topic_seq_key
    from lakeshore.streams.journal import ERROR, encode_segment

    t = q.topic("alerts")
    t.post("first")
    body = codec.encode({"post": "x", "payload": codec.encode("hostile")})
    q.store.put(topic_seq_key(q.ns, "alerts", 1), encode_segment(0, 1, [(ERROR, body)]))
    seen: list[Any] = []
    with pytest.raises(dls.CorruptSegment, match="ERROR frame, which no topic writes"):
        seen.extend(f.value for f in t.stream())
    assert seen == ["first"]
