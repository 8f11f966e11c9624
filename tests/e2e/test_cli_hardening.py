"""CLI hardening (issue 22): untrusted text is printed inert, destructive commands process
every id and report each, typos do not create queues or stores, and gc asks first. Issue 18:
a closed pipe ends a command quietly, and a module that cannot be imported says why."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.cli import main
from lakeshore.keys import worker_key
from tests.commands import run

# OSC 52 writes the clipboard; ESC[2K + CR erase the line and fake what follows; 0x9b is a
# one-byte CSI on some terminals; U+202E reverses what follows
PAYLOAD = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\rstate     succeeded\x9b31m\u202e"
RAW = ("\x1b", "\x07", "\r", "\x9b", "\u202e")

ROOT = Path(__file__).resolve().parents[2]
# -P: as with the lakeshore console script, the current directory is not on sys.path
LAKESHORE = [sys.executable, "-P", "-m", "lakeshore"]


def shout(text: str) -> str:
    print(text)
    return text


def boom(text: str) -> None:
    raise ValueError(text)


def frames(n: int) -> Iterator[str]:
    for i in range(n):
        yield f"frame {i}"


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
    ops = q.plane.ops("default")
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
    lines = err.strip().splitlines()  # the remote traceback, then one line of error
    assert [ln for ln in lines if ln.startswith("lakeshore: ")] == lines[-1:], lines
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


# -- issue 18 item 7: a reader that goes away (| head) ends a command quietly ------------------


def cli_env(url: str, *path: str) -> dict[str, str]:
    """A ``lakeshore`` subprocess's environment: this checkout importable, and nothing else on
    the import path but ``path``; stdout buffered, as in a user's shell (a buffered line
    meets the closed pipe only when flushed, the case that escaped the command's own code)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONUNBUFFERED")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *path])
    env["LAKESHORE_URL"] = url
    return env


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """A store listing far more than a pipe holds (64 KiB on Linux), an invocation that
    printed and returned text, and one that streamed frames."""
    url = f"file://{tmp_path_factory.mktemp('crowded')}/plane"
    q = dls.Dispatch(url)
    said = q.udf(shout).submit("hello")
    streamed = q.udf(frames).submit(3)
    drain(q)
    q.udf(shout).map([str(i) for i in range(1500)])  # ~90 bytes a row in ls: ~135 KB
    return url, said, streamed


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "--limit", "5"],
        ["ls", "--limit", "5", "--json"],
        ["status"],
        ["status", "--json"],
        ["show", "{said}"],
        ["result", "{said}"],
        ["logs", "{said}"],
        ["tail", "{streamed}"],
        ["--help"],
    ],
    ids=lambda argv: "-".join(a.strip("{}-") for a in argv if a != "5"),
)
def test_a_command_whose_reader_is_gone_ends_quietly_with_141(
    crowded: tuple[str, str, str], argv: list[str]
) -> None:
    url, said, streamed = crowded
    argv = [a.format(said=said, streamed=streamed) for a in argv]
    read, write = os.pipe()
    os.close(read)  # gone before the first byte: whatever the command prints meets it
    with subprocess.Popen(
        [*LAKESHORE, *argv], stdout=write, stderr=subprocess.PIPE, env=cli_env(url), text=True
    ) as proc:
        os.close(write)
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141, err


@pytest.mark.parametrize("extra", [[], ["--json"]], ids=["table", "json"])
def test_ls_into_head_ends_quietly_with_141(
    crowded: tuple[str, str, str], extra: list[str]
) -> None:
    url, _, _ = crowded
    read, write = os.pipe()
    with subprocess.Popen(
        [*LAKESHORE, "ls", "--limit", "3000", *extra],
        stdout=write,
        stderr=subprocess.PIPE,
        env=cli_env(url),
        text=True,
    ) as proc:
        os.close(write)
        with open(read, "rb") as head:  # `| head -1`: one line, then the reader is gone
            first = head.readline()
        _, err = proc.communicate(timeout=120)
    assert first.startswith(b"{" if extra else b"ID ")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    # more than the pipe and one read hold: the command cannot have finished writing
    assert proc.returncode == 141, err


# -- issue 18 item 6: why a module cannot be imported -----------------------------------------

