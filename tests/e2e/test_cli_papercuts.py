"""Issue 35's first-week papercuts, each held: sub-second run times, `retry` and `show`
agreeing on attempt numbers, common options before the subcommand, the URL `status` prints,
an empty `logs`, tracebacks from the body's frame, a worker warned of queues it has no body
for, workers that fail everything shown as such, and busy workers' rows kept current."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from pathlib import Path

import pytest

import lakeshore as dls
from lakeshore.cli.common import public_url, took
from lakeshore.protocol.census import workers_seen
from tests import jobs
from tests.commands import run


async def _fails_async() -> None:
    raise RuntimeError("async boom")


def _failed_once(url: str) -> tuple[dls.Dispatch, str]:
    q = dls.Dispatch(url)
    inv = q.udf(jobs.fail_always).submit("boom", _max_attempts=1)
    dls.run_worker(q, once=True, isolation="thread")
    return q, inv


def test_run_times_under_a_minute_keep_hundredths() -> None:
    assert [took(0.38), took(0.0), took(12.4), took(59.994)] == [
        "0.38s",
        "0.00s",
        "12.40s",
        "59.99s",
    ]
    assert (took(61), took(None), took(-0.5)) == ("1m01s", "-", "0.00s")


def test_show_gives_a_fast_attempt_its_hundredths(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    inv = q.udf(jobs.add_one).submit(1)
    dls.run_worker(q, once=True, isolation="thread")
    code, out, _ = run(capsys, "show", inv)
    line = next(ln for ln in out.splitlines() if ln.startswith("ran for"))
    assert code == 0 and re.fullmatch(r"ran for\s+\d+\.\d\ds", line), line


def test_retry_and_show_name_the_same_attempt(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q, inv = _failed_once(url)
    code, out, _ = run(capsys, "retry", inv)
    assert code == 0 and out.strip() == f"{inv} queued again: 1 of 2, attempt 2 is next"
    code, out, _ = run(capsys, "show", inv)
    assert "attempt    1 of 2, attempt 2 is next" in out.splitlines()
    dls.run_worker(q, once=True, isolation="thread")
    code, out, _ = run(capsys, "show", inv)  # finished: no next attempt to speak of
    assert "attempt    2 of 2" in out.splitlines()


def test_common_options_before_the_subcommand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LAKESHORE_URL", raising=False)
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url, ns="team")
    inv = q.udf(jobs.add_one).submit(1)
    code, out, err = run(capsys, "--url", url, "--ns", "team", "--json", "show", inv)
    assert code == 0, err
    assert '"state": "queued"' in out
    # after the subcommand it still works, and the nearer one wins
    code, out, _ = run(capsys, "--ns", "nobody", "show", "--url", url, "--ns", "team", inv)
    assert code == 0 and "queued" in out
    code, _, err = run(capsys, "--url", url, "show", inv)  # default namespace: not there
    assert code == 2 and "no invocation with this id in namespace 'default'" in err
    # an explicit --ns default after the subcommand is nearer too
    code, _, err = run(capsys, "--ns", "team", "--url", url, "show", "--ns", "default", inv)
    assert code == 2 and "no invocation with this id in namespace 'default'" in err
    with pytest.raises(SystemExit) as e:  # a command without --json says so
        run(capsys, "--json", "logs", inv)
    assert e.value.code == 2 and "--json is not an option of `lakeshore logs`" in (
        capsys.readouterr().err
    )


def test_ns_before_ui_is_one_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ui`'s --ns is repeatable (a list): `lakeshore --ns prod ui` shows namespace prod,
    not the namespaces p, r, o and d."""
    import lakeshore.ui

    url = f"file://{tmp_path}/plane"
    dls.Dispatch(url, ns="prod").udf(jobs.add_one).submit(1)
    shown: list[object] = []
    real = lakeshore.ui.Board

    def board(store: object, namespaces: object = None, **kw: object) -> object:
        shown.append(namespaces)
        return real(store, namespaces, **kw)  # type: ignore[arg-type]

    def serve_forever(self: lakeshore.ui.UiServer) -> None:
        self.start()  # served in a thread, which close() stops
        raise KeyboardInterrupt  # as Ctrl-C at once

    monkeypatch.setattr(lakeshore.ui, "Board", board)
    monkeypatch.setattr(lakeshore.ui.UiServer, "serve_forever", serve_forever)
    code, _, err = run(capsys, "--ns", "prod", "--url", url, "ui", "--port", "0")
    assert code == 0, err
    assert shown == [["prod"]]


