"""Pickle-free means no code from a submitter runs on a worker (issue 15, item 7).

A worker runs only declared bodies: functions registered on its plane, ``@udf`` functions of
modules it has imported, and what its operator allows (``run_worker(allow=...)``,
``lakeshore worker --allow``). Anything else a record names ends as a terminal ``failed``
with the reason, and is never imported or called. Each refusal test proves the function did
not run: its payload would have created a file.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.model.record import Record
from lakeshore.running.bodies import Allow, load_body
from lakeshore.store import MemoryStore, Store
from tests import jobs
from tests.tiers import make_plane, record_key
from tests.waiting import poll

ROOT = Path(__file__).resolve().parents[2]
CANARY = "tests.trust_canary"
ISOLATIONS = ["thread", "process"]


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tests.trust_canary`` not imported, before and after; the file its imports go to."""
    mark = tmp_path / "canary-imports"
    monkeypatch.setenv("LAKESHORE_TEST_CANARY", str(mark))

    def forget() -> None:
        sys.modules.pop(CANARY, None)
        if hasattr(sys.modules["tests"], "trust_canary"):
            delattr(sys.modules["tests"], "trust_canary")

    forget()
    yield mark
    forget()


def _hand_written(producer: Any, fn: str, *args: Any) -> str:
    """An invocation whose record names ``fn``, as anyone who may write to the bucket can
    make one: a submit of a harmless function, its record (the ticket's content, before
    any claim) then rewritten (a plain put)."""
    inv: str = producer.udf(jobs.echo).submit(*args)
    key = record_key(producer.plane.ops("default"), inv)
    rec = Record.from_bytes(producer.store.get(key)[0])
    producer.store.put(key, dataclasses.replace(rec, fn=fn).to_bytes())
    return inv


def _refused(producer: Any, inv: str) -> str:
    """The invocation failed at once, for good, as undeclared; returns the reason."""
    rec = producer.get(inv)
    assert (rec.state, rec.attempt, rec.max_attempts) == ("failed", 1, 3), rec
    assert rec.error is not None and rec.error["type"] == "UnknownFunction", rec.error
    reason: str = rec.error["message"]
    assert "is not a declared body on this worker" in reason, reason
    assert "nothing was imported or called" in reason, reason
    with pytest.raises(dls.Failed, match="UnknownFunction"):
        producer.result(inv, timeout=5)
    return reason


# -- (1) a producer submits a builtin --------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_exec_submitted_by_a_producer_fails_without_running(
    atomic_store: Store, tmp_path: Path, isolation: str
) -> None:
    producer, worker = make_plane(atomic_store), make_plane(atomic_store)
    flag = tmp_path / "ran"
    inv = producer.udf(exec).submit(f"open({str(flag)!r}, 'w').write('ran')")
    assert dls.run_worker(worker, once=True, isolation=isolation) == 1
    assert not flag.exists()  # exec was never called
    reason = _refused(producer, inv)
    assert "builtins:exec" in reason and "not decorated with @udf" in reason
    assert "--import" in reason and "--allow" in reason  # what to do about it


# -- (2) hand-written records ----------------------------------------------------------------


def _cases(flag: Path) -> list[tuple[str, tuple[Any, ...], str]]:
    """(ref, arguments that would create ``flag``, what the reason says)."""
    touch = f"open({str(flag)!r}, 'w').close()"
    return [
        ("os:system", (f"touch {flag}",), "not decorated with @udf"),
        ("subprocess:run", (["touch", str(flag)],), "not decorated with @udf"),
        ("builtins:eval", (touch,), "not decorated with @udf"),
        ("builtins:exec", (touch,), "not decorated with @udf"),
        ("tests.jobs:once_marker", (str(flag),), "not decorated with @udf"),  # undecorated
        ("tests.jobs:os.system", (f"touch {flag}",), "'os' in it is a module"),  # walks into os
        ("os:system.__call__", (f"touch {flag}",), "dunder"),
        ("lakeshore:__builtins__.exec", (touch,), "dunder"),
        ("tests.trust_canary:touch", (str(flag),), "is not imported on this worker"),
        ("tests.trust_canary", (str(flag),), "not module:qualname"),
    ]


