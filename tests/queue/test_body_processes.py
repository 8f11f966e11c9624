"""Body processes in process isolation: forked from a fork server that has imported
lakeshore, yet starting as a spawned child would, with the worker's environment of now."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

import lakeshore as dls
from lakeshore.store import MemoryStore
from tests import jobs
from tests.conftest import make_plane

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
