"""Body processes in process isolation: forked from a fork server that has imported
lakeshore, yet starting as a spawned child would, with the worker's environment of now."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from pathlib import Path

import pytest

import lakeshore as dls
from lakeshore.store import MemoryStore
from tests import import_probe, jobs
from tests.tiers import make_plane
from tests.waiting import alive, poll

PROBE = "LAKESHORE_TEST_BODY_ENV"


def _run_one(q: dls.Dispatch, fn: object, *args: object) -> object:
    inv = q.udf(fn).submit(*args)
    assert dls.run_worker(q, once=True, isolation="process") == 1
    return q.result(inv, timeout=30)


def test_a_body_process_sees_the_environment_the_worker_has_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q = make_plane(MemoryStore())
    monkeypatch.delenv(PROBE, raising=False)
    assert _run_one(q, jobs.env_of, PROBE) is None  # the fork server runs from here on
    monkeypatch.setenv(PROBE, "set after the server started")
    assert _run_one(q, jobs.env_of, PROBE) == "set after the server started"
    monkeypatch.delenv(PROBE)
    assert _run_one(q, jobs.env_of, PROBE) is None


@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(), reason="spawned here")
def test_body_processes_are_forked_from_a_server_not_started_by_the_worker_itself() -> None:
    q = make_plane(MemoryStore())
    first, second = _run_one(q, jobs.parent_pid), _run_one(q, jobs.parent_pid)
    assert first == second != os.getpid()  # one server, which the worker started


def _worker_in_thread(q: dls.Dispatch, stop: threading.Event) -> threading.Thread:
    t = threading.Thread(
        target=dls.run_worker,
        args=(q,),
        kwargs={"isolation": "process", "stop": stop, "max_poll_s": 0.05, "grace_s": 0},
        daemon=True,
    )
    t.start()
    return t


@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(), reason="spawned here")
def test_a_group_sigterm_leaves_the_fork_server_and_its_running_body_alone(
    tmp_path: Path,
) -> None:
    from multiprocessing import forkserver

    q = make_plane(MemoryStore(), max_attempts=3)
    gate = tmp_path / "gate"
    inv = q.udf(jobs.pid_after_file).submit(str(gate))
    stop = threading.Event()
    t = _worker_in_thread(q, stop)
    try:
        pidfile = Path(f"{gate}.pid")
        body = int(poll(lambda: pidfile.exists() and pidfile.read_text(), what="body started"))
        server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        assert server is not None and server != os.getpid()
        os.kill(server, signal.SIGTERM)  # what a SIGTERM for the worker's group does to it
        os.kill(server, signal.SIGHUP)
        # the server went on: it forks the next child, and the body runs to its end
        assert forkserver._forkserver._forkserver_alive_fd is not None  # type: ignore[attr-defined]
        assert alive(server) and alive(body)
        gate.write_text("go")
        assert q.result(inv, timeout=30) == body
        assert q.get(inv).attempt == 1  # ran once, no retry beside it
    finally:
        gate.write_text("go")
        stop.set()
        t.join(60)


@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(), reason="spawned here")
def test_a_body_whose_fork_server_was_killed_is_killed_and_its_attempt_handed_back(
    tmp_path: Path,
) -> None:
    from multiprocessing import forkserver

    q = make_plane(MemoryStore(), max_attempts=3)
    gate = tmp_path / "gate"
    inv = q.udf(jobs.pid_after_file).submit(str(gate))
    stop = threading.Event()
    t = _worker_in_thread(q, stop)
    first = 0
    try:
        pidfile = Path(f"{gate}.pid")
        first = int(poll(lambda: pidfile.exists() and pidfile.read_text(), what="body started"))
        server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        os.kill(server, signal.SIGKILL)
        # the orphaned body is killed, not left to run beside its retry
        poll(lambda: not alive(first), timeout=30, what="the orphaned body killed")
        second = int(poll(lambda: pidfile.read_text() != str(first) and pidfile.read_text()))
        assert second != first and not alive(first)
        gate.write_text("go")
        assert q.result(inv, timeout=30) == second
        # handed back, not counted as a failure: no error on the record
        rec = q.get(inv)
        assert rec.state == "succeeded" and rec.error is None
    finally:
        gate.write_text("go")
        stop.set()
        t.join(60)
        if first and alive(first):
            os.kill(first, signal.SIGKILL)  # the body this test started


# A worker process of its own: which fork server it gets depends on how that process started,
# not on the pytest process these tests run in (whose server may already be running).
@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(), reason="spawned here")
def test_the_command_lines_worker_forks_its_fork_server_before_it_imports_anything(
    tmp_path: Path,
) -> None:
    import json
    import subprocess
    import sys

    url, held = f"file://{tmp_path}/store", tmp_path / "held-by-the-imported-module"
    root = Path(__file__).parents[2]
    env = {**os.environ, "LAKESHORE_URL": url, "PYTHONPATH": str(root)}
    env[import_probe.HELD] = str(held)
    inv = dls.Dispatch(url).udf(import_probe.where).submit()
    probe = ["--import", "tests.import_probe", "--allow", "tests.import_probe:*"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lakeshore",
            "worker",
            *probe,
            "--max-jobs",
            "1",
            "--isolation",
            "process",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(dls.Dispatch(url).result(inv, timeout=30))
    # the server is a fork of the worker (its command line), not a new interpreter
    assert seen["forked"] and seen["server_parent"] == seen["worker"] != seen["server"]
    # forked before the --import modules: the body imported its module itself, and the
    # server holds nothing a module of the worker opened
    assert seen["imported_in"] == seen["body"]
    assert str(held) not in seen["server_fds"] and len(seen["server_fds"]) < 12
    poll(lambda: not alive(seen["server"]), timeout=30, what="the server ends with its worker")


_SERVER_OF = """
import os, sys
from multiprocessing import forkserver
import lakeshore as dls
from tests import import_probe, jobs
q = dls.Dispatch(sys.argv[1])
inv = q.udf(jobs.parent_pid).submit()
print("written before the worker started")  # stdout is a pipe: this waits in a buffer
assert dls.run_worker(q, once=True, isolation="process") == 1
server = forkserver._forkserver._forkserver_pid
with open(f"/proc/{server}/cmdline", "rb") as f:
    cmdline = f.read()