@pytest.mark.parametrize("case", range(10))
def test_a_hand_written_record_naming_an_undeclared_function_fails_without_running(
    atomic_store: Store, tmp_path: Path, canary: Path, case: int
) -> None:
    flag = tmp_path / "ran"
    ref, args, why = _cases(flag)[case]
    producer, worker = make_plane(atomic_store), make_plane(atomic_store)
    inv = _hand_written(producer, ref, *args)
    assert CANARY not in sys.modules
    assert dls.run_worker(worker, once=True, isolation="thread") == 1
    assert not flag.exists()  # never called
    assert CANARY not in sys.modules and not canary.exists()  # never imported
    reason = _refused(producer, inv)
    assert why in reason, reason


def test_an_undeclared_function_is_refused_before_a_child_process_starts(
    tmp_path: Path, canary: Path
) -> None:
    producer = worker = make_plane(MemoryStore())
    flag = tmp_path / "ran"
    inv = _hand_written(producer, "tests.trust_canary:touch", str(flag))
    assert dls.run_worker(worker, once=True, isolation="process") == 1
    assert not flag.exists() and not canary.exists()  # no process imported the module
    assert "is not imported on this worker" in _refused(producer, inv)


# -- (3) the operator's allow-list -----------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_allow_list_admits_a_plain_function_and_a_module_not_yet_imported(
    tmp_path: Path, canary: Path, isolation: str
) -> None:
    store = MemoryStore()
    producer, worker = make_plane(store), make_plane(store)
    plain = producer.udf(jobs.once_marker).submit(str(tmp_path / "plain"))
    fresh = _hand_written(producer, "tests.trust_canary:touch", str(tmp_path / "fresh"))
    allow = ["tests.jobs:once_marker", "tests.trust_*:*"]
    assert CANARY not in sys.modules
    n = dls.run_worker(worker, max_jobs=2, idle_exit=0, isolation=isolation, allow=allow)
    assert n == 2
    assert producer.result(plain, timeout=5) == str(tmp_path / "plain")
    pid = producer.result(fresh, timeout=5)
    assert (tmp_path / "fresh").read_text() == "ran"
    imported_by = {int(p) for p in canary.read_text().split()}
    assert pid in imported_by  # the process that ran it imported the module
    assert (pid == os.getpid()) == (isolation == "thread")


def test_an_allow_pattern_admits_only_what_its_module_defines(tmp_path: Path) -> None:
    store = MemoryStore()
    producer, worker = make_plane(store), make_plane(store)
    flag = tmp_path / "ran"
    via_module = _hand_written(producer, "tests.jobs:os.system", f"touch {flag}")
    imported = _hand_written(producer, "tests.jobs:Path", str(flag))  # pathlib's, not jobs'
    other = _hand_written(producer, "tests.tiers:make_plane", 1)  # imported, not allowed
    allow = ["tests.jobs:*"]
    assert dls.run_worker(worker, max_jobs=3, idle_exit=0, isolation="thread", allow=allow) == 3
    assert not flag.exists()
    assert "'os' in it is a module" in _refused(producer, via_module)
    assert "defined in pathlib, not in tests.jobs" in _refused(producer, imported)
    assert "not decorated with @udf" in _refused(producer, other)


@pytest.mark.parametrize(
    "pattern", ["tests.jobs", ":add_one", "tests.jobs:", "tests.jobs:__*", "a:b:c", "", 7]
)
def test_a_malformed_allow_pattern_is_refused_at_start(pattern: Any) -> None:
    with pytest.raises(dls.InvalidArgument, match="allow"):
        dls.run_worker(make_plane(MemoryStore()), once=True, allow=[pattern])


