"""The queue on every tier: submit → claim → run → result, retries, cancel, timeout,
idempotent keys, spill, and bad input that must not stop a worker."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.keys import QueueKeys
from tests import jobs
from tests.tiers import make_plane


def _python_c(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as ``python -c``: a program with no file and no logging set up."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )


_PLUS = (
    "import lakeshore as dls\n"
    "q = dls.Dispatch(':memory:')\n"
    "@q.udf(timeout_s=30)\n"
    "def plus(x):\n"
    "    return x + 1\n"
)


@pytest.fixture
def worker(plane: Any) -> Iterator[threading.Event]:
    """A worker serving the plane in a background thread until the test ends."""
    stop = threading.Event()
    t = threading.Thread(
        target=dls.run_worker, args=(plane,), kwargs={"stop": stop, "max_poll_s": 0.05}, daemon=True
    )
    t.start()
    yield stop
    stop.set()
    t.join(10)


def test_ids_not_futures_snippet(q: Any, worker: threading.Event) -> None:
    f = q.udf(jobs.add_one)  # the one binding line
    # -- the snippet, as written in the spec ------------------------------------------------
    inv = f.submit(x=1)  # -> "01JD2K7Q...": a string, persist it anywhere
    result = q.result(inv)  # poll from this process, or any other, later
    # ---------------------------------------------------------------------------------------
    assert isinstance(inv, str) and len(inv) == 26
    assert result == 2


def test_idempotent_snippet(q: Any) -> None:
    f = q.udf(jobs.add_one)
    inv = f.submit(x=1, _key="nightly-2026-08-06")
    assert f.submit(x=1, _key="nightly-2026-08-06") == inv
    other = q.udf(queue="other")(jobs.echo)
    assert other.submit(x=1, _key="nightly-2026-08-06") != inv  # per namespace + queue
    assert dls.run_worker(q, once=True) == 1
    assert q.result(inv) == 2


def test_running_a_worker_snippet() -> None:
    import dreamlake.lakeshore as dls

    q = dls.Dispatch(":memory:")  # a full plane, in-process
    dls.run_worker(q, once=True)  # drain exactly one invocation and return
    f = q.udf(jobs.add_one)
    inv = f.submit(41)
    assert dls.run_worker(q, once=True) == 1
    assert q.result(inv) == 42


def test_four_body_kinds(q: Any) -> None:
    fs = [
        q.udf(jobs.add_one),
        q.udf(jobs.squares),
        q.udf(jobs.async_double),
        q.udf(jobs.async_count),
    ]
    assert [f.kind for f in fs] == ["sync", "generator", "async", "asyncgen"]
    ids = [fs[0].submit(1), fs[1].submit(3), fs[2].submit(21), fs[3].submit(4)]
    assert dls.run_worker(q, max_jobs=4, idle_exit=5) == 4
    assert [q.result(i) for i in ids] == [2, [(0, 0), (1, 1), (2, 4)], 42, [0, 1, 2, 3]]
    assert fs[0](5) == 6  # a plain call runs locally


def test_values_survive_the_trip(q: Any) -> None:
    e = q.udf(jobs.echo)
    inv = e.submit((1, 2), b"\x00\xff", key=None, nested={"t": (3, [4])})
    dls.run_worker(q, once=True)
    assert q.result(inv) == {
        "args": ((1, 2), b"\x00\xff"),
        "kwargs": {"key": None, "nested": {"t": (3, [4])}},
    }


def test_unsendable_argument_fails_at_submit(plane: Any) -> None:
    f = plane.udf(jobs.echo)
    with pytest.raises(dls.InvalidArgument, match="cannot send"):
        f.submit(threading.Lock())
    assert list(plane.plane.ops("default").tickets()) == []  # nothing was enqueued


def test_failure_retries_then_reports_remote_error(q: Any) -> None:
    bad = q.udf(jobs.fail_always, max_attempts=2)
    inv = bad.submit("boom 7")
    assert dls.run_worker(q, max_jobs=2, idle_exit=5) == 2
    with pytest.raises(dls.Failed) as err:
        q.result(inv)
    e = err.value
    assert (e.state, e.remote_type, e.remote_message) == ("failed", "ValueError", "boom 7")
    assert "fail_always" in e.remote_traceback and "raise ValueError" in e.remote_traceback
    rec = q.get(inv)
    assert (rec.attempt, rec.state) == (2, "failed")
    assert q.status(inv) == "failed"


def test_retry_succeeds_and_per_submit_attempts(q: Any, tmp_path: Path) -> None:
    flaky = q.udf(jobs.fail_until)
    inv = flaky.submit(str(tmp_path / "n"), 1)
    dls.run_worker(q, max_jobs=2, idle_exit=5)
    assert q.result(inv) == "ok after 2" and q.get(inv).attempt == 2
    once = flaky.submit(str(tmp_path / "m"), 1, _max_attempts=1)
    dls.run_worker(q, max_jobs=1, idle_exit=5)
    with pytest.raises(dls.Failed):
        q.result(once)


def test_result_timeout_is_a_timeout_error(plane: Any) -> None:
    inv = plane.udf(jobs.add_one).submit(1)
    with pytest.raises(dls.NotFinished) as err:
        plane.result(inv, timeout=0.05)
    assert isinstance(err.value, TimeoutError) and err.value.state == "queued"


def test_cancel_queued(q: Any) -> None:
    inv = q.udf(jobs.add_one).submit(1)
    assert q.cancel(inv) is True
    assert q.cancel(inv) is False
    assert dls.run_worker(q, once=True) == 0  # never starts
    with pytest.raises(dls.Killed):
        q.result(inv)


def test_unknown_function_and_lookup_errors(q: Any) -> None:
    with pytest.raises(dls.NotFound):
        q.result(dls.keys_new_id() if hasattr(dls, "keys_new_id") else "01ARZ3NDEKTSV4RRFFQ69G5FAV")
    with pytest.raises(dls.InvalidArgument):
        q.status("not-an-id")
    ghost = q.udf(jobs.add_one)
    inv = ghost.submit(1)
    ops = q.plane.ops("default")
    rec, etag = ops.read(inv)
    ops.cas(rec.next_write(fn="tests.nowhere:gone"), etag)
    ok = ghost.submit(2)
    assert dls.run_worker(q, max_jobs=2, idle_exit=5) == 2  # the worker keeps serving
    with pytest.raises(dls.Failed, match="not a declared body"):
        q.result(inv)
    assert q.get(inv).attempt == 1  # not retried: it would fail the same way
    assert q.result(ok) == 3
    # allowed but missing: the worker tried to import it, and says so
    again = ghost.submit(3)
    rec, etag = ops.read(again)
    ops.cas(rec.next_write(fn="tests.nowhere:gone"), etag)
    assert dls.run_worker(q, once=True, allow=["tests.nowhere:*"]) == 1
    with pytest.raises(dls.Failed, match="cannot load the function"):
        q.result(again)
    assert q.get(again).attempt == 1


def test_corrupt_record_is_failed_and_skipped(q: Any) -> None:
    f = q.udf(jobs.add_one)
    bad, good = f.submit(1), f.submit(2)
    q.store.put(QueueKeys(q.ns, "default").record(bad), b"\xc1 not a record")
    assert dls.run_worker(q, idle_exit=0.3) == 1  # one attempt ran; the corrupt one never starts
    assert q.result(good) == 3
    with pytest.raises(dls.Failed, match="CorruptRecord"):
        q.result(bad)


def test_spill_large_arguments_and_results(q: Any) -> None:
    n = 20 * 1024 * 1024
    measure, make = q.udf(jobs.size_of), q.udf(jobs.big)
    a, b = measure.submit(b"a" * n), make.submit(n)
    rec = q.get(a)
    assert rec.args.ref is not None and rec.args.size > n  # spilled, not inline
    dls.run_worker(q, max_jobs=2, idle_exit=5)
    assert q.result(a) == n
    assert q.result(b) == b"r" * n
    assert q.get(b).result.ref.endswith("/result-0001")  # type: ignore[union-attr]


def test_tampered_spill_is_refused(q: Any) -> None:
    inv = q.udf(jobs.big).submit(200_000)
    dls.run_worker(q, once=True)
    ref = q.get(inv).result.ref  # type: ignore[union-attr]
    q.store.put(ref, codec.encode(b"x" * 200_000))
    with pytest.raises(dls.StoreError, match="does not match its size and sha256"):
        q.result(inv)


def test_key_repair_after_a_crash_between_key_and_record(q: Any) -> None:
    f = q.udf(jobs.add_one)
    ops = q.plane.ops("default")
    orphan = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    q.store.put(ops.keys.idem("k1"), codec.encode({"id": orphan, "input_hash": "?"}))
    repaired = f.submit(1, _key="k1")  # the key moves to a new invocation
    assert repaired != orphan and q.status(repaired) == "queued"
    assert q.get(orphan).error["type"] == "SubmitAbandoned"  # type: ignore[index]
    assert f.submit(1, _key="k1") == repaired  # the key names the new one from now on
    dls.run_worker(q, once=True)
    assert q.result(repaired) == 2


def test_deadline_passes_while_queued(q: Any) -> None:
    inv = q.udf(jobs.add_one).submit(1, _deadline_s=0.05)
    ops = q.plane.ops("default")
    deadline = time.monotonic() + 10
    while q.store.now() <= q.get(inv).deadline_at and time.monotonic() < deadline:
        time.sleep(0.02)  # waiting out the deadline itself is the point of this test
    assert dls.run_worker(q, once=True) == 0
    with pytest.raises(dls.TimedOut, match="deadline"):
        q.result(inv)
    assert list(ops.tickets()) == []


def test_result_from_a_process_that_never_saw_the_submit(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    inv = q.udf(queue="elsewhere")(jobs.add_one).submit(99)
    code = (
        "import lakeshore as dls, sys;"
        f"q = dls.Dispatch({url!r});"
        "dls.run_worker(q, queues=['elsewhere'], once=True, allow=['tests.jobs:add_one']);"
        f"print(q.result({inv!r}, timeout=30))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "100"


def test_pickled_callables_need_both_sides(plane: Any, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    trusting = make_plane(plane.store, allow_pickle=True)
    if not plane.plane.in_process:  # a worker elsewhere could not find a lambda: refused at submit
        with pytest.raises(dls.InvalidArgument, match=r"no importable name.*allow_pickle=True"):
            plane.udf(lambda x: x).submit(1)

    def nested(x: int) -> int:
        canary.write_text("ran")
        return x * 3

    f = trusting.udf(nested)
    assert f.pickled() is not None
    refused = f.submit(1)
    # A worker that did not opt in never unpickles: the canary stays untouched.
    assert dls.run_worker(plane, once=True) == 1
    with pytest.raises(dls.Failed, match="does not accept"):
        plane.result(refused, timeout=10)
    assert not canary.exists()
    accepted = f.submit(2)
    assert dls.run_worker(trusting, once=True) == 1
    assert trusting.result(accepted) == 6 and canary.exists()


def test_pickled_callable_in_a_child_process(tmp_path: Path) -> None:
    q = make_plane(dls.open_store(f"file://{tmp_path}/p"), allow_pickle=True)
    factor = 7
    inv = q.udf(lambda x: x * factor).submit(6)
    assert dls.run_worker(q, once=True, isolation="process") == 1
    assert q.result(inv) == 42


def test_async_mirrors(plane: Any) -> None:
    import asyncio

    f = plane.udf(jobs.add_one)
    inv = f.submit(1)

    async def main() -> tuple[str, Any, str, bool]:
        before = await plane.astatus(inv)
        await asyncio.to_thread(dls.run_worker, plane, once=True)
        value = await plane.aresult(inv, timeout=10)
        rec = await plane.aget(inv)
        return before, value, rec.state, await plane.acancel(inv)

    assert asyncio.run(main()) == ("queued", 2, "succeeded", False)


def test_one_worker_takes_priority_then_fifo(plane: Any) -> None:
    f = plane.udf(jobs.note)
    tag = f"{id(plane)}-"
    for i in range(5):
        f.submit(f"{tag}{i}")
    f.submit(f"{tag}urgent", _priority=9)
    f.submit(f"{tag}later", _priority=0)
    jobs.ORDER.clear()
    assert dls.run_worker(plane, max_jobs=7, idle_exit=5) == 7
    assert [f"{tag}{x}" for x in ["urgent", "0", "1", "2", "3", "4", "later"]] == jobs.ORDER
    with pytest.raises(dls.InvalidArgument, match="priority"):
        f.submit("x", _priority=10)


def test_default_plane_and_module_level_udf(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import lakeshore.dispatch

    monkeypatch.setattr(lakeshore.dispatch, "_default", None)
    monkeypatch.delenv("LAKESHORE_URL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dls.Dispatch().store.url == f"file://{tmp_path}/.lakeshore"  # the embedded default
    monkeypatch.setenv("LAKESHORE_URL", f"file://{tmp_path}/shared")
    g = dls.udf(queue="default")(jobs.add_one)  # bound to the default plane, lazily
    inv = g.submit(4)
    plane = dls.default_plane()
    assert plane.store.url == f"file://{tmp_path}/shared"
    assert dls.run_worker(plane, once=True) == 1
    assert dls.Dispatch().result(inv) == 5  # any plane on the same store reads it


def test_a_worker_says_what_it_serves_and_once_that_it_waits(tmp_path: Path) -> None:
    """From a plain script (no logging set up) a worker is not silent: one line on what it
    serves, one when it first finds nothing, however many polls follow."""
    url = f"file://{tmp_path}/store"
    out = _python_c(
        "import lakeshore as dls\n"
        f"print(dls.run_worker(dls.Dispatch({url!r}), idle_exit=1.0, isolation='thread'))\n"
    )
    assert out.stdout.strip() == "0"
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith("lakeshore: worker ") and f"on {url} namespace default" in lines[0]
    assert "queues default, concurrency 1, isolation thread" in lines[0]
    assert "nothing to claim now, waiting; leaves after 1 s without work" in lines[1]


def test_where_logging_is_set_up_the_worker_logs_instead(
    q: Any, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level("INFO", logger="lakeshore.worker"):
        assert dls.run_worker(q, once=True, isolation="thread") == 0
    said = [r.getMessage() for r in caplog.records if r.name == "lakeshore.worker"]
    assert any("queues default, concurrency 1" in m for m in said), said
    assert sum(m.endswith(": nothing to claim") for m in said) == 1, said
    assert "lakeshore: worker" not in capsys.readouterr().err


def test_nested_functions_and_lambdas_run_on_a_memory_plane_in_one_process() -> None:
    """A test or a notebook cell declares bodies where it stands: on a ":memory:" plane
    every worker is in this process and finds them in the plane's registry."""
    q = dls.Dispatch(":memory:")
    made = []
    for factor in (2, 3):  # one qualname, two closures: each keeps its own name

        @q.udf
        def scale(x: int, factor: int = factor) -> int:
            return x * factor

        made.append(scale)
    double, triple = made
    square = q.udf(lambda x: x * x, timeout_s=30)  # a timeout would mean a child: not here
    ids = [double.submit(5), triple.submit(5), square.submit(4)]
    assert double.ref != triple.ref
    assert dls.run_worker(q, max_jobs=3, idle_exit=0, isolation="process") == 3
    assert [q.result(i, timeout=30) for i in ids] == [10, 15, 16]
    # a plane that did not declare it (here on the same store) never finds it by its name
    stranger = make_plane(q.store)
    inv = double.submit(1)
    assert dls.run_worker(stranger, once=True, isolation="thread") == 1
    with pytest.raises(dls.Failed) as failed:
        q.result(inv, timeout=30)
    assert failed.value.details["remote_type"] == "UnknownFunction"
    assert "only the plane that declared it" in failed.value.details["remote_message"]


