"""What docs/testing-your-code.md tells users about testing their own code holds: the moto
example, process isolation under ``mock_aws``, how ``run_worker`` drains, lambdas with a
timeout, and the default plane under ``LAKESHORE_URL=":memory:"``. The page's own examples
(its conftest.py and pytest files) run in tests/e2e/test_docs.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import lakeshore as dls
import lakeshore.dispatch
from tests import jobs


@pytest.fixture
def mocked_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto's in-process S3 with the bucket the page uses, as a user's test would set it up:
    no endpoint or profile, and no credentials but the fake ones mock_aws sets."""
    import boto3
    from moto import mock_aws

    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "LAKESHORE_S3_CLIENT"):
        monkeypatch.delenv(var, raising=False)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="test-bucket")
        yield


@pytest.mark.parametrize("url", ["s3://test-bucket/queue", "s3://test-bucket/queue?client=boto3"])
def test_the_mock_aws_example_runs(mocked_s3: None, url: str) -> None:
    q = dls.Dispatch(url)
    try:
        inv = q.udf(jobs.add_one).submit(4)
        assert dls.run_worker(q, once=True) == 1
        assert q.result(inv, timeout=0) == 5
    finally:
        q.store.close()


def test_process_isolation_works_under_mock_aws(mocked_s3: None) -> None:
    """The worker makes the S3 requests; the child process only runs the body."""
    q = dls.Dispatch("s3://test-bucket/queue?client=boto3", retry_backoff_s=0)
    try:
        nap = q.udf(jobs.sleep_sync)
        late = nap.submit(30, _timeout_s=0.5)
        quick = nap.submit(0, _timeout_s=30)
        assert dls.run_worker(q, idle_exit=0.05) == 2
        with pytest.raises(dls.TimedOut):
            q.result(late, timeout=0)
        assert q.result(quick, timeout=0) == "woke"
    finally:
        q.store.close()


def test_only_a_positive_idle_exit_waits_for_a_retry() -> None:
    q = dls.Dispatch(":memory:", retry_backoff_s=1.0)
    calls: list[int] = []

    @q.udf(max_attempts=2)
    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("not yet")
        return "ok"

    inv = flaky.submit()
    assert dls.run_worker(q, idle_exit=0) == 1
    assert q.status(inv) == "queued"  # backing off: a single pass does not wait for it
    assert dls.run_worker(q, max_jobs=2, idle_exit=0) == 0  # nor does max_jobs
    assert dls.run_worker(q, idle_exit=0.05) == 1
    assert q.result(inv, timeout=0) == "ok"


def test_a_backoff_of_zero_drains_in_one_pass() -> None:
    q = dls.Dispatch(":memory:", retry_backoff_s=0)
    inv = q.udf(jobs.fail_always).submit("no", _max_attempts=3)
    assert dls.run_worker(q, idle_exit=0) == 3
    with pytest.raises(dls.Failed) as caught:
        q.result(inv, timeout=0)
    assert caught.value.remote_type == "ValueError"
    assert "raise ValueError(msg)" in caught.value.remote_traceback


def test_a_nested_function_with_a_timeout_runs_in_a_thread_that_goes_on() -> None:
    """The page says so: the invocation ends as timeout, the body is not stopped."""
    q = dls.Dispatch(":memory:")
    release, finished = threading.Event(), threading.Event()

    @q.udf
    def stuck() -> None:
        release.wait(30)
        finished.set()

    inv = stuck.submit(_timeout_s=0.2)
    assert dls.run_worker(q, once=True) == 1
    assert q.status(inv) == "timeout"
    assert not finished.is_set()  # still running in the worker's thread
    release.set()
    assert finished.wait(10)


def test_the_default_plane_is_chosen_once_per_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # this process's default plane, as if nothing had used it yet (restored afterwards)
    monkeypatch.setattr(lakeshore.dispatch, "_default", None)
    monkeypatch.setenv("LAKESHORE_URL", ":memory:")

    @dls.udf
    def double(x: int) -> int:
        return 2 * x

    inv = double.submit(21)
    plane = dls.default_plane()
    assert double.plane is plane and plane.url == ":memory:"
    with pytest.raises(dls.NotFound):
        dls.Dispatch().result(inv)  # another, empty memory store

    monkeypatch.setenv("LAKESHORE_URL", f"file://{tmp_path}/plane")  # too late: ignored
    again = double.submit(1)
    assert dls.default_plane() is plane and double.plane is plane
    assert dls.run_worker(plane, idle_exit=0.05) == 2
    assert [plane.result(i, timeout=0) for i in (inv, again)] == [42, 2]
    assert not (tmp_path / "plane").exists()
