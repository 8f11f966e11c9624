"""CLI hardening (issue 22): untrusted text is printed inert, destructive commands process
every id and report each, typos do not create queues or stores, and gc asks first."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.cli import main
from lakeshore.keys import worker_key

# OSC 52 writes the clipboard; ESC[2K + CR erase the line and fake what follows; 0x9b is a
# one-byte CSI on some terminals; U+202E reverses what follows
PAYLOAD = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\rstate     succeeded\x9b31m\u202e"
RAW = ("\x1b", "\x07", "\r", "\x9b", "\u202e")


def shout(text: str) -> str:
    print(text)
    return text


def boom(text: str) -> None:
    raise ValueError(text)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_inert(text: str) -> None:
    for c in RAW:
        assert c not in text, (c, text)
    assert "\\x1b]52;c;" in text or "\\u001b]52;c;" in text  # shown, as an escape


def drain(q: Any) -> None:
    dls.run_worker(
        q,
        isolation="thread",
        idle_exit=0.3,
        max_poll_s=0.02,
        allow=["tests.e2e.test_cli_hardening:*", "tests.jobs:*"],
    )


# -- item 7: terminal escape injection ----------------------------------------------------


def test_a_hostile_key_is_shown_inert(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = dls.Dispatch(url)
    inv = q.udf(shout).submit("hi")
    ops = q.ops("default")
    rec, _ = ops.read(inv)
    # a producer may write any record it can write: here a _key full of controls
    q.store.put(ops.keys.record(inv), dataclasses.replace(rec, key=PAYLOAD).to_bytes())
    code, out, _ = run(capsys, "show", inv)
    assert code == 0
    assert_inert(out)
    code, out, _ = run(capsys, "show", inv, "--json")
    assert code == 0 and json.loads(out)["key"] == PAYLOAD  # JSON keeps it exact
    for c in ("\x1b", "\x9b", "\u202e"):
        assert c not in out


def test_a_hostile_sign_of_life_is_shown_inert(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    q.udf(shout).submit("hi")
    now = q.store.now()
    life = {"seen_at": now, "worker": PAYLOAD, "status": PAYLOAD, "running": 0, "done": 0}
    q.store.put(worker_key("default", "evil"), codec.encode(life))
    code, out, _ = run(capsys, "status")
    assert code == 0
    assert_inert(out)
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0 and "\x1b" not in out and "\x9b" not in out


def test_a_bodys_output_and_exception_text_are_shown_inert(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    loud = q.udf(shout).submit(f"line one\n{PAYLOAD}\nline three")
    bad = q.udf(boom).submit(PAYLOAD, _max_attempts=1)
    drain(q)
    code, out, _ = run(capsys, "logs", loud)
    assert code == 0 and "line one\n" in out and "\nline three" in out  # lines kept
    assert_inert(out)
    code, out, _ = run(capsys, "result", loud)
    assert code == 0 and out.startswith("line one\n")
    assert_inert(out)
    code, _, err = run(capsys, "result", bad)
    assert code == 1
    assert len(err.strip().splitlines()) == 1  # one line, whatever the message holds
    assert_inert(err)
    code, out, _ = run(capsys, "show", bad)
    assert code == 0
    assert_inert(out)


# -- item 9: destructive commands strand no one -------------------------------------------


def test_cancel_processes_every_id_and_reports_each(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    a, b, c, d = (q.udf(shout).submit(str(i)) for i in range(4))
    missing = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    code, out, err = run(capsys, "cancel", a, b, missing, "nonsense", c, d)
    assert code == 2  # something failed
    assert [q.status(i) for i in (a, b, c, d)] == ["killed"] * 4  # the ones after it too
    lines = out.splitlines()
    assert lines == [
        f"{a}  cancelled",
        f"{b}  cancelled",
        f"{missing}  not found",
        "nonsense  invalid id",
        f"{c}  cancelled",
        f"{d}  cancelled",
    ]
    assert len(err.strip().splitlines()) == 2  # one error line per failed id
    code, out, _ = run(capsys, "cancel", a, missing, "--json")
    assert code == 2 and json.loads(out) == {a: "already finished", missing: "not found"}


def test_queue_set_of_a_queue_that_does_not_exist_needs_create(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    q.udf(queue="jobs")(shout).submit("x")
    code, _, err = run(capsys, "queue", "set", "jbos", "max_depth=5")
    assert code == 2 and "no queue 'jbos'" in err and "--create" in err
    assert list(q.store.list("lakeshore/default/jbos/")) == []  # nothing was created
    code, _, _ = run(capsys, "queue", "set", "jbos", "max_depth=5", "--create")
    assert code == 0 and q.queue_config("jbos").max_depth == 5
    code, _, _ = run(capsys, "queue", "set", "jobs", "max_depth=7")
    assert code == 0 and q.queue_config("jobs").max_depth == 7


@pytest.mark.parametrize(
    "argv",
    [
        ["gc", "--older-than", "1d", "--yes"],
        ["gc", "--older-than", "1d", "--dry-run"],
        ["status"],
        ["ls"],
        ["cancel", "01ARZ3NDEKTSV4RRFFQ69G5FAV"],
        ["queue", "set", "jobs", "max_depth=5"],
    ],
    ids=["gc", "gc-dry-run", "status", "ls", "cancel", "queue-set"],
)
def test_a_mistyped_store_path_is_refused_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    real = f"file://{tmp_path}/plane"
    dls.Dispatch(real).udf(shout).submit("x")
    typo = tmp_path / "plnae"
    code, out, err = run(capsys, *argv, "--url", f"file://{typo}")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "there is no lakeshore store" in lines[0] and " — " in lines[0]
    assert not typo.exists()


class Terminal(io.StringIO):
    """A stdin that is a terminal, with the answer the person typed."""

    def isatty(self) -> bool:
        return True


def _expired(tmp_path: Path) -> tuple[Any, str, list[str]]:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    done = [q.udf(shout).submit(str(i)) for i in range(2)]
    drain(q)
    return q, url, done


def test_gc_asks_before_deleting_and_refuses_without_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    q, url, done = _expired(tmp_path)
    argv = ["gc", "--older-than", "0s", "--url", url]
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # cron, CI: no terminal
    code, out, err = run(capsys, *argv)
    assert code == 2 and "--yes" in err and "not a terminal" in err
    assert [q.status(i) for i in done] == ["succeeded"] * 2

    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    code, out, err = run(capsys, *argv)
    assert code == 1 and "nothing deleted" in err
    assert all(i in err for i in done) and "delete all of this? [y/N]" in err  # shown first
    assert [q.status(i) for i in done] == ["succeeded"] * 2

    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    code, out, err = run(capsys, *argv)
    assert code == 0 and "default: removed 2 invocation(s)" in out
    for i in done:
        with pytest.raises(dls.NotFound):
            q.get(i)