def test_a_function_only_this_process_knows_is_refused_where_workers_are_elsewhere(
    tmp_path: Path,
) -> None:
    q = dls.Dispatch(f"file://{tmp_path}/store")
    f = q.udf(lambda x: x + 1)
    assert f(1) == 2  # a local call needs no worker
    with pytest.raises(dls.InvalidArgument) as refused:
        f.submit(1)
    said = str(refused.value)
    assert "no importable name" in said and "define it at module level" in said
    assert "allow_pickle=True" in said and "lakeshore-queue[pickle]" in said
    assert not any("/_tickets/" in o.key for o in q.store.list("")), "nothing was submitted"
    with pytest.raises(dls.InvalidArgument, match="no importable name"):
        f.map([1, 2])


def test_a_worker_stays_audible_after_a_body_ran_in_its_thread(tmp_path: Path) -> None:
    """Capturing a body's logging adds a handler to the root logger: it must not count as
    logging set up, or a second worker of the script would say nothing."""
    out = _python_c(
        "import lakeshore as dls\n"
        "q = dls.Dispatch(':memory:')\n"
        "f = q.udf(lambda x: x)\n"
        "f.submit(1)\n"
        "dls.run_worker(q, idle_exit=0.2, isolation='thread')\n"
        "dls.run_worker(q, idle_exit=0.2, isolation='thread')\n"
    )
    said = out.stderr.splitlines()
    assert sum(" on :memory: namespace default: queues default" in s for s in said) == 2, said
    assert sum("nothing to claim now, waiting" in s for s in said) == 2, said


