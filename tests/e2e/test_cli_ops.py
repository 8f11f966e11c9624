"""Every operations command: it works, it has --help, and bad input is one clear line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import lakeshore as dls
from lakeshore.cli import build_parser, main
from tests import jobs
from tests.commands import run

COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def _failed_once(url: str) -> tuple[dls.Dispatch, str]:
    """An invocation whose body raised ValueError("boom"), failed for good after one attempt."""
    q = dls.Dispatch(url)
    inv = q.udf(jobs.fail_always).submit("boom", _max_attempts=1)
    dls.run_worker(q, once=True, isolation="thread")
    return q, inv


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lakeshore: "), err
    assert " — " in lines[0]  # what happened — what to do
    return lines[0]


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert {"submit", "status", "ls", "show", "result", "tail", "logs", "cancel", "wait"} <= set(
        COMMANDS
    )
    assert {"retry", "queue", "gc", "worker"} <= set(COMMANDS)
    for command in COMMANDS:
        with pytest.raises(SystemExit) as e:
            main([command, "--help"])
        assert e.value.code == 0
        assert "usage: lakeshore " + command in capsys.readouterr().out


def test_submit_show_result_wait_retry(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "submit", "tests.jobs:add_one", "--kwargs", '{"x": 41}')
    assert code == 0
    inv = out.strip()
    q = dls.Dispatch(url)
    assert q.status(inv) == "queued"
    code, again, _ = run(capsys, "submit", "tests.jobs:add_one", "--args", "[1]", "--key", "k")
    code2, same, _ = run(capsys, "submit", "tests.jobs:add_one", "--args", "[1]", "--key", "k")
    assert code == code2 == 0 and again == same  # a retried submit is safe with --key
    # a plain function (not @udf): its worker's operator allows it
    dls.run_worker(q, isolation="thread", idle_exit=0.2, max_poll_s=0.05, allow=["tests.jobs:*"])
    code, out, _ = run(capsys, "result", inv)
    assert (code, out.strip()) == (0, "42")
    code, out, _ = run(capsys, "show", inv)
    assert code == 0 and "succeeded" in out and "tests.jobs:add_one" in out
    code, out, _ = run(capsys, "show", inv, "--json")
    assert json.loads(out)["attempt"] == 1
    code, out, err = run(capsys, "wait", inv, again.strip())
    assert code == 0 and "2 succeeded" in out and "\r" not in err  # no bar off a terminal
    code, out, _ = run(capsys, "retry", inv)
    assert code == 0 and "attempt 2" in out and q.status(inv) == "queued"
    code, out, err = run(capsys, "wait", inv, "--timeout", "0.2", "--quiet")
    assert code == 3 and "1 queued" in out  # timed out waiting
    code, out, _ = run(capsys, "retry", inv)
    assert code == 2  # still queued: nothing to retry


def test_failed_result_is_exit_1_with_the_remote_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q, inv = _failed_once(url)
    code, out, err = run(capsys, "result", inv)
    assert code == 1 and out == ""  # stdout is for the value: nothing of the error
    *trace, line = err.strip().splitlines()
    # the worker's traceback first, down to the body's raising line, then the one error line
    assert trace[0] == "Traceback (most recent call last):" and trace[-1] == "ValueError: boom"
    assert "    raise ValueError(msg)" in trace and 'tests/jobs.py", line' in err
    assert line.startswith(f"lakeshore: result {inv}: invocation failed after 1 attempt(s)")
    todo = "the traceback above shows where the body raised; fix the body or its input"
    assert line.endswith(f" — {todo} and submit again")
    assert "remote_traceback" not in err  # a shell user has no such attribute to read
    with pytest.raises(dls.Failed) as e:
        q.result(inv)
    assert "this error's remote_traceback shows where the body raised" in str(e.value)
    assert "raise ValueError(msg)" in e.value.remote_traceback
    code, out, _ = run(capsys, "wait", inv, "--json")
    assert code == 1 and json.loads(out)["counts"] == {"failed": 1}


def test_tail_of_a_failed_stream_ends_with_its_traceback(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    inv = q.udf(jobs.bad_stream).submit(2, _max_attempts=1)
    dls.run_worker(q, once=True, isolation="thread")
    code, out, err = run(capsys, "tail", inv)
    assert code == 1 and out.splitlines() == ["0\t0", "1\t1"]  # the frames, then the error
    *trace, line = err.strip().splitlines()
    assert (
        trace[0] == "Traceback (most recent call last):"
        and '    raise KeyError("stream broke")' in trace
    )
    assert line.startswith("lakeshore: ") and "the traceback above shows where" in line
    assert "remote_traceback" not in err


def test_show_of_a_failed_invocation_ends_with_its_traceback(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, inv = _failed_once(url)
    code, out, _ = run(capsys, "show", inv)
    assert code == 0
    lines = out.splitlines()
    at = lines.index("traceback")
    assert lines[at - 1] == "error      ValueError: boom"  # after the fields
    tried = lines[lines.index("attempts") + 1 : at - 1]  # each attempt, with how it ended
    assert [ln.split()[0] for ln in tried] == ["1"] and tried[0].endswith("  failed")
    trace = lines[at + 1 :]
    assert (
        trace[0] == "    Traceback (most recent call last):" and trace[-1] == "    ValueError: boom"
    )
    assert "        raise ValueError(msg)" in trace
    assert all(ln.startswith("    ") for ln in trace)  # indented: no line reads as a field
    code, out, _ = run(capsys, "show", inv, "--json")
    assert code == 0 and "raise ValueError(msg)" in json.loads(out)["error"]["traceback"]


def test_an_error_with_nothing_raised_stays_one_line(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    inv = q.udf(jobs.add_one).submit(1)
    q.cancel(inv)
    code, out, err = run(capsys, "result", inv)
    assert code == 1 and out == "" and "killed" in one_line_error(err)
    code, out, _ = run(capsys, "show", inv)
    assert code == 0 and "error      Killed: cancelled" in out and "traceback" not in out


# ESC ] 52 writes the clipboard, ESC [ 2K + CR erase the line, 0x9b is a one-byte CSI on some
# terminals, U+202E reverses what follows; SHOWN is how it must be printed
HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\rstate     succeeded\x9b31m\u202e"
SHOWN = "\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2K\\x0dstate     succeeded\\x9b31m\\u202e"


def assert_inert(text: str) -> None:
    for c in ("\x1b", "\x07", "\r", "\x9b", "\u202e"):
        assert c not in text, (c, text)


def test_a_hostile_error_and_traceback_are_shown_inert(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q, inv = _failed_once(url)
    ops = q.plane.ops("default")
    rec, _ = ops.read(inv)
    # anyone who can write the record can write its error: here both texts full of controls,
    # the traceback also with two line breaks that are not newlines (U+2028, NEL)
    head = "Traceback (most recent call last):\n  File 'x', line 1\n"
    trace = f"{head}ValueError: {HOSTILE}\u2028\x85\n"
    error = {"type": "ValueError", "message": HOSTILE, "traceback": trace}
    q.store.put(ops.keys.record(inv), dataclasses.replace(rec, error=error).to_bytes())
    code, out, err = run(capsys, "result", inv)
    assert code == 1 and out == ""
    assert_inert(err)
    assert err.splitlines()[:3] == [
        "Traceback (most recent call last):",
        "  File 'x', line 1",
        f"ValueError: {SHOWN}\\u2028\\x85",
    ]  # the traceback's own lines are kept, nothing else splits one
    assert len(err.splitlines()) == 4 and err.splitlines()[3].startswith("lakeshore: result ")
    code, out, _ = run(capsys, "show", inv)
    assert code == 0
    assert_inert(out)
    assert f"error      ValueError: {SHOWN}" in out.splitlines()
    assert out.splitlines()[-3:] == [
        "    Traceback (most recent call last):",
        "      File 'x', line 1",
        f"    ValueError: {SHOWN}\\u2028\\x85",
    ]


def test_tail_logs_cancel(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = dls.Dispatch(url)
    gen = q.udf(jobs.squares).submit(3)
    talk = q.udf(jobs.chatty).submit(5)
    queued = q.udf(jobs.add_one).submit(1)
    dls.run_worker(q, isolation="thread", max_jobs=2, idle_exit=0.2, max_poll_s=0.05)
    code, out, _ = run(capsys, "tail", gen)
    assert code == 0 and out.splitlines() == ["0\t[0, 0]", "1\t[1, 1]", "2\t[2, 4]"]
    code, out, _ = run(capsys, "tail", gen, "--since", "2", "--json")
    assert [json.loads(ln)["value"] for ln in out.splitlines()] == [[2, 4]]
    code, out, _ = run(capsys, "logs", talk)
    assert code == 0 and "n=5" in out
    code, out, _ = run(capsys, "logs", talk, "--follow", "--timeout", "10")
    assert code == 0 and "n=5" in out
    code, out, _ = run(capsys, "cancel", queued, gen)
    assert code == 0
    assert f"{queued}  cancelled" in out and f"{gen}  already finished" in out


def test_status_and_ls(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = dls.Dispatch(url)
    f = q.udf(jobs.add_one)
    done = [f.submit(i) for i in range(5)]
    dls.run_worker(q, isolation="thread", max_jobs=5, idle_exit=0.2, max_poll_s=0.05)
    waiting = [f.submit(i) for i in range(3)]
    code, out, _ = run(capsys, "status", "--json")
    data = json.loads(out)["queues"][0]
    assert (data["queue"], data["queued"], data["running"]) == ("default", 3, 0)
    assert data["recent"]["succeeded"] == 5 and data["recent"]["queued"] == 3
    assert data["oldest_queued_s"] is not None
    code, out, _ = run(capsys, "status")
    assert code == 0 and "default" in out and "5 succeeded" in out
    code, out, _ = run(capsys, "ls", "--state", "queued", "--json")
    assert [r["id"] for r in json.loads(out)["invocations"]] == sorted(waiting, reverse=True)
    code, out, _ = run(capsys, "ls", "--limit", "4", "--json")
    page = json.loads(out)
    assert [r["id"] for r in page["invocations"]] == sorted(done + waiting, reverse=True)[:4]
    code, out, _ = run(capsys, "ls", "--limit", "4", "--before", page["next_before"], "--json")
    assert [r["id"] for r in json.loads(out)["invocations"]] == sorted(
        done + waiting, reverse=True
    )[4:8]
    code, out, _ = run(capsys, "ls", "--state", "succeeded")
    assert code == 0 and all(i in out for i in done) and not any(i in out for i in waiting)


def test_queue_show_and_set(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = dls.Dispatch(url)
    q.udf(jobs.add_one).submit(1)
    code, out, _ = run(capsys, "queue", "set", "default", "max_attempts=5", "--json")
    assert code == 0 and json.loads(out)["max_attempts"] == 5
    code, out, _ = run(capsys, "queue", "show", "default")
    assert code == 0 and "max_attempts" in out


BAD_ID = {
    "show": ["show", "nonsense"],
    "result": ["result", "nonsense"],
    "tail": ["tail", "nonsense"],
    "logs": ["logs", "nonsense"],
    "cancel": ["cancel", "nonsense"],
    "wait": ["wait", "nonsense"],
    "retry": ["retry", "nonsense"],
}
MISSING_QUEUE = {
    "status": ["status", "nosuch"],
    "ls": ["ls", "nosuch"],
    "gc": ["gc", "--queue", "nosuch", "--older-than", "1d", "--yes"],
    "queue": ["queue", "show", "nosuch"],
}
QUEUE_SET = {"queue-set": ["queue", "set", "nosuch", "max_depth=5"]}


@pytest.mark.parametrize("argv", BAD_ID.values(), ids=list(BAD_ID))
def test_bad_id_is_one_line(url: str, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    dls.Dispatch(url)  # the store exists (a missing one is refused first)
    code, _, err = run(capsys, *argv)
    assert code == 2 and "not an invocation id" in one_line_error(err)


@pytest.mark.parametrize("argv", BAD_ID.values(), ids=list(BAD_ID))
def test_unknown_id_is_one_line(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    dls.Dispatch(url)  # the store exists (a missing one is refused first)
    argv = [a if a != "nonsense" else "01ARZ3NDEKTSV4RRFFQ69G5FAV" for a in argv]
    code, _, err = run(capsys, *argv)
    assert code == 2 and "no invocation with this id" in one_line_error(err)


@pytest.mark.parametrize("argv", MISSING_QUEUE.values(), ids=list(MISSING_QUEUE))
def test_missing_queue_is_one_line(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Commands that only read show a queue with no objects empty, with a one-line note
    (it may be a typo, or a queue gc emptied); only `queue set` refuses (tests below)."""
    dls.Dispatch(url)  # the store exists (a missing one is refused first)
    code, _, err = run(capsys, *argv)
    assert (
        code == 0
        and "queue 'nosuch' in namespace 'default' has no invocations" in one_line_error(err)
    )