print("server", server, q.result(inv, timeout=30), b"multiprocessing.forkserver" in cmdline)
"""


@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(), reason="spawned here")
def test_a_worker_started_from_python_gets_the_stdlibs_fork_server(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _SERVER_OF, f"file://{tmp_path}/store"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).parents[2],
    ).stdout
    assert out.count("written before the worker started") == 1, out
    _, server, body_parent, stdlib = out.splitlines()[-1].split()
    # a process of an application: what it holds is not this package's to hand to bodies
    assert body_parent == server and stdlib == "True"
    poll(lambda: not alive(int(server)), timeout=30, what="the server ends with its worker")


_LONG_TMPDIR = """
import sys
import lakeshore as dls
from tests import jobs
q = dls.Dispatch(sys.argv[1])
inv = q.udf(jobs.add_one).submit(1)
assert dls.run_worker(q, once=True, isolation="process") == 1
print(q.result(inv, timeout=30))
"""


@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(), reason="spawned here")
@pytest.mark.parametrize("started_by", ["command line", "python"])
def test_body_processes_start_under_a_tmpdir_too_long_for_a_socket(
    tmp_path: Path, started_by: str
) -> None:
    """A SLURM job's TMPDIR can be long (a per-job folder under a deep scratch path), and an
    AF_UNIX socket path holds 107 bytes: multiprocessing's fork server could not bind its
    socket below it, so no body process started and every attempt was handed back."""
    import subprocess
    import sys

    tmpdir = tmp_path / ("t" * 60) / ("d" * 40)
    tmpdir.mkdir(parents=True)
    assert len(str(tmpdir)) > 107 - len("/pymp-xxxxxxxx/listener-xxxxxxxx")
    url, root = f"file://{tmp_path}/store", Path(__file__).parents[2]
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(root), "LAKESHORE_URL": url}
    if started_by == "python":
        argv = ["-c", _LONG_TMPDIR, url]
    else:
        inv = dls.Dispatch(url).udf(jobs.add_one).submit(1)
        argv = ["-m", "lakeshore", "worker", "--allow", "tests.jobs:*", "--max-jobs", "1"]
    out = subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120, cwd=root
    )
    assert out.returncode == 0, out.stderr
    if started_by == "python":
        assert out.stdout.splitlines()[-1] == "2", out.stdout
    else:
        assert "-> succeeded" in out.stderr, out.stderr
        assert dls.Dispatch(url).result(inv, timeout=10) == 2