MODULES = {
    "raises_at_import.py": "settings: dict[str, int] = {}\nPORT = settings['port']\n",
    "bad_syntax.py": "def f(:\n    pass\n",
    "needs_a_dependency.py": "import no_such_dependency\n",
    "tasks_here.py": "import lakeshore as dls\n\n\n@dls.udf\ndef fn(x):\n    return x\n",
    "pkg_here/__init__.py": "",
    "pkg_here/jobs.py": "import lakeshore as dls\n\n\n@dls.udf\ndef fn(x):\n    return x\n",
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A folder holding modules, as a user's project folder does."""
    for name, text in MODULES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def lakeshore_in(folder: Path, *argv: str, here_on_path: bool) -> subprocess.CompletedProcess[str]:
    """``lakeshore ARGV`` run from ``folder``, with ``PYTHONPATH=.`` or without."""
    env = cli_env(f"file://{folder}/plane", *(["."] if here_on_path else []))
    return subprocess.run(
        [*LAKESHORE, *argv], cwd=folder, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "module, error",
    [
        ("raises_at_import", "KeyError: 'port'"),
        ("bad_syntax", "SyntaxError: "),
        ("needs_a_dependency", "ModuleNotFoundError: No module named 'no_such_dependency'"),
    ],
    ids=["raises", "syntax-error", "missing-dependency"],
)
def test_worker_import_of_a_module_that_fails_says_fix_the_module(
    folder: Path, module: str, error: str
) -> None:
    out = lakeshore_in(folder, "worker", "--import", module, here_on_path=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # the traceback only with --log-level debug
    assert lines[0].startswith(
        f"lakeshore: worker --import: {module!r} failed while importing ({error}"
    ), lines
    assert "— fix the module" in lines[0]
    assert "install the module here" not in lines[0] and "PYTHONPATH" not in lines[0]


def test_worker_import_logs_the_traceback_at_debug(folder: Path) -> None:
    out = lakeshore_in(
        folder, "worker", "--import", "raises_at_import", "--log-level", "debug", here_on_path=True
    )
    assert out.returncode == 2
    assert "Traceback" in out.stderr
    assert "raises_at_import.py" in out.stderr and "PORT = settings['port']" in out.stderr
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "lakeshore: worker --import: 'raises_at_import' failed while importing (KeyError"
        )
    )


@pytest.mark.parametrize("module", ["not_anywhere", "not_anywhere.jobs", "tasks_here.jobs"])
def test_worker_import_of_a_module_that_is_not_there_says_install_it(
    folder: Path, module: str
) -> None:
    out = lakeshore_in(folder, "worker", "--import", module, here_on_path=True)
    assert out.returncode == 2
    line = out.stderr.strip()
    assert line.startswith(
        f"lakeshore: worker --import: {module!r} is not importable here (ModuleNotFoundError: "
    ), line
    assert line.endswith("— install the module here or fix PYTHONPATH")


@pytest.mark.parametrize(
    "argv, beside",
    [
        (["worker", "--import", "tasks_here"], "./tasks_here.py"),
        (["worker", "--import", "pkg_here.jobs"], "./pkg_here/"),
        (["submit", "tasks_here:fn", "--args", "[1]"], "./tasks_here.py"),
    ],
    ids=["worker", "worker-package", "submit"],
)
def test_a_module_in_the_current_directory_says_pythonpath_dot(
    folder: Path, argv: list[str], beside: str
) -> None:
    argv += ["--idle-exit", "0", "--isolation", "thread"] if argv[0] == "worker" else []
    out = lakeshore_in(folder, *argv, here_on_path=False)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert f"{beside} is in the current directory" in lines[0]
    assert "— run the command as PYTHONPATH=. lakeshore" in lines[0]
    followed = lakeshore_in(folder, *argv, here_on_path=True)  # the hint, taken, works
    assert followed.returncode == 0, followed.stderr


def test_submit_of_a_module_that_fails_says_fix_the_module(folder: Path) -> None:
    out = lakeshore_in(folder, "submit", "raises_at_import:fn", here_on_path=True)
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "'raises_at_import' failed while importing (KeyError: 'port')" in line, line
    assert "— fix the module" in line and "where the worker runs" not in line


def test_doctor_without_credentials_names_the_request_and_the_cause(tmp_path: Path) -> None:
    """No credentials anywhere: one line that names the request that needed them (not the
    clock probe) and says what to check; nothing leaves this machine (a closed local port,
    no instance metadata)."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    url = "s3://bkt/pfx?endpoint_url=http://127.0.0.1:9&region=us-east-1"
    out = subprocess.run(
        [sys.executable, "-m", "lakeshore", "doctor", url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("lakeshore: put s3://bkt/pfx/"), line
    assert "NoCredentialsError" in line and "check the S3 URL, endpoint and credentials" in line
    assert "clock" not in line


@pytest.mark.parametrize("given", ["./tasks.py", "tasks.py", "pkg/tasks.py"])
def test_worker_import_of_a_file_path_asks_for_the_module_name(
    given: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks.py").write_text("")  # "tasks.py" is a path when that file is here

    code = main(["worker", "--import", given, "--url", f"file://{tmp_path}/s"])
    err = capsys.readouterr().err
    assert code == 2 and "is a file path, not a module name" in err, err
    name = "pkg.tasks" if given.startswith("pkg/") else "tasks"
    assert f"--import {name}," in err and "PYTHONPATH=." in err
    assert not (tmp_path / "s").exists(), "nothing was created"


def test_worker_import_of_a_submodule_named_py_is_a_module_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:

    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "py.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    argv = ["worker", "--import", "mypkg.py", "--url", ":memory:"]
    code = main([*argv, "--max-jobs", "1", "--idle-exit", "0"])
    err = capsys.readouterr().err
    assert code == 0 and "file path" not in err, err
