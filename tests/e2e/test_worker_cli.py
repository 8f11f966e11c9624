"""`lakeshore worker` as a program: concurrency, signals and lease release, --idle-exit,
lifecycle hooks, per-attempt logs read from another process, and its status line."""

from __future__ import annotations

import io
import os
import pty
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import lakeshore as dls
from lakeshore.cli.progress import StatusLine
from tests import jobs
from tests.commands import env_for, lakeshore_cmd, worker_cmd
from tests.waiting import alive, poll


def test_worker_with_concurrency_drains_200_jobs(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    f = q.udf(jobs.add_one)
    ids = [f.submit(i) for i in range(200)]
    out = subprocess.run(
        worker_cmd("--concurrency", "4", "--idle-exit", "1", "--max-poll", "0.1"),
        env=env_for(url),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert [q.result(i, timeout=5) for i in ids] == [i + 1 for i in range(200)]
    assert out.stderr.count("-> succeeded") == 200  # one log line per invocation
    attempts = Counter(q.get(i).attempt for i in ids)
    assert attempts == {1: 200}  # nothing ran twice


def test_sigterm_releases_the_lease_without_counting_an_attempt(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    gate = tmp_path / "gate"
    q = dls.Dispatch(url, lease_s=30)
    inv = q.udf(jobs.wait_for_file).submit(str(gate), _max_attempts=1)
    worker = subprocess.Popen(
        worker_cmd("--grace", "0.5", "--max-poll", "0.1"),
        env=env_for(url),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        poll(lambda: q.status(inv) == "running", what="invocation running")
        t0 = time.monotonic()
        # like scancel or Ctrl-C: the whole process group, body processes included
        os.killpg(worker.pid, signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
        stopped_in = time.monotonic() - t0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, err[-2000:]
    rec = q.get(inv)
    # queued again at once (not after the 30 s lease), no failed attempt on the books
    assert rec.state == "queued" and rec.attempt == 1 and rec.released == 1
    assert rec.error is None and rec.not_before <= q.store.now()
    assert stopped_in < 20, stopped_in
    assert "released" in err
    # another worker finishes it, although max_attempts was 1
    gate.write_text("go")
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    assert q.result(inv, timeout=30) == "done"
    assert q.get(inv).attempt == 2


def test_idle_exit_on_an_empty_queue_exits_zero(tmp_path: Path) -> None:
    t0 = time.monotonic()
    out = subprocess.run(
        worker_cmd("--idle-exit", "0.5"),
        env=env_for(f"file://{tmp_path}/plane"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 60
    assert "worker done: 0 attempt(s)" in out.stderr


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_hooks_run_the_documented_number_of_times(tmp_path: Path, isolation: str) -> None:
    url = f"file://{tmp_path}/plane"
    hooks = tmp_path / "hooks.log"
    q = dls.Dispatch(url)
    ids = [q.udf(jobs.note_pid).submit(i) for i in range(6)]
    out = subprocess.run(
        worker_cmd(
            "--concurrency",
            "2",
            "--isolation",
            isolation,
            "--idle-exit",
            "1",
            "--max-poll",
            "0.1",
            "--on-start",
            "tests.jobs:hook_start",
            "--before-job",
            "tests.jobs:hook_before",
            "--on-stop",
            "tests.jobs:hook_stop",
        ),
        env=env_for(url, LAKESHORE_TEST_HOOKS=str(hooks)),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert [q.result(i, timeout=5) for i in ids] == list(range(6))
    lines = [ln.split() for ln in hooks.read_text().splitlines()]
    starts = Counter(pid for kind, pid, *_ in lines if kind == "start")
    stops = Counter(pid for kind, pid, *_ in lines if kind == "stop")
    job_pids = {pid for kind, pid, *_ in lines if kind == "job"}
    before = [rest[0] for kind, _pid, *rest in lines if kind == "before"]
    # on_start: once per process that ran bodies, before its first invocation
    assert set(starts) == job_pids and set(starts.values()) == {1}
    if isolation == "thread":
        assert len(job_pids) == 1  # the worker process itself
    assert sorted(before) == sorted(ids)  # before_job: once per job
    assert stops == starts  # on_stop: once per process, at an orderly exit
    for pid in job_pids:  # order within each process: start, jobs, stop
        mine = [kind for kind, p, *_ in lines if p == pid]
        assert mine[0] == "start" and mine[-1] == "stop"


def test_a_failing_on_start_stops_the_worker_clearly(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    inv = q.udf(jobs.add_one).submit(1)
    out = subprocess.run(
        worker_cmd("--on-start", "tests.jobs:hook_start_fails", "--idle-exit", "5"),
        env=env_for(url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "model weights missing" in out.stderr.splitlines()[-1]
    rec = q.get(inv)
    assert rec.state == "queued" and rec.released == 1  # handed back untouched


def test_the_line_of_an_attempt_that_raised_says_why(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url, retry_backoff_s=0.05)
    f = q.udf(jobs.fail_always)
    bad = f.submit("bad input 3", _max_attempts=2)
    # a message may quote a submitter's input: a newline in it must not make a log line of
    # its own, nor a control character reach the operator's terminal; a long one is cut
    fake = "2026-01-01 00:00:00,000 INFO lakeshore.worker: tests.jobs:f 01J attempt 1 -> succeeded"
    hostile = f.submit(f"x\n{fake}\x1b[2K", _max_attempts=1)
    long = f.submit("y" * 1000, _max_attempts=1)
    out = subprocess.run(
        worker_cmd("--idle-exit", "1", "--max-poll", "0.1"),
        env=env_for(url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert [q.status(i) for i in (bad, hostile, long)] == ["failed"] * 3
    lines = out.stderr.splitlines()

    def outcome(inv: str, attempt: int) -> str:
        found = [ln for ln in lines if f" {inv} attempt {attempt} -> " in ln]
        assert len(found) == 1, out.stderr
        return found[0].split(f" {inv} attempt {attempt} -> ", 1)[1]

    retry = r"queued in \d+\.\d{3}s \(retry in \d+\.\ds; 1 of 2 attempts used\)"
    assert re.fullmatch(rf"{retry}: ValueError: bad input 3", outcome(bad, 1)), out.stderr
    assert re.fullmatch(r"failed in \d+\.\d{3}s: ValueError: bad input 3", outcome(bad, 2))
    assert outcome(hostile, 1).endswith(f"s: ValueError: x\\x0a{fake}\\x1b[2K")
    assert not any(ln.startswith(fake[:10]) for ln in lines) and "\x1b" not in out.stderr
    assert outcome(long, 1).endswith("s: ValueError: " + "y" * 187 + "…")  # 200 characters


def test_logs_of_a_printing_body_from_another_process(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    f = q.udf(jobs.chatty)
    a, b = f.submit(1), f.submit(2)
    out = subprocess.run(
        worker_cmd("--concurrency", "2", "--idle-exit", "1", "--max-poll", "0.1"),
        env=env_for(url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    reader = subprocess.run(
        lakeshore_cmd("logs", a), env=env_for(url), capture_output=True, text=True, timeout=60
    )
    assert reader.returncode == 0, reader.stderr
    assert "hello from the body, n=1" in reader.stdout
    assert "to stderr" in reader.stdout
    assert "WARNING tests.chatty: a warning with n=1" in reader.stdout
    assert "n=2" not in reader.stdout  # each attempt has its own log
    assert "n=2" in q.logs(b) and "hello from the body" not in out.stdout


def test_logs_in_thread_isolation_do_not_mix(tmp_path: Path) -> None:
    q = dls.Dispatch(f"file://{tmp_path}/plane")
    f = q.udf(jobs.chatty)
    ids = [f.submit(i) for i in range(8)]
    dls.run_worker(q, concurrency=4, isolation="thread", idle_exit=0.5, max_poll_s=0.05)
    for n, inv in enumerate(ids):
        text = q.logs(inv)
        assert f"n={n}\n" in text
        assert not any(f"n={m}\n" in text for m in range(8) if m != n)


def test_follow_logs_ends_when_the_job_does(tmp_path: Path) -> None:
    q = dls.Dispatch(f"file://{tmp_path}/plane")
    inv = q.udf(jobs.chatty).submit(7)
    stop = threading.Event()
    t = threading.Thread(
        target=dls.run_worker, args=(q,), kwargs={"stop": stop, "isolation": "thread"}
    )
    t.start()
    try:
        text = "".join(q.follow_logs(inv, timeout=60))
    finally:
        stop.set()
        t.join(30)
    assert "n=7" in text and q.status(inv) == "succeeded"


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url, lease_s=30)
    inv = q.udf(jobs.pid_after_file).submit(str(tmp_path / "never"))
    worker = subprocess.Popen(
        worker_cmd("--grace", "60", "--max-poll", "0.1"),
        env=env_for(url),
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert worker.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(worker.stderr.readline, "")))
    reader.start()
    try:
        poll(lambda: q.status(inv) == "running", what="invocation running")
        pidfile = tmp_path / "never.pid"
        body_pid = int(poll(lambda: pidfile.exists() and pidfile.read_text(), what="body pid"))
        worker.send_signal(signal.SIGTERM)
        poll(lambda: any("no new claims" in ln for ln in lines), what="first signal handled")
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    finally:
        if worker.poll() is None:
            worker.kill()
        reader.join(10)
        worker.wait(30)
        worker.stderr.close()
    err = "".join(lines)
    assert worker.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "second signal" in err
    rec = q.get(inv)
    assert rec.state == "running" and rec.released == 0  # left to its lease, as documented
    # the body's process did not outlive the worker as an orphan
    poll(lambda: not alive(body_pid), timeout=10, what="the body's process gone")


# -- the status line ---------------------------------------------------------------------

LOG_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) lakeshore\.worker: \S.*"
)
STATUS = re.compile(
    r"worker: (\d+) running, (\d+) attempts? done: (\d+) succeeded, (\d+) failed"
    r"(?:, (\d+) retried)? *"
)
SUMMARY = "worker: 5 attempts done: 3 succeeded, 1 failed, 1 retried"


def _mixed_run(tmp_path: Path, *flags: str) -> str:
    """3 invocations that succeed, 1 that fails twice (retried once): the worker's stderr."""
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url, retry_backoff_s=0.05)
    ids = [q.udf(jobs.add_one).submit(i) for i in range(3)]
    ids.append(q.udf(jobs.fail_always).submit("bad input", _max_attempts=2))
    out = subprocess.run(
        worker_cmd("--idle-exit", "1", "--max-poll", "0.1", *flags),
        env=env_for(url),
        capture_output=True,  # bytes: text mode would turn each \r into a newline
        timeout=120,
    )
    err = out.stderr.decode()
    assert out.returncode == 0, err[-2000:]
    assert [q.status(i) for i in ids] == ["succeeded"] * 3 + ["failed"]
    return err


@pytest.mark.parametrize("flags", [(), ("--no-progress",)])
def test_a_log_file_or_pipe_gets_log_lines_only(tmp_path: Path, flags: tuple[str, ...]) -> None:
    err = _mixed_run(tmp_path, *flags)
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert all(LOG_LINE.fullmatch(ln) for ln in lines), err
    assert sum("-> succeeded in" in ln for ln in lines) == 3
    assert sum("-> queued in" in ln for ln in lines) == 1
    assert sum("-> failed in" in ln for ln in lines) == 1
    assert "attempts done" not in err


def test_progress_forced_shows_the_counts_and_keeps_log_lines_whole(tmp_path: Path) -> None:
    err = _mixed_run(tmp_path, "--progress")
    pieces = err.split("\n")
    assert pieces[-1] == ""  # the summary ends with a newline: the shell prompt goes below
    assert pieces[-2].rsplit("\r", 1)[1] == SUMMARY
    logs, statuses = [], []
    for piece in pieces[:-2]:
        # a line the terminal shows: status draws and blanks, each after a \r, then the
        # log line that was written after the last blank
        *drawn, written = piece.split("\r")
        logs.append(written)
        for text in drawn:
            assert not text.strip() or STATUS.fullmatch(text), repr(piece)
            statuses += [STATUS.fullmatch(text)] if text.strip() else []
    assert all(LOG_LINE.fullmatch(ln) for ln in logs), err
    assert sum("-> succeeded in" in ln for ln in logs) == 3
    assert sum("-> queued in" in ln for ln in logs) == 1
    assert sum("-> failed in" in ln for ln in logs) == 1
    assert statuses, err  # the worker idled for a second: the line was drawn meanwhile
    counted = 0
    for m in statuses:  # every line drawn adds up, and counts only go up
        running, done, ok, failed, retried = (int(g or 0) for g in m.groups())
        assert running <= 1 and done == ok + failed + retried and done >= counted
        counted = done


@pytest.mark.parametrize("flags", [(), ("--no-progress",)])
def test_on_a_terminal_the_status_line_shows_what_runs(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    url = f"file://{tmp_path}/plane"
    gate = tmp_path / "gate"
    q = dls.Dispatch(url)
    inv = q.udf(jobs.wait_for_file).submit(str(gate))
    main, sub = pty.openpty()  # stderr a terminal: the status line is on unless refused
    worker = subprocess.Popen(
        worker_cmd("--max-jobs", "1", "--max-poll", "0.1", *flags),
        env=env_for(url),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=sub,
    )
    os.close(sub)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(main, 4096)
            except OSError:  # EIO: every process holding the terminal has closed it
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()

    def shown() -> str:
        # the terminal turns each \n into \r\n: back to what the worker wrote
        return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")

    try:
        if flags:
            poll(lambda: q.status(inv) == "running", what="invocation running")
        else:
            poll(lambda: "worker: 1 running, 0 attempts done" in shown(), what="1 running")
        gate.write_text("go")
        assert worker.wait(60) == 0, shown()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(30)
        reader.join(30)
        os.close(main)
    text = shown()
    assert q.status(inv) == "succeeded"
    assert "-> succeeded in" in text
    if flags:
        assert "\r" not in text and "attempt done" not in text, text
    else:
        assert text.endswith("\rworker: 1 attempt done: 1 succeeded, 0 failed\n"), text


def test_the_status_line_changes_at_most_once_per_interval_and_steps_aside() -> None:
    now = [0.0]
    text = ["one"]
    out = io.StringIO()
    line = StatusLine(out, lambda: text[0], interval=0.25, clock=lambda: now[0])
    line.refresh()
    assert out.getvalue() == "\rone"
    text[0], now[0] = "three", 0.2
    line.refresh()
    assert out.getvalue() == "\rone"  # changed, but too soon
    now[0] = 0.25
    line.refresh()
    assert out.getvalue() == "\rone\rthree"
    now[0] = 1.0
    line.refresh()
    assert out.getvalue() == "\rone\rthree"  # unchanged: nothing written
    text[0] = "two"
    with line.cleared():  # a log line: blanked first, drawn again after, as it was
        out.write("a log line\n")
    assert out.getvalue() == "\rone\rthree\r     \ra log line\n\rthree"
    line.refresh()  # the new text, now that an interval passed; padded over the longer one
    assert out.getvalue().endswith("a log line\n\rthree\rtwo  ")
    text[0] = "x" * 200  # wider than the terminal (80 columns when it does not say)
    now[0] = 2.0
    line.refresh()
    assert out.getvalue().endswith("\r" + "x" * 79)
    line.close("the end")
    assert out.getvalue().endswith("\r" + "x" * 79 + "\r" + " " * 79 + "\rthe end\n")
    size = len(out.getvalue())
    now[0] = 10.0
    line.refresh()
    with line.cleared():
        out.write("after\n")
    assert out.getvalue()[size:] == "after\n"  # closed: log lines alone


def test_the_options_table_lists_every_flag_of_the_worker() -> None:
    """docs/workers.md#options says it has every flag of `lakeshore worker`."""
    import argparse

    from lakeshore.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    worker = sub.choices["worker"]
    docs = Path(__file__).resolve().parents[2] / "docs" / "workers.md"
    table = docs.read_text().split("## Options", 1)[1].split("\n## ", 1)[0]
    flags = [
        max(a.option_strings, key=len)
        for a in worker._actions
        if a.option_strings and "-h" not in a.option_strings
    ]
    missing = [f for f in flags if f"`{f}" not in table]
    assert missing == []
