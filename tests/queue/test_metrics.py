"""``lakeshore metrics`` and a worker's counters file, read back with prometheus_client's
own parser: the values of a queue whose states are known, hostile label text, the atomic
file write, and the loopback server whose scrapes share one census per interval."""

from __future__ import annotations

import logging
import os
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import lakeshore as dls
from lakeshore import codec
from lakeshore.cli.metrics import census_families
from lakeshore.keys import worker_key
from lakeshore.model.metrics import Family, exposition
from lakeshore.protocol.claims import Claimer
from lakeshore.running import metrics as running_metrics
from lakeshore.running import metrics_server
from lakeshore.running.metrics import write_textfile
from lakeshore.running.metrics_server import MetricsServer
from lakeshore.store import MemoryStore
from tests import jobs
from tests.commands import run
from tests.tiers import make_plane
from tests.waiting import poll


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``text`` as parsed by prometheus_client: (name, labels) -> value."""
    out = {}
    for fam in text_string_to_metric_families(text):
        assert fam.documentation, f"{fam.name} has no HELP"
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def _known_states(q: dls.Dispatch) -> None:
    """default: 3 succeeded, 1 failed, 1 running, 2 queued; the worker that ran them stopped."""
    add, fail = q.udf(jobs.add_one), q.udf(jobs.fail_always)
    for i in range(3):
        add.submit(i)
    fail.submit("boom", _max_attempts=1)
    assert dls.run_worker(q, isolation="thread", max_jobs=4, worker_id="w-old") == 4
    for i in range(3):
        add.submit(i)
    held = Claimer(q.plane.ops("default"), "w-claims").claim(q.store.now())
    assert held is not None


def test_metrics_parse_and_count_a_queue_of_known_states(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    _known_states(q)
    life = {
        "worker": "w-live",
        "seen_at": q.store.now(),
        "status": "running",
        "queues": ["default"],
    }
    life |= {"running": 1, "done": 7, "failed": 7}
    q.store.put(worker_key(q.ns, "w-live"), codec.encode(life))
    code, out, err = run(capsys, "metrics")
    assert code == 0, err
    found = samples(out)
    at = {"namespace": "default", "queue": "default"}
    assert value(found, "lakeshore_queue_queued", **at) == 2
    assert value(found, "lakeshore_queue_running", **at) == 1
    assert value(found, "lakeshore_queue_counts_estimated", **at) == 0
    assert value(found, "lakeshore_queue_oldest_queued_seconds", **at) >= 0
    assert value(found, "lakeshore_queue_recent_invocations", **at) == 7
    for state, n in {"succeeded": 3, "failed": 1, "running": 1, "queued": 2, "killed": 0}.items():
        assert value(found, "lakeshore_queue_recent", **at, state=state) == n
    assert value(found, "lakeshore_queue_workers", **at) == 1  # w-old has stopped
    assert value(found, "lakeshore_workers_alive", namespace="default") == 1
    worker = {"namespace": "default", "worker": "w-old"}
    assert value(found, "lakeshore_seen_worker_attempts_total", **worker) == 4
    assert value(found, "lakeshore_seen_worker_running", **worker) == 0
    live = {"namespace": "default", "worker": "w-live"}
    assert value(found, "lakeshore_seen_worker_attempts_total", **live) == 7
    assert value(found, "lakeshore_seen_worker_failed_total", **live) == 7  # fails everything
    assert value(found, "lakeshore_seen_worker_failed_total", **worker) == 1  # of its 4
    types = {f.name: f.type for f in text_string_to_metric_families(out)}
    assert types["lakeshore_queue_queued"] == "gauge"
    assert types["lakeshore_seen_worker_attempts"] == "counter"  # the parser drops _total
    assert all(name.startswith("lakeshore_") for name in types)

    # a named queue that holds nothing is all zeros, not missing series
    code, out, err = run(capsys, "metrics", "empty", "--recent", "0")
    assert code == 0
    found = samples(out)
    empty = {"namespace": "default", "queue": "empty"}
    assert value(found, "lakeshore_queue_queued", **empty) == 0
    assert value(found, "lakeshore_queue_oldest_queued_seconds", **empty) == 0
    assert ("lakeshore_queue_queued", frozenset(at.items())) not in found


HOSTILE = [
    'a"b',
    "back\\slash",
    "new\nline",
    '"} lakeshore_queue_queued{queue="x"} 999\n# TYPE',
    "é—\u202e\u0000",
    "x" * 1000,
]


def test_hostile_worker_names_stay_inside_their_labels(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    q.udf(jobs.add_one).submit(1)
    now = q.store.now()
    for i, name in enumerate([*HOSTILE, 'a"b']):  # the last one repeats a name
        life = {"worker": name, "seen_at": now - i, "status": name, "running": i, "done": i}
        life |= {"queues": ["default", "bad queue", 5]}
        q.store.put(worker_key(q.ns, f"w{i}"), codec.encode(life))
    code, out, err = run(capsys, "metrics")
    assert code == 0, err
    found = samples(out)  # parses; no duplicate series
    names = {
        dict(labels)["worker"]: v
        for (n, labels), v in found.items()
        if n == "lakeshore_seen_worker_running"
    }
    assert names['a"b'] == 0  # the newest of the two claims is kept
    assert names["back\\slash"] == 1 and names["new\nline"] == 2
    assert names['"} lakeshore_queue_queued{queue="x"} 999\n# TYPE'] == 3
    assert names["x" * 255 + "…"] == 5  # cut
    queues = {dict(labels).get("queue") for (n, labels), _ in found.items()}
    assert queues == {None, "default"}  # neither "bad queue" nor the injected "x"
    assert value(found, "lakeshore_queue_queued", namespace="default", queue="default") == 1
    assert value(found, "lakeshore_queue_workers", namespace="default", queue="default") == 7


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(exclude_categories=()), max_size=80))
def test_any_label_text_parses_back_to_itself(text: str) -> None:
    fam = Family("lakeshore_test", "help with \\ and \n in it")
    fam.add(1.5, worker=text)
    parsed = list(text_string_to_metric_families(exposition([fam])))
    assert [f.documentation for f in parsed] == ["help with \\ and \n in it"]
    expected = text.encode("utf-8", "backslashreplace").decode("utf-8")
    assert parsed[0].samples[0].labels == {"worker": expected}
    assert parsed[0].samples[0].value == 1.5


def test_textfile_is_written_atomically(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = dls.Dispatch(url)
    _known_states(q)
    folder = Path(url.removeprefix("file://")).parent / "textfiles"
    folder.mkdir()
    path = folder / "lakeshore.prom"
    path.write_text("old\n")
    code, out, err = run(capsys, "metrics", "--textfile", str(path))
    assert code == 0 and out == "", err
    found = samples(path.read_text())
    assert value(found, "lakeshore_queue_queued", namespace="default", queue="default") == 2
    assert sorted(os.listdir(folder)) == ["lakeshore.prom"]  # no temporary file left
    assert path.stat().st_mode & 0o777 == 0o644  # the collector may be another user

    code, _, err = run(capsys, "metrics", "--textfile", str(folder / "no" / "x.prom"))
    assert code == 2 and "no folder" in err


def test_a_reader_never_sees_a_half_written_textfile(tmp_path: Path) -> None:
    path = tmp_path / "m.prom"
    texts = [f"# {i}\n" + ("x" * 1023 + "\n") * 512 for i in range(2)]  # 512 KiB each
    write_textfile(path, texts[0])
    stop, seen = threading.Event(), set()

    def reader() -> None:
        while not stop.is_set():
            seen.add(path.read_text())

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(40):
            write_textfile(path, texts[i % 2])
    finally:
        stop.set()
        t.join()
    assert seen <= set(texts)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.prom"
    write_textfile(path, "old\n")

    def refuse(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(running_metrics.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        write_textfile(path, "new\n")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["m.prom"]


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    def list(self, prefix: str = "", start_after: str | None = None) -> Any:
        self.requests += 1
        return super().list(prefix, start_after)

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self.requests += 1
        return super().get(key, max_bytes)


def _scrape(url: str, host: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def test_serve_answers_on_loopback_with_one_census_per_interval() -> None:
    store = CountingStore()
    q = make_plane(store)
    q.udf(jobs.add_one).submit(1)
    clock = [1000.0]
    server = MetricsServer(
        lambda: exposition(census_families(q, None)),
        port=0,
        interval_s=10.0,
        monotonic=lambda: clock[0],
    )
    server.start()
    try:
        assert server.httpd.server_address[0] == "127.0.0.1"
        status, ctype, text = _scrape(server.url)
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        assert (
            value(samples(text), "lakeshore_queue_queued", namespace="default", queue="default")
            == 1
        )
        one_census = store.requests
        assert one_census > 0
        results: list[str] = []
        threads = [
            threading.Thread(target=lambda: results.append(_scrape(server.url)[2]))
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [text] * 8  # the copy: the store saw nothing more
        assert store.requests == one_census and server.censuses == 1

        q.udf(jobs.add_one).submit(2)
        clock[0] += 10.0  # the interval passed: the next scrape makes a new census
        found = samples(_scrape(server.url)[2])
        assert value(found, "lakeshore_queue_queued", namespace="default", queue="default") == 2
        assert server.censuses == 2

        assert _scrape(server.url, host="evil.example")[0] == 421  # DNS rebinding
        assert _scrape(server.url, host=f"localhost:{server.port}")[0] == 200
        assert _scrape(server.url.replace("/metrics", "/other"))[0] == 404
        assert server.censuses == 2
    finally:
        server.close()


def test_a_failed_census_answers_503_for_the_interval() -> None:
    calls = []

    def collect() -> str:
        calls.append(1)
        raise dls.StoreError("census", "the store is down", "try later")

    clock = [0.0]
    server = MetricsServer(collect, port=0, interval_s=5.0, monotonic=lambda: clock[0])
    server.start()
    try:
        assert _scrape(server.url)[0] == 503
        assert _scrape(server.url)[0] == 503
        assert len(calls) == 1
    finally:
        server.close()


def test_a_worker_writes_its_counters(tmp_path: Path) -> None:
    q = make_plane(MemoryStore())
    add, fail = q.udf(jobs.add_one), q.udf(jobs.fail_always)
    for i in range(2):
        add.submit(i)
    fail.submit("boom", _max_attempts=1)
    fail.submit("again", _max_attempts=2)  # its first attempt leaves it queued for a retry
    path = tmp_path / "worker.prom"
    done = dls.run_worker(
        q, isolation="thread", max_jobs=4, worker_id='w"1', metrics_textfile=str(path)
    )
    assert done == 4
    found = samples(path.read_text())
    who = {"namespace": "default", "worker": 'w"1', "queue": "default"}
    assert value(found, "lakeshore_worker_attempts_total", **who, outcome="succeeded") == 2
    assert value(found, "lakeshore_worker_attempts_total", **who, outcome="failed") == 1
    assert value(found, "lakeshore_worker_attempts_total", **who, outcome="queued") == 1
    assert value(found, "lakeshore_worker_running", **who) == 0
    stamp = value(
        found,
        "lakeshore_worker_last_write_timestamp_seconds",
        **{k: who[k] for k in ("namespace", "worker")},
    )
    assert stamp > 0
    assert os.listdir(tmp_path) == ["worker.prom"]


def test_the_worker_command_takes_a_metrics_textfile(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    q.udf(jobs.add_one).submit(1)
    path = tmp_path / "w.prom"
    code, _, err = run(
        capsys,
        *("worker", "--allow", "tests.jobs:*", "--isolation", "thread", "--max-jobs", "1"),
        *("--worker-id", "cli", "--metrics-textfile", str(path)),
    )
    assert code == 0, err
    found = samples(path.read_text())
    who = {"namespace": "default", "worker": "cli", "queue": "default"}
    assert value(found, "lakeshore_worker_attempts_total", **who, outcome="succeeded") == 1


def test_label_values_that_escape_alike_are_one_series() -> None:
    """Two signs of life whose names differ only past the cut, or a lone surrogate and the
    text of its escape, would be written as the same series: a duplicate that makes
    Prometheus (and node_exporter's textfile collector) refuse the whole scrape."""
    fam = Family("lakeshore_test", "names that escape alike")
    fam.add(1, worker="x" * 300 + "a")
    fam.add(2, worker="x" * 300 + "b")
    fam.add(3, worker="\udc80")
    fam.add(4, worker="\\udc80")
    found = samples(exposition([fam]))  # asserts there is no duplicate series
    assert value(found, "lakeshore_test", worker="x" * 255 + "…") == 1  # the first stays
    assert value(found, "lakeshore_test", worker="\\udc80") == 3
    assert len(found) == 2


def test_a_released_attempt_is_counted_as_released(tmp_path: Path) -> None:
    """The outcome label is the state word the docs list (``released``), not the attempt's
    log text ("released (queued again, attempt not counted)")."""
    q = make_plane(MemoryStore())
    started, release = threading.Event(), threading.Event()

    def held() -> str:
        started.set()
        release.wait(60)
        return "late"

    q.udf(held).submit()
    stop, path = threading.Event(), tmp_path / "worker.prom"
    t = threading.Thread(
        target=dls.run_worker,
        args=(q,),
        kwargs={
            "isolation": "thread",
            "stop": stop,
            "grace_s": 0.0,
            "worker_id": "w",
            "metrics_textfile": str(path),
        },
    )
    t.start()
    try:
        assert started.wait(30)
        stop.set()
        t.join(30)
        assert not t.is_alive()
    finally:
        release.set()
    found = samples(path.read_text())
    outcomes = {
        dict(labels)["outcome"]: v
        for (name, labels), v in found.items()
        if name == "lakeshore_worker_attempts_total"
    }
    assert outcomes == {"released": 1}


def test_serve_on_a_taken_or_impossible_port_is_a_usage_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dls.Dispatch(url).udf(jobs.add_one).submit(1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run(capsys, "metrics", "--serve", "--port", str(port))
    assert code == 2 and f"127.0.0.1:{port}" in err and "— pick another port" in err
    code, _, err = run(capsys, "metrics", "--serve", "--port", "70000")
    assert code == 2 and "— pick another port" in err


def test_textfile_loop_outlives_a_store_that_is_down_even_at_the_first_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lakeshore.cli.metrics import _textfile

    path = tmp_path / "m.prom"
    rounds = iter(
        [
            dls.StoreError("census", "the store is down", "check the endpoint"),
            "# round 2\n",
            dls.StoreError("census", "down again", "check the endpoint"),
            KeyboardInterrupt(),  # Ctrl-C
        ]
    )

    def collect() -> str:
        got = next(rounds)
        if isinstance(got, BaseException):
            raise got
        return got

    assert _textfile(collect, str(path), 0.001) == 0
    assert path.read_text() == "# round 2\n"  # the failed third round left it in place
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and "the store is down" in said[0] and "down again" in said[1]
    # without --interval a failed census is the command's error
    with pytest.raises(dls.StoreError):
        _textfile(collect_failing, str(path), None)
    # once, a path that cannot be written is a usage error
    with pytest.raises(dls.InvalidArgument, match="no folder"):
        _textfile(lambda: "x\n", str(tmp_path / "no" / "m.prom"), None)
    # in the loop (whose folder the command checked first), a failed write is said, and
    # the next round writes again: a full disk, a folder removed and made again
    gone = tmp_path / "gone"
    gone.mkdir()
    writes = iter(["# 1\n", "# 2\n", "# 3\n", KeyboardInterrupt()])

    def collect_and_toggle() -> str:
        got = next(writes)
        if isinstance(got, BaseException):
            raise got
        if got == "# 2\n":
            (gone / "m.prom").unlink()
            gone.rmdir()
        elif got == "# 3\n":
            gone.mkdir()
        return got

    capsys.readouterr()
    assert _textfile(collect_and_toggle, str(gone / "m.prom"), 0.001) == 0
    assert (gone / "m.prom").read_text() == "# 3\n"
    assert "no folder" in capsys.readouterr().err


def collect_failing() -> str:
    raise dls.StoreError("census", "the store is down", "check the endpoint")


def test_a_worker_refuses_a_textfile_without_a_folder_before_it_claims(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    inv = q.udf(jobs.add_one).submit(1)
    where = tmp_path / "typo" / "worker.prom"
    with pytest.raises(dls.InvalidArgument, match="no folder") as e:
        dls.run_worker(q, once=True, isolation="thread", metrics_textfile=where)
    assert e.value.op == "run_worker"
    code, _, err = run(
        capsys,
        "worker",
        "--idle-exit",
        "0",
        "--allow",
        "tests.jobs:*",
        "--metrics-textfile",
        str(where),
    )
    assert code == 2 and "no folder" in err
    assert q.status(inv) == "queued"  # nothing was claimed


def test_a_census_that_fails_unexpectedly_still_holds_the_interval(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls = []

    def broken() -> str:
        calls.append(1)
        raise KeyError("a defect")

    clock = [0.0]
    server = MetricsServer(broken, port=0, interval_s=10.0, monotonic=lambda: clock[0])
    server.start()
    try:
        for _ in range(3):
            status, _, text = _scrape(server.url)
            assert status == 500 and "failed unexpectedly" in text
        assert len(calls) == 1  # not one census per scrape
        clock[0] += 10.0
        assert _scrape(server.url)[0] == 500 and len(calls) == 2
    finally:
        server.close()
    assert "KeyError: 'a defect'" in capsys.readouterr().err


def test_a_worker_serves_its_counters_on_loopback_while_it_runs(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lakeshore.worker")
    q = dls.Dispatch(url)
    q.udf(jobs.add_one).submit(1)
    stop = threading.Event()
    w = threading.Thread(
        target=dls.run_worker,
        args=(q,),
        kwargs={
            "worker_id": "w9",
            "metrics_port": 0,
            "stop": stop,
            "isolation": "thread",
            "allow": ["tests.jobs:*"],
        },
    )
    w.start()
    try:

        def start_line() -> list[str]:
            return [m for m in caplog.messages if "metrics on" in m]

        poll(lambda: start_line() != [], 30, "the worker's start line")
        where = start_line()[0].rsplit("metrics on ", 1)[1]
        assert where.startswith("http://127.0.0.1:") and where.endswith("/metrics")
        done = frozenset(
            {
                "namespace": "default",
                "worker": "w9",
                "queue": "default",
                "outcome": "succeeded",
            }.items()
        )
        poll(
            lambda: samples(_scrape(where)[2]).get(("lakeshore_worker_attempts_total", done)) == 1,
            30,
            "the attempt counted on the served page",
        )
        assert _scrape(where, host="evil.example")[0] == 421  # DNS rebinding: refused
    finally:
        stop.set()
        w.join(30)
    assert not w.is_alive()
    with pytest.raises(urllib.error.URLError):  # the port is closed at the stop
        urllib.request.urlopen(where, timeout=5)


def test_a_worker_whose_metrics_port_is_taken_fails_its_start(url: str) -> None:
    q = dls.Dispatch(url)
    inv = q.udf(jobs.add_one).submit(1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(dls.InvalidArgument, match="pick another port") as e:
            dls.run_worker(q, once=True, isolation="thread", metrics_port=port)
    assert e.value.op == "run_worker" and q.status(inv) == "queued"


def test_textfile_loop_of_named_queues_outlives_a_store_that_is_down_at_the_start(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service started at boot names its queues; the store is not up yet. The look for
    an unknown queue name before the loop must not end the service the loop would keep."""
    import time
    import types

    from lakeshore.store.local import LocalStore

    dls.Dispatch(url).udf(jobs.add_one).submit(1)
    down = [True]
    real_list = LocalStore.list

    def listing(self: LocalStore, prefix: str = "", start_after: str | None = None) -> Any:
        if down[0]:
            raise dls.StoreError("list", "the store is down", "check the endpoint")
        return real_list(self, prefix, start_after)

    rounds: list[float] = []

    def between_rounds(s: float) -> None:  # the loop's wait: the store comes up, then Ctrl-C
        rounds.append(s)
        down[0] = False
        if len(rounds) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(LocalStore, "list", listing)
    fake_time = types.SimpleNamespace(sleep=between_rounds, monotonic=time.monotonic)
    monkeypatch.setattr("lakeshore.cli.metrics.time", fake_time)
    path = tmp_path / "m.prom"
    code, _, err = run(capsys, "metrics", "default", "--textfile", str(path), "--interval", "5")
    assert code == 0, err
    assert "the store is down" in err and rounds == [5.0, 5.0]
    found = samples(path.read_text())
    assert value(found, "lakeshore_queue_queued", namespace="default", queue="default") == 1


def test_a_worker_interrupted_while_it_stops_still_frees_its_metrics_port(url: str) -> None:
    """A second Ctrl-C that lands in the stop's last steps (here: in the on_stop hook; in a
    notebook, while tickets are tidied) must not leave the port served by a thread of the
    process: the next run_worker on that port would be refused."""
    q = dls.Dispatch(url)
    q.udf(jobs.add_one).submit(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dls.run_worker(q, once=True, isolation="thread", metrics_port=port, on_stop=interrupted)
    assert not [t for t in threading.enumerate() if t.name == "lakeshore-metrics"]
    with socket.socket() as again:  # free: a new worker may serve on it
        again.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    "argv",
    [["--interval", "5"], ["--port", "9400"], ["--textfile", "m.prom", "--port", "9400"]],
)
def test_a_metrics_option_that_would_be_dropped_is_refused(
    url: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Printed once, `--interval` and `--port` would do nothing: a user who gave them
    expects a loop or a port, so the command says it instead of printing once."""
    dls.Dispatch(url).udf(jobs.add_one).submit(1)
    code, out, err = run(capsys, "metrics", *argv)
    assert code == 2 and out == "" and " — " in err, err


def test_a_textfile_loop_refuses_a_missing_folder_before_its_first_census(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in the folder is said at once, even while the store is down (the census of
    the first round fails): not hours later, when the store answers."""
    dls.Dispatch(url).udf(jobs.add_one).submit(1)

    def down(*_: Any, **__: Any) -> Any:
        raise dls.StoreError("census", "the store is down", "check the endpoint")

    def between_rounds(s: float) -> None:
        raise AssertionError("looped with a file it can never write")

    import time
    import types

    monkeypatch.setattr("lakeshore.cli.metrics.census_families", down)
    fake_time = types.SimpleNamespace(sleep=between_rounds, monotonic=time.monotonic)
    monkeypatch.setattr("lakeshore.cli.metrics.time", fake_time)
    where = str(tmp_path / "typo" / "m.prom")
    code, _, err = run(capsys, "metrics", "--textfile", where, "--interval", "5")
    assert code == 2 and "no folder" in err


def test_a_silent_connection_is_closed_and_frees_its_thread() -> None:
    server = MetricsServer(lambda: "# nothing\n", port=0, interval_s=0)
    handler: Any = server.httpd.RequestHandlerClass
    assert handler.timeout == metrics_server.IDLE_TIMEOUT_S == 30  # on by default
    handler.timeout = 0.2  # the same, faster
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as quiet:
            assert quiet.recv(1) == b""  # closed by the server, not left hanging
        assert _scrape(server.url)[0] == 200  # and the server still answers
    finally:
        server.close()