def test_queue_set_on_a_missing_queue_is_one_line(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dls.Dispatch(url)
    code, _, err = run(capsys, *QUEUE_SET["queue-set"])
    assert code == 2 and "no queue 'nosuch'" in one_line_error(err)
    assert "--create" in err


ALL_COMMANDS = {
    **BAD_ID,
    **MISSING_QUEUE,
    **QUEUE_SET,
    "submit": ["submit", "tests.jobs:add_one", "--args", "[1]"],
    "worker": ["worker", "--idle-exit", "0"],
}


@pytest.mark.parametrize("argv", ALL_COMMANDS.values(), ids=list(ALL_COMMANDS))
def test_unreachable_store_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store's directory should be")
    argv = [a if a != "nonsense" else "01ARZ3NDEKTSV4RRFFQ69G5FAV" for a in argv]
    code, _, err = run(capsys, *argv, "--url", f"file://{blocker}/store")
    assert code == 2 and "cannot create the store directory" in one_line_error(err)


def test_unreachable_s3_endpoint_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    code, _, err = run(capsys, "status", "--url", "s3://bucket/p?endpoint_url=http://127.0.0.1:9")
    assert code == 2 and "still failing" in one_line_error(err)


def test_bad_submit_input(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, text in [
        (["submit", "tests.jobs:add_one", "--kwargs", "{nope"], "not valid JSON"),
        (["submit", "tests.jobs:add_one", "--kwargs", "[1]"], "must be a JSON dict"),
        (["submit", "no_colon"], "is not module:function"),
        (["submit", "tests.jobs:does_not_exist"], "cannot load the function"),
        (["submit", "tests.jobs:add_one", "--kwargs", '{"y": 1}'], "do not fit the function"),
    ]:
        code, _, err = run(capsys, *argv)
        assert code == 2 and text in one_line_error(err), argv


def test_wait_draws_its_bar_on_a_terminal_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"file://{tmp_path}/store"
    q = dls.Dispatch(url)
    inv = q.udf(jobs.add_one).submit(1)
    dls.run_worker(q, once=True, isolation="thread")
    code, out, err = run(capsys, "wait", inv, "--url", url)
    assert code == 0 and "\r" not in err and "finished" not in err, err  # a log file, a pipe
    assert "1 succeeded" in out
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    code, _, err = run(capsys, "wait", inv, "--url", url)
    assert code == 0 and "\r[" in err and "1/1 finished" in err, err