def test_a_function_of_a_script_without_a_file_runs_in_a_thread(tmp_path: Path) -> None:
    """python -c, a REPL, a notebook: a body process could not import __main__'s functions,
    so they run in the worker's thread (a timeout cannot stop them there: it says so)."""
    out = _python_c(
        _PLUS
        + "inv = plus.submit(1)\n"
        + "print(dls.run_worker(q, once=True), q.result(inv, timeout=30))\n"
    )
    assert out.stdout.split() == ["1", "2"]
    assert "runs in a thread of the worker" in out.stderr and "cannot stop" in out.stderr


def test_a_record_s_function_name_reaches_the_log_inert(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = dls.Dispatch(":memory:")
    f = q.udf(jobs.add_one)
    hostile = "\x1b]0;PWNED\x07\x1b[2J\rmod:fn"
    inv = f.submit(1)
    ops = q.plane.ops("default")
    rec, etag = ops.read(inv)
    import dataclasses

    ops.cas(dataclasses.replace(rec, fn=hostile), etag)  # a producer with write access
    with caplog.at_level("DEBUG", logger="lakeshore.worker"):
        dls.run_worker(q, once=True, isolation="thread")
    lines = [r.getMessage() for r in caplog.records if r.name == "lakeshore.worker"]
    assert any("attempt 1 -> failed" in ln for ln in lines), lines
    assert not any(c in ln for ln in lines for c in "\x1b\x07\r"), lines


def test_local_only_names_are_random_not_object_ids() -> None:
    q = dls.Dispatch(":memory:")
    a, b = (q.udf(lambda x: x) for _ in range(2))
    suffixes = [u.ref.rsplit("#", 1)[1] for u in (a, b)]
    assert suffixes[0] != suffixes[1] and all(len(s) == 16 for s in suffixes)
    assert all(int(s, 16) != id(u) for s, u in zip(suffixes, (a, b), strict=True))


def test_a_process_worker_with_on_start_refuses_what_only_its_thread_could_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its on_start runs only in body processes: a body moved to its thread would miss it."""
    monkeypatch.setenv("LAKESHORE_TEST_HOOKS", str(tmp_path / "hooks"))
    q = dls.Dispatch(":memory:")
    f = q.udf(lambda x: x)
    inv = f.submit(1)
    assert dls.run_worker(q, once=True, isolation="process", on_start=jobs.hook_start) == 1
    with pytest.raises(dls.Failed) as failed:
        q.result(inv, timeout=30)
    said = failed.value.details["remote_message"]
    assert "on_start hook runs only there" in said and 'isolation="auto"' in said
    assert q.get(inv).attempt == 1, "not retried: it would fail the same way"


def test_warnings_still_show_after_a_body_s_logging_was_captured(tmp_path: Path) -> None:
    out = _python_c(
        _PLUS
        + "ids = [plus.submit(i) for i in range(3)]\n"
        + "print(dls.run_worker(q, max_jobs=3, idle_exit=0))\n"
    )
    assert out.stdout.strip() == "3"
    assert out.stderr.count("runs in a thread of the worker") == 3, out.stderr
