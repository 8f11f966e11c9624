"""Every example in examples/ runs, at least in a smoke form."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

import lakeshore as dls
from lakeshore.keys import QueueKeys
from tests.tiers import record_key
from tests.waiting import poll

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ULID_LINE = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}\n")


def _env(url: str, path: Path | None = None) -> dict[str, str]:
    """This environment with the store URL set and ``path`` importable (for workers)."""
    env = {**os.environ, "LAKESHORE_URL": url}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH")) if p)
    return env


def _worker(ns: str, module: str, *options: str) -> list[str]:
    """``lakeshore worker`` for a smoke test: bodies in threads, quick polls."""
    command = [sys.executable, "-m", "lakeshore", "worker", "--ns", ns, "--import", module]
    command += ["--allow", f"{module}:*"]  # the examples' bodies are plain functions
    return [*command, "--isolation", "thread", "--max-poll", "0.1", *options]


def _run(args: list[str], env: dict[str, str], timeout: float = 60) -> str:
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_data_pipeline_example(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/data_pipeline.py"), "--url", f"file://{tmp_path}"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    assert "pipeline done" in out.stdout
    assert out.stdout.count("published report/") == 5  # four station pages and the index
    data = tmp_path / "data/pipeline-example/survey/2026-11-30"
    assert sorted(p.name for p in (data / "report").iterdir()) == [
        "airfield.md",
        "harbour.md",
        "index.md",
        "marsh.md",
        "ridge.md",
    ]
    assert len(list((data / "clean").iterdir())) == 4


# -- examples/serverless: a Lambda handler that Lambda's retries cannot make submit twice -------


def test_serverless_handler_gives_the_same_ids_for_a_redelivered_event(tmp_path: Path) -> None:
    here = EXAMPLES / "serverless"
    url = f"file://{tmp_path}/plane"
    handler = [sys.executable, str(here / "handler.py")]
    s3, sqs = str(here / "events/s3-put.json"), str(here / "events/sqs.json")
    # A warm container: an S3 event, its retry, then an SQS batch. Then a cold start (a new
    # process, a new Dispatch) gets the SQS batch again and the S3 event a third time.
    warm = [json.loads(ln)["ids"] for ln in _run([*handler, s3, s3, sqs], _env(url)).splitlines()]
    cold = [json.loads(ln)["ids"] for ln in _run([*handler, sqs, s3], _env(url)).splitlines()]
    s3_ids, sqs_ids = warm[0], warm[2]
    assert len(set(s3_ids)) == 2  # two records, two invocations
    assert warm[1] == cold[1] == s3_ids
    assert cold[0] == sqs_ids
    assert sqs_ids[1] == s3_ids[0]  # the same upload, relayed by SQS: the same invocation

    q = dls.Dispatch(url, ns="uploads")
    keys = QueueKeys("uploads", "ingest")
    ids = {*s3_ids, *sqs_ids}
    ops = q.plane.ops("ingest")
    stored = {
        o.key
        for o in q.store.list(keys.base + "/")
        if o.key.endswith("/record") or o.key.startswith(keys.tickets_prefix)
    }
    assert stored == {record_key(ops, i) for i in ids}  # one invocation per key, nothing more
    assert {q.get(i).key for i in ids} == {
        "s3/example-uploads/photos/cat in a hat.jpg@9b2cf535f27731c974343645a3985328",
        "s3/example-uploads/docs/report-2026.pdf@d41d8cd98f00b204e9800998ecf8427e",
        "sqs/059f36b4-87a3-44ab-83d2-661975830a7d",
    }

    worker = subprocess.run(
        _worker("uploads", "ingest", "--queue", "ingest", "--max-jobs", "3", "--idle-exit", "5"),
        env=_env(url, here),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode == 0, worker.stderr
    assert "worker done: 3 attempt(s)" in worker.stderr
    assert q.result(s3_ids[0], timeout=10) == {
        "object": "s3://example-uploads/photos/cat in a hat.jpg",
        "etag": "9b2cf535f27731c974343645a3985328",
        "size": 48213,
        "type": "jpg",
    }
    assert q.result(sqs_ids[0], timeout=10) == {
        "message": "059f36b4-87a3-44ab-83d2-661975830a7d",
        "words": 5,
    }
    assert {q.status(i) for i in ids} == {"succeeded"}


def test_serverless_handler_refuses_to_start_without_a_store_url() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LAKESHORE_URL"}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "serverless/handler.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "LAKESHORE_URL is not set" in out.stderr


# -- examples/progress: a watcher in a fresh process follows a stream by id and resumes --------


def _frames(lines: list[str]) -> list[tuple[int, str]]:
    """``(seq, "step/of")`` of every frame line (a watcher in a pipe prints one per frame)."""
    found = (re.search(r"\] (\d+/\d+)  \(seq (\d+), attempt 1\)$", line) for line in lines)
    return [(int(m[2]), m[1]) for m in found if m]


class _Proc:
    """A process whose output lines are collected as they come (no blocking reads)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream: IO[str], into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout)
        for t in self._readers:
            t.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()  # read to the end by then
        return code

    def frames(self) -> list[tuple[int, str]]:
        return _frames(self.out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()


def test_progress_watcher_resumes_by_id_after_being_stopped(tmp_path: Path) -> None:
    here = EXAMPLES / "progress"
    url, steps = f"file://{tmp_path}/plane", 24
    env, state = _env(url), tmp_path / "watch-state.json"
    submit = [sys.executable, str(here / "submit.py"), "--steps", str(steps), "--pause", "0.1"]
    submitted = _run(submit, env)
    assert ULID_LINE.fullmatch(submitted), submitted  # the id and nothing else
    inv = submitted.strip()
    watch = [sys.executable, str(here / "watch.py"), inv, "--state", str(state)]

    first = _Proc(watch, env)  # a process that never saw the submit, started before any worker
    worker = _Proc(_worker("progress-example", "long_task", "--max-jobs", "1"), _env(url, here))
    second = None
    try:
        poll(lambda: len(first.frames()) >= 3, 60, "the first watcher showing three frames")
        first.proc.send_signal(signal.SIGTERM)
        assert first.wait() == 128 + signal.SIGTERM, first.err
        seen_first = [seq for seq, _ in first.frames()]
        assert seen_first == list(range(len(seen_first)))  # in order, from the first frame
        assert len(seen_first) < steps, "the invocation ended before the watcher was stopped"
        saved = json.loads(state.read_text())
        assert saved == {"id": inv, "since": len(seen_first), "attempt": 1}

        second = _Proc(watch, env)
        assert second.wait() == 0, second.err
        assert f"resuming {inv} at seq {len(seen_first)} of attempt 1" in second.err
        assert second.out[-1] == f"done: {inv} succeeded"  # it ends when the stream ends
        both = first.frames() + second.frames()
        # not one frame twice, none missing, each the step the body reported
        assert both == [(seq, f"{seq + 1}/{steps}") for seq in range(steps)]
        assert worker.wait() == 0, worker.err
    finally:
        for p in (first, worker, second):
            if p is not None:
                p.kill()

    # --since starts anywhere in the current attempt, whatever the state file says
    tail = _run([*watch, "--since", str(steps - 2)], env).splitlines()
    assert _frames(tail) == [(22, "23/24"), (23, "24/24")]
    assert tail[-1] == f"done: {inv} succeeded"


# -- examples/slurm and examples/laptop: shell scripts that start workers --------------------


def _script_env(**values: str) -> dict[str, str]:
    """This environment for an example's shell script, without the knobs the scripts read
    (``LAKESHORE_*``, ``SLURM_*``), then ``values``. This interpreter's ``bin`` comes first on
    PATH: the scripts call ``lakeshore`` and ``python``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKESHORE_", "SLURM_"))}
    env["PATH"] = os.pathsep.join(
        p for p in (str(Path(sys.executable).parent), env.get("PATH")) if p
    )
    return {**env, **values}


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@contextlib.contextmanager
def _session(
    args: list[str], env: dict[str, str], cwd: Path, **popen: Any
) -> Iterator[subprocess.Popen[Any]]:
    """A process in a session of its own; on the way out, whatever is left of its process
    group (the process, the workers and body processes it started) is killed."""
    proc = subprocess.Popen(args, env=env, cwd=cwd, start_new_session=True, **popen)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


SLURM = EXAMPLES / "slurm"


@contextlib.contextmanager
def _array_task(
    tmp_path: Path, url: str, task: int, **values: str
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``worker-array.sbatch`` run by bash as task ``task`` of an array, the way SLURM runs it:
    from a directory other than the submit folder, with the variables the script reads, its
    output in a file like the one ``#SBATCH --output`` names. Yields the process and that file.
    """
    node = tmp_path / f"node-{task}"
    node.mkdir()
    out = tmp_path / f"lakeshore-worker-4242_{task}.out"
    env = _script_env(
        LAKESHORE_URL=url,
        TMPDIR=str(node),
        SLURM_ARRAY_JOB_ID="4242",
        SLURM_ARRAY_TASK_ID=str(task),
        SLURM_JOB_ID=str(5000 + task),
        SLURM_SUBMIT_DIR=str(SLURM),
        SLURM_CPUS_PER_TASK="2",
        **values,
    )
    script = ["bash", str(SLURM / "worker-array.sbatch")]
    with (
        out.open("wb") as f,
        _session(script, env, node, stdout=f, stderr=subprocess.STDOUT) as proc,
    ):
        yield proc, out


def _submit_batch(*options: str) -> list[str]:
    return [sys.executable, str(SLURM / "submit_batch.py"), *options]


@pytest.mark.slow
def test_slurm_array_tasks_drain_the_queue_run_the_hooks_and_leave_when_idle(
    tmp_path: Path,
) -> None:
    url, host = f"file://{tmp_path}/store", socket.gethostname()
    env = _script_env(LAKESHORE_URL=url)
    batch = ["--count", "6", "--steps", "20000", "--batch", "smoke"]
    first = _run(_submit_batch(*batch, "--no-wait"), env).splitlines()
    assert first[0] == f"6 invocations on {url} queue sim, batch 'smoke'"
    ids = first[1:]
    assert len(ids) == 6 and all(ULID_LINE.fullmatch(f"{i}\n") for i in ids), first

    # The idle exit is cut from 300 s to 2 s (the script's documented override); the rest of
    # the script runs as on a cluster: 2 slots per task from SLURM_CPUS_PER_TASK, the hooks.
    with (
        _array_task(tmp_path, url, 0, LAKESHORE_IDLE_EXIT="2") as (task0, out0),
        _array_task(tmp_path, url, 1, LAKESHORE_IDLE_EXIT="2") as (task1, out1),
    ):
        # the same batch again: the same ids, nothing submitted twice; this run waits
        waited = _run(_submit_batch(*batch, "--timeout", "60"), env, timeout=90).splitlines()
        codes = [task0.wait(60), task1.wait(60)]  # no signal: they leave on their own
        logs = [out0.read_text(), out1.read_text()]
        assert codes == [0, 0], logs
        for task in (task0, task1):  # the body processes went with their worker
            poll(lambda t=task: _group_gone(t.pid), 10, "the task's processes ending")

    assert waited[0] == first[0]
    assert "6/6 finished  {'succeeded': 6}" in waited
    assert any(ln.startswith("mean msd over 6 walks: ") for ln in waited), waited
    assert f"(hosts: {{{host!r}: 6}})" in waited[-2]
    assert not any("lakeshore show" in ln for ln in waited)  # no invocation listed as unsuccessful

    attempts = 0
    for task, log in enumerate(logs):
        assert f" on {url} namespace default: queues sim, concurrency 2, isolation process" in log
        assert "Traceback" not in log and " ERROR " not in log, log
        m = re.search(r"worker done: (\d+) attempt\(s\)", log)
        assert m, log
        attempts += int(m[1])
        assert (tmp_path / f"node-{task}/lakeshore-{5000 + task}").is_dir()  # LAKESHORE_CACHE
    assert attempts == 6
    ran = re.findall(r"jobs:simulate (\w+) attempt 1 -> succeeded", "".join(logs))
    assert sorted(ran) == sorted(ids)  # each invocation ran once, on one of the two tasks

    q = dls.Dispatch(url)
    keys = QueueKeys("default", "sim")
    stored = {o.key for o in q.store.list(keys.base + "/") if o.key.endswith("/record")}
    assert stored == {keys.record(i) for i in ids}
    pids = {task0.pid, task1.pid}  # the workers: bash exec'd them
    for seed, inv in enumerate(ids):
        assert q.get(inv).key == f"smoke/{seed:06d}"
        assert q.status(inv) == "succeeded"
        result = q.result(inv, timeout=10)
        assert {k: result[k] for k in ("seed", "steps", "host")} == {
            "seed": seed,
            "steps": 20000,
            "host": host,
        }
        assert result["msd"] > 0
        job_log = q.logs(inv).splitlines()
        # --before-job: the first line of the attempt's log, written in the body's process
        m = re.search(
            rf" INFO slurm_example: {inv} attempt 1 on {re.escape(host)} \(pid (\d+)\)$", job_log[0]
        )
        assert m, job_log
        assert int(m[1]) not in pids  # process isolation: a child of the worker ran it
        assert f"seed {seed}: 20000/20000 steps" in job_log
        assert any(
            ln.endswith(f"INFO slurm_example: seed {seed} done: msd {result['msd']:.1f}")
            for ln in job_log
        )
        # --on-start built the step table before the child's first attempt; without the hook
        # the body builds it itself, and load_model's log line would land in an attempt's log
        assert not any("step table ready" in ln for ln in job_log), job_log

    status = _run([sys.executable, "-m", "lakeshore", "status", "sim"], env)
    for task in (0, 1):  # --worker-id sim-$SLURM_ARRAY_TASK_ID, signed off at the exit
        assert re.search(
            rf"^  sim-{task}  stopped  running 0  done \d+  queues sim", status, re.M
        ), status


def test_slurm_array_task_hands_its_running_invocation_back_on_sigterm(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    env = _script_env(LAKESHORE_URL=url)
    submitted = _run(_submit_batch("--count", "1", "--steps", "1000000000", "--no-wait"), env)
    inv = submitted.splitlines()[1]
    q = dls.Dispatch(url)
    # --grace 0 (the script's override of 90): what runs at the signal is released at once
    with _array_task(tmp_path, url, 3, LAKESHORE_GRACE="0") as (task, out):
        poll(lambda: " attempt 1 on " in q.logs(inv), 30, "the long invocation's body running")
        assert q.status(inv) == "running"
        task.send_signal(signal.SIGTERM)  # what #SBATCH --signal=B:TERM@120 sends the script
        assert task.wait(30) == 0, out.read_text()
        poll(lambda: _group_gone(task.pid), 10, "the body process ending with its worker")
    log = out.read_text()
    assert "signal 15: no new claims; running attempts may finish, then are released" in log
    assert f"jobs:simulate {inv} attempt 1 -> released (queued again, attempt not counted)" in log
    assert "worker done: 1 attempt(s)" in log
    rec = q.get(inv)
    assert (rec.state, rec.released, rec.lease) == ("queued", 1, None)


def test_slurm_array_script_refuses_to_start_without_a_store_url(tmp_path: Path) -> None:
    out = subprocess.run(
        ["bash", str(SLURM / "worker-array.sbatch")],
        env=_script_env(SLURM_ARRAY_TASK_ID="0", SLURM_JOB_ID="1", TMPDIR=str(tmp_path)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "set LAKESHORE_URL to a store every node can reach" in out.stderr
    assert not list(tmp_path.iterdir())  # it stopped before making its cache folder


# -- examples/laptop: run.sh, two workers, status, wait, logs, SIGTERM ----------------------


def _sections(out: str) -> dict[str, str]:
    """run.sh's output by its ``== step`` headings (the store's and the last one shortened),
    each without the blank line that ends it."""
    parts = re.split(r"^== (.*)\n", out, flags=re.M)
    titles = [re.sub(r"^(store|done)\b.*", r"\1", t) for t in parts[1::2]]
    return dict(zip(titles, (b.rstrip("\n") for b in parts[2::2]), strict=True))


@pytest.mark.slow
def test_laptop_run_sh_shows_the_whole_loop(tmp_path: Path) -> None:
    # no LAKESHORE_URL: the script makes its own temporary store, here under TMPDIR
    env = _script_env(TMPDIR=str(tmp_path))
    with _session(
        ["bash", str(EXAMPLES / "laptop/run.sh")],
        env,
        tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
    s = _sections(out)
    assert list(s) == [
        "store",
        "start two workers (2 slots each, a child process per slot)",
        "submit: one long invocation, eight thumbnails (one of them bad input), all with --key",
        "lakeshore status",
        "lakeshore wait (the bad one fails after 3 attempts, with 1 s and 2 s backoff)",
        "lakeshore logs of a thumbnail, and the error of the bad one",
        "SIGTERM both workers while the long invocation runs",
        "lakeshore ls",
        "cancel the long invocation (it would need a worker for another minute)",
        "done",
    ], out
    url = re.search(r"^== store: (file://\S+)$", out, re.M)[1]  # type: ignore[index]
    assert re.fullmatch(rf"file://{re.escape(str(tmp_path))}/lakeshore-laptop-\w+/plane", url)
    worker_logs = sorted(tmp_path.glob("lakeshore-laptop-logs-*/worker-*.log"))
    assert [p.name for p in worker_logs] == ["worker-1.log", "worker-2.log"]

    submit = s[
        "submit: one long invocation, eight thumbnails (one of them bad input), all with --key"
    ]
    long = re.search(r"^long invocation: (\w+)$", submit, re.M)[1]  # type: ignore[index]
    ids = re.search(r"^thumbnails: (.+)$", submit, re.M)[1].split()  # type: ignore[index]
    assert len({long, *ids}) == 9
    assert f"same key: {ids[0]} (the same id, nothing new queued)" in submit

    status = s["lakeshore status"]
    assert re.search(r"^QUEUE +QUEUED +RUNNING +OLDEST QUEUED +LAST 100 SUBMITTED$", status, re.M)
    assert re.search(r"^default +\d+ +[1-4] ", status, re.M), status  # the long invocation runs
    assert "workers seen in the last 5 minutes: 2" in status
    for n in (1, 2):
        assert re.search(rf"^  laptop-{n}  running ", status, re.M), status

    wait = s["lakeshore wait (the bad one fails after 3 attempts, with 1 s and 2 s backoff)"]
    assert wait.splitlines() == [
        "1 failed, 7 succeeded",
        f"  {ids[7]}  failed",
        "wait exit code: 1 (1: something did not succeed)",
    ]
    logs = s["lakeshore logs of a thumbnail, and the error of the bad one"].splitlines()
    assert logs[0] == "resizing img-1.jpg to 64px"
    assert logs[1].endswith(" WARNING laptop_example: done with img-1.jpg")
    assert logs[2] == "result exit code: 1 (1: the invocation failed)"
    assert "remote error ValueError: 'notes.txt' is not a .jpg" in err

    stop = s["SIGTERM both workers while the long invocation runs"]
    assert re.search(r"^state +running$", stop, re.M), stop  # before the signal
    assert "worker exit codes: 0 0" in stop
    assert (
        stop.count("signal 15: no new claims; running attempts may finish, then are released") == 2
    )
    released = f"tasks:long_render {long} attempt 1 -> released (queued again, attempt not counted)"
    assert released in stop
    # one warm_up per child process started: the long invocation's and at least one for thumbnails
    hooks = re.search(r"one per child process that ran an attempt: (\d+)$", stop, re.M)
    assert hooks and 2 <= int(hooks[1]) <= 4, stop
    assert re.search(
        r"^state +queued\nattempt +1 of 3 \(1 released\), attempt 2 is next$", stop, re.M
    ), stop
    assert re.search(r"^rendering frame \d+$", stop.split("released attempt so far:")[1], re.M)

    listing = s["lakeshore ls"]
    rows = {ln.split()[0]: ln.split()[1:3] for ln in listing.splitlines()[1:] if ln.strip()}
    assert rows == {
        long: ["queued", "1"],
        ids[7]: ["failed", "3"],
        **{i: ["succeeded", "1"] for i in ids[:7]},
    }
    cancel = s["cancel the long invocation (it would need a worker for another minute)"]
    assert cancel == f"{long}  cancelled"

    q = dls.Dispatch(url)
    assert q.status(long) == "killed" and q.get(long).released == 1  # cancelled: killed
    assert [q.result(i, timeout=10)["name"] for i in ids[:7]] == [
        f"img-{i}.jpg" for i in range(1, 8)
    ]
    keys = QueueKeys("default", "default")
    stored = {o.key for o in q.store.list(keys.base + "/") if o.key.endswith("/record")}
    assert stored == {keys.record(i) for i in (long, *ids)}  # the resubmit added nothing