def test_the_url_status_prints_keeps_its_endpoint_and_drops_credentials() -> None:
    endpoint = "s3://b/p?endpoint_url=http://127.0.0.1:8333&region=us-east-1"
    assert public_url(endpoint) == endpoint
    secret = "s3://b/p?endpoint_url=http://key:secret@127.0.0.1:8333&region=x"
    assert public_url(secret) == "s3://b/p?endpoint_url=http://127.0.0.1:8333&region=x"
    encoded = "s3://b?endpoint_url=http%3A%2F%2Fkey%3As%40host%3A1"
    assert public_url(encoded) == "s3://b?endpoint_url=http://host:1"
    assert public_url("s3://user:pw@b/p") == "s3://b/p"
    assert public_url("file:///tmp/x") == "file:///tmp/x"


def test_status_prints_the_url_as_given(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dls.Dispatch(url).udf(jobs.add_one).submit(1)
    code, out, _ = run(capsys, "status")
    assert code == 0 and out.splitlines()[0] == f"{url}  namespace default"


def test_logs_of_a_silent_attempt_say_so(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = dls.Dispatch(url)
    inv = q.udf(jobs.add_one).submit(1)
    code, out, err = run(capsys, "logs", inv)
    assert (code, out) == (0, "") and "has not run yet (queued)" in err
    code, out, err = run(capsys, "logs", inv, "--attempt", "7")
    assert (code, out) == (0, "") and "has not run yet (queued): there is no attempt 7" in err
    dls.run_worker(q, once=True, isolation="thread")
    code, out, err = run(capsys, "logs", inv, "--attempt", "7")
    assert "has run 1 attempt(s) (succeeded): there is no attempt 7" in err
    code, out, err = run(capsys, "logs", inv)
    assert (code, out) == (0, "") and f"no output captured for attempt 1 of {inv}" in err
    code, out, err = run(capsys, "logs", inv, "--attempt", "1", "--follow", "--timeout", "5")
    assert (code, out) == (0, "") and f"no output captured for attempt 1 of {inv}" in err
    talk = q.udf(jobs.chatty).submit(2)
    dls.run_worker(q, once=True, isolation="thread")
    code, out, err = run(capsys, "logs", talk)
    assert "n=2" in out and "no output" not in err


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_remote_traceback_starts_at_the_body(tmp_path: Path, isolation: str) -> None:
    q = dls.Dispatch(f"file://{tmp_path}/plane")
    plain = q.udf(jobs.fail_always).submit("boom", _max_attempts=1)
    streamed = q.udf(jobs.bad_stream).submit(1, _max_attempts=1)
    dls.run_worker(q, idle_exit=0, isolation=isolation)
    for inv, raising in ((plain, "raise ValueError(msg)"), (streamed, "raise KeyError")):
        trace = q.get(inv).error["traceback"].splitlines()
        assert trace[0] == "Traceback (most recent call last):"
        assert trace[1].startswith('  File "') and "tests/jobs.py" in trace[1], trace
        assert raising in "\n".join(trace)
        assert "lakeshore/running" not in "\n".join(trace)


def test_async_bodies_lose_asyncio_frames_too(tmp_path: Path) -> None:
    q = dls.Dispatch(f"file://{tmp_path}/plane")
    inv = q.udf(_fails_async).submit(_max_attempts=1)
    dls.run_worker(q, once=True, isolation="thread")
    trace = q.get(inv).error["traceback"].splitlines()
    assert "test_cli_papercuts.py" in trace[1] and "asyncio" not in "\n".join(trace), trace


def test_a_worker_warns_of_a_queue_no_import_declares(
    url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    (tmp_path / "declares_fast.py").write_text(
        "import lakeshore\n\n@lakeshore.udf(queue='fast')\ndef double(x):\n    return 2 * x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "declares_fast", raising=False)
    argv = ["worker", "--import", "declares_fast", "--idle-exit", "0", "--isolation", "thread"]

    def warnings(*more: str) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lakeshore.worker"):
            assert run(capsys, *argv, *more)[0] == 0
        return [r.getMessage() for r in caplog.records if "@udf body for it" in r.getMessage()]

    warned = warnings("-q", "fast", "-q", "slow")
    assert len(warned) == 1 and "queue slow: the --import modules declare no" in warned[0]
    assert warnings() == []  # the declared queues only: nothing to warn of
    assert warnings("-q", "slow", "--allow", "tests.jobs:*") == []  # the patterns decide


def test_no_warning_for_a_queue_declared_in_a_submodule_the_import_loads(
    url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``--import app`` whose ``__init__`` imports ``app.tasks``: the bodies of app.tasks are
    declared (the worker runs them), so no "will fail as not declared" warning."""
    pkg = tmp_path / "app_with_tasks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from app_with_tasks import tasks\n")
    (pkg / "tasks.py").write_text(
        "import lakeshore\n\n@lakeshore.udf(queue='fast')\ndef double(x):\n    return 2 * x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("app_with_tasks", "app_with_tasks.tasks"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    argv = ["worker", "--import", "app_with_tasks", "-q", "fast", "--idle-exit", "0"]
    with caplog.at_level(logging.WARNING, logger="lakeshore.worker"):
        assert run(capsys, *argv, "--isolation", "thread")[0] == 0
    warned = [r.getMessage() for r in caplog.records if "@udf body for it" in r.getMessage()]
    assert warned == []
    tasks = sys.modules["app_with_tasks.tasks"]
    inv = dls.Dispatch(url).udf(tasks.double.fn, queue="fast").submit(21)
    assert run(capsys, *argv, "--isolation", "thread")[0] == 0
    assert dls.Dispatch(url).result(inv, timeout=0) == 42  # and it did run there


def test_status_shows_a_worker_that_fails_everything(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    for i in range(3):
        q.udf(jobs.fail_always).submit(f"boom {i}", _max_attempts=1)
    dls.run_worker(q, idle_exit=0, isolation="thread", worker_id="failer")
    q.udf(jobs.fail_always).submit("once", _max_attempts=1)
    q.udf(jobs.add_one).submit(1)
    dls.run_worker(q, idle_exit=0, isolation="thread", worker_id="mixed")
    code, out, _ = run(capsys, "status")
    assert code == 0
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ")}
    assert "done 3 (ALL FAILED: 3 of 3;" in rows["failer"]
    assert "done 2 (1 failed)" in rows["mixed"]
    seen = {w["worker"]: w for w in workers_seen(q.store, q.ns, q.store.now())}
    assert (seen["failer"]["failed"], seen["mixed"]["failed"]) == (3, 1)


def test_a_busy_workers_row_is_current_within_seconds(tmp_path: Path) -> None:
    """With the default announce_s (30 s), the row counts attempts as they end, not half a
    minute later."""
    q = dls.Dispatch(f"file://{tmp_path}/plane")
    f = q.udf(jobs.add_one)
    stop = threading.Event()
    worker = threading.Thread(
        target=dls.run_worker,
        args=(q,),
        kwargs={"isolation": "thread", "worker_id": "busy", "stop": stop, "max_poll_s": 0.05},
    )
    worker.start()
    try:
        ids = [f.submit(i) for i in range(5)]
        for inv in ids:
            q.result(inv, timeout=30)
        deadline = time.monotonic() + 10  # a PUT within 2 s of the last change; a margin
        row: dict[str, object] = {}
        while time.monotonic() < deadline:
            row = next(iter(workers_seen(q.store, q.ns, q.store.now())), {})
            if row.get("done") == 5:
                break
            time.sleep(0.05)  # polling the store for the row, with a deadline
        assert (row.get("status"), row.get("done"), row.get("running")) == ("running", 5, 0)
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()


def test_a_page_that_uses_motos_server_says_which_extra_has_it() -> None:
    """`moto[s3]` has no `moto.server`: a page whose example imports it names `moto[server]`."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    using = [p for p in docs.rglob("*.md") if "from moto.server import" in p.read_text()]
    assert using, "no page imports moto.server: this test checks nothing"
    for page in using:
        assert "moto[server]" in page.read_text(), page.name


class _Proxy:
    """An object of some library's module that raises when asked its class (a proxy to a
    request that is not there, say)."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError("outside of a request")


def test_the_undeclared_queue_warning_survives_any_module_this_process_imported(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Looking for @udf bodies in every module imported so far must not start the worker
    only if every object of every module answers isinstance()."""
    import types

    odd = types.ModuleType("module_with_a_proxy")
    odd.request = _Proxy()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "module_with_a_proxy", odd)
    code, _, err = run(capsys, "worker", "-q", "nothing_here", "--idle-exit", "0")
    assert code == 0, err