# -- (4) declared bodies keep working ---------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_decorated_function_of_an_imported_module_runs_without_an_allow_list(
    tmp_path: Path, canary: Path, isolation: str
) -> None:
    store = MemoryStore()
    producer, worker = make_plane(store), make_plane(store)
    module = importlib.import_module(CANARY)  # what `lakeshore worker --import` does
    inv = producer.udf(module.stamp.fn).submit(str(tmp_path / "stamped"))
    assert producer.get(inv).fn == "tests.trust_canary:stamp"
    assert dls.run_worker(worker, once=True, isolation=isolation) == 1
    pid = producer.result(inv, timeout=5)
    assert (tmp_path / "stamped").read_text() == "ran"
    assert (pid == os.getpid()) == (isolation == "thread")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_function_registered_on_the_worker_plane_runs(isolation: str) -> None:
    store = MemoryStore()
    producer, worker = make_plane(store), make_plane(store)
    worker.udf(jobs.add_one)  # the worker's own declaration
    inv = producer.udf(jobs.add_one).submit(41)
    assert dls.run_worker(worker, once=True, isolation=isolation) == 1
    assert producer.result(inv, timeout=5) == 42


def test_a_child_runs_only_jobs_its_parent_approved() -> None:
    from lakeshore.codec import encode
    from lakeshore.running.bodies import BodyKind
    from lakeshore.running.child import BodyCall, ChildProcess, Hooks

    store = MemoryStore()
    producer = make_plane(store)
    inv = producer.udf(jobs.add_one).submit(1)
    rec = producer.get(inv)
    child = ChildProcess(Hooks())
    try:
        import threading

        stop = threading.Event()
        call = BodyCall(rec.fn, None, BodyKind.SYNC, encode(((1,), {})), None, rec)  # not approved
        out = child.run(call, stop, lambda _: None, None)
        assert out.verdict == "error" and out.error is not None
        assert out.error["type"].endswith("UnknownFunction"), out.error
        assert "did not approve" in out.error["message"]
        ok = child.run(dataclasses.replace(call, approved=True), stop, lambda _: None, None)
        assert ok.verdict == "ok"
    finally:
        child.close()


def test_a_module_another_thread_is_importing_is_waited_for_not_judged_half_made() -> None:
    """Found by the crash suite: slots of a worker with ``--allow`` met the module one of
    them was importing, in sys.modules without its functions yet, and failed the invocation."""
    name = "tests.trust_slow"
    sys.modules.pop(name, None)
    jobs.IMPORT_GATE.clear()
    importer = threading.Thread(target=importlib.import_module, args=(name,), daemon=True)
    importer.start()
    try:
        poll(lambda: name in sys.modules, 30, "the import under way")
        found: dict[str, Any] = {}

        def load(ref: str, allow: list[str]) -> None:
            try:
                found[ref] = load_body(ref, {}, Allow(allow))
            except Exception as e:
                found[ref] = e

        loaders = [
            threading.Thread(target=load, args=(f"{name}:body", [f"{name}:*"]), daemon=True),
            threading.Thread(target=load, args=(f"{name}:stamp", []), daemon=True),
        ]
        for t in loaders:
            t.start()
        for t in loaders:
            t.join(1.0)  # bounded: they must still be waiting for the import, not done
        assert all(t.is_alive() for t in loaders), found
    finally:
        jobs.IMPORT_GATE.set()
        importer.join(30)
    for t in loaders:
        t.join(30)
    assert found[f"{name}:body"]() == "plain"
    assert isinstance(found[f"{name}:stamp"], dls.Udf) and found[f"{name}:stamp"]() == "decorated"
    sys.modules.pop(name, None)


# -- (5) the command line ------------------------------------------------------------------


def test_worker_command_allow_flag_admits_only_the_patterns_given(
    tmp_path: Path, canary: Path
) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    allowed = _hand_written(q, "tests.trust_canary:touch", str(tmp_path / "allowed"))
    refused = q.udf(jobs.once_marker).submit(str(tmp_path / "refused"))
    env = {
        **os.environ,
        "LAKESHORE_URL": url,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    command = [sys.executable, "-m", "lakeshore", "worker", "--isolation", "thread"]
    command += ["--allow", "tests.trust_canary:*", "--max-jobs", "2", "--idle-exit", "5"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert q.result(allowed, timeout=5) != os.getpid()
    assert (tmp_path / "allowed").read_text() == "ran"
    assert not (tmp_path / "refused").exists()
    reason = _refused(q, refused)
    assert "tests.jobs is not imported on this worker" in reason
    assert "--allow 'tests.jobs:once_marker'" in reason

    bad = subprocess.run(
        [*command[:4], "--allow", "no-colon", "--idle-exit", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--allow" in bad.stderr, bad.stderr
