"""Every attempt's logs are read, not only the last one's (issue 31, finding 9).

Each attempt writes its log under its own folder, and seqs count from 0 in each: a reader
of every attempt's logs used to pass over an attempt's last segment when the next folder's
first segment named seq 0, so a job that ran three attempts showed one attempt's lines.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.cli import main
from lakeshore.running.logs import log_writer, read_logs
from lakeshore.store import MemoryStore
from lakeshore.streams.journal import JournalWriter, read_segments
from tests.tiers import make_plane


def prints_then_fails_twice(marker: str) -> str:
    """Prints one line per attempt; the first two attempts fail."""
    path = Path(marker)
    n = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(n))
    print(f"line of attempt {n}")
    if n < 3:
        raise RuntimeError(f"attempt {n} fails on purpose")
    return "done"


EXPECTED = "line of attempt 1\nline of attempt 2\nline of attempt 3\n"


def _ran_three_attempts(q: Any, tmp_path: Path) -> str:
    f = q.udf(prints_then_fails_twice)
    inv = f.submit(str(tmp_path / "marker"), _max_attempts=3)
    stop = threading.Event()
    worker = threading.Thread(
        target=dls.run_worker,
        args=(q,),
        kwargs={"stop": stop, "isolation": "thread", "max_poll_s": 0.05},
    )
    worker.start()
    try:
        assert q.result(inv, timeout=60) == "done"
    finally:
        stop.set()
        worker.join(30)
    assert q.get(inv).attempt == 3
    return str(inv)


@pytest.fixture
def plane(url: str) -> Any:
    return dls.Dispatch(url, retry_backoff_s=0.01)


def test_logs_of_a_job_that_ran_three_attempts_hold_every_attempt_in_order(
    plane: Any, tmp_path: Path
) -> None:
    inv = _ran_three_attempts(plane, tmp_path)
    assert plane.logs(inv) == EXPECTED
    assert plane.logs(inv, attempt=2) == "line of attempt 2\n"
    assert "".join(plane.follow_logs(inv, timeout=30)) == EXPECTED


def test_the_logs_command_prints_every_attempt(
    plane: Any, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = _ran_three_attempts(plane, tmp_path)
    capsys.readouterr()
    assert main(["logs", inv, "--url", url]) == 0
    assert capsys.readouterr().out == EXPECTED
    assert main(["logs", inv, "--follow", "--url", url]) == 0
    assert capsys.readouterr().out == EXPECTED


def test_a_listing_over_several_attempts_reads_each_attempts_last_segment() -> None:
    store = MemoryStore()
    plane = make_plane(store)
    keys = plane.plane.ops("jobs").keys
    inv = "01J0000000000000000000000A"
    for attempt, chunks in ((1, ["a1 ", "b1 "]), (2, ["a2 "]), (3, ["a3 ", "b3"])):
        writer: JournalWriter = log_writer(store, keys, inv, attempt)
        writer.flush_frames = 1  # one segment per chunk: seqs 0, 1, ... in each folder
        for chunk in chunks:
            writer.add(codec.encode(chunk))
        writer.close()
    texts = [(att, text) for _key, att, text in read_logs(store, keys, inv)]
    assert texts == [(1, "a1 "), (1, "b1 "), (2, "a2 "), (3, "a3 "), (3, "b3")]
    # within one attempt's folder, segments wholly before ``since`` are still passed over
    firsts = [
        first for _k, _a, first, _f in read_segments(store, keys.logs_prefix(inv, 3), since=1)
    ]
    assert firsts == [1]
