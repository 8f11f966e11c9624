"""Every example in examples/ runs, at least in a smoke form."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import lakeshore as dls
from lakeshore.keys import QueueKeys
from tests.waiting import poll

ROOT = Path(__file__).resolve().parent.parent
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
    assert len(set(s3_ids)) == 2  # two records, two jobs
    assert warm[1] == cold[1] == s3_ids
    assert cold[0] == sqs_ids
    assert sqs_ids[1] == s3_ids[0]  # the same upload, relayed by SQS: the same job

    q = dls.Dispatch(url, ns="uploads")
    keys = QueueKeys("uploads", "ingest")
    ids = {*s3_ids, *sqs_ids}
    stored = {o.key for o in q.store.list(keys.base + "/") if o.key.endswith("/record")}
    assert stored == {keys.record(i) for i in ids}  # one invocation per key, nothing more
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
        assert len(seen_first) < steps, "the job ended before the watcher was stopped"
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
