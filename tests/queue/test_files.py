"""Bodies and I/O: dls.scope, dls.run.read and dls.run.write on memory://, file:// and s3://
(SeaweedFS) data roots — producer writes an input, the body reads it and writes outputs,
the producer reads them back by key; generators publish as they yield; the
return-your-keys contract; escapes refused."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.files.context import RunContext
from lakeshore.files.root import data_root
from lakeshore.scope import join, keys_in
from lakeshore.store import LocalStore, MemoryStore, Store
from tests import jobs
from tests.tiers import make_plane, seaweed_store

ROOTS = ["memory", "local", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)]


@pytest.fixture(params=ROOTS)
def fplane(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A plane whose default data root is memory://, file:// or s3:// (through s3fs)."""
    if request.param == "memory":
        store: Any = MemoryStore()
    elif request.param == "local":
        store = LocalStore(tmp_path / "store")
    else:
        store = seaweed_store(request.getfixturevalue("seaweed"))
    q = make_plane(store, cache_dir=str(tmp_path / "cache"))
    yield q
    store.close()


def put_input(q: Any, prefix: str, key: str, text: str) -> None:
    with q.scope(prefix):
        Path(dls.run.write(key)).write_text(text)


def read_text(q: Any, prefix: str, key: str) -> str:
    with q.scope(prefix):
        return Path(dls.run.read(key)).read_text()


def test_data_root_protocol_follows_the_store(fplane: Any) -> None:
    expected = {":memory:": "memory", "file": "file", "s3": "s3"}
    kind = fplane.url.split("://")[0] if "://" in fplane.url else fplane.url
    assert fplane.data_root.protocol == expected[kind]
    assert fplane.data_root.url.endswith("/data/default")


def test_sync_body_reads_input_writes_two_outputs(fplane: Any) -> None:
    f = fplane.udf(jobs.case_pair)
    put_input(fplane, "scenes/0007", "in.txt", "Hello Lake")
    with fplane.scope("scenes/0007"):
        inv = f.submit("in.txt")
    assert fplane.get(inv).prefix == "scenes/0007"
    assert dls.run_worker(fplane, once=True) == 1
    keys = fplane.result(inv, timeout=30)
    assert keys == ["out/upper.txt", "out/lower.txt"]
    assert read_text(fplane, "scenes/0007", keys[0]) == "HELLO LAKE"
    assert read_text(fplane, "scenes/0007", keys[1]) == "hello lake"
    # the keys resolve under the recorded scope only
    with pytest.raises(dls.NotFound, match=r"no object at .*/out/upper\.txt"):
        read_text(fplane, "scenes/0008", keys[0])


def test_async_body_and_dict_shapes(fplane: Any) -> None:
    f = fplane.udf(jobs.async_case_pair)
    put_input(fplane, "a", "in.txt", "MiXeD")
    with fplane.scope("a"):
        inv = f.submit("in.txt")
    dls.run_worker(fplane, once=True)
    out = fplane.result(inv, timeout=30)
    with fplane.scope("a"):
        paths = dls.run.read(out)
    assert set(paths) == {"up", "low"}
    assert Path(paths["up"]).read_text() == "MIXED"
    assert Path(paths["low"]).read_text() == "mixed"


def test_generator_keys_appear_as_it_yields(fplane: Any) -> None:
    # a lease a starved machine keeps renewing while the body is parked: a lost one would
    # rerun the body, and its stream would start over at tile 0
    fplane.configure("default", lease_s=30.0)
    f = fplane.udf(jobs.tiles)
    jobs.GATE.clear()
    with fplane.scope("gen"):
        inv = f.submit(3, gated=True)
    stop = threading.Event()
    t = threading.Thread(
        target=dls.run_worker, args=(fplane,), kwargs={"stop": stop, "max_poll_s": 0.05}
    )
    t.start()
    try:
        frames = fplane.stream(inv, timeout=30)
        first = next(frames)
        # the body is parked after its first yield: tile 0 is in storage, tile 1 is not
        assert first.value == "tiles/000.txt"
        assert read_text(fplane, "gen", first.value) == "tile 0"
        with pytest.raises(dls.NotFound):
            read_text(fplane, "gen", "tiles/001.txt")
        jobs.GATE.set()
        rest = [fr.value for fr in frames]
    finally:
        jobs.GATE.set()
        stop.set()
        t.join(30)
    assert rest == ["tiles/001.txt", "tiles/002.txt"]
    assert [read_text(fplane, "gen", k) for k in rest] == ["tile 1", "tile 2"]


def test_async_generator_body(fplane: Any) -> None:
    f = fplane.udf(jobs.async_tiles)
    with fplane.scope("agen"):
        inv = f.submit(2)
    dls.run_worker(fplane, once=True)
    keys = fplane.result(inv, timeout=30)
    assert keys == ["tiles/000.txt", "tiles/001.txt"]
    assert read_text(fplane, "agen", keys[1]) == "tile 1"


def test_unreturned_write_fails_with_the_key(fplane: Any) -> None:
    f = fplane.udf(jobs.forgets_a_key)
    with fplane.scope("bad"):
        inv = f.submit()
    dls.run_worker(fplane, once=True)
    with pytest.raises(dls.Failed, match=r"forgotten\.txt") as err:
        fplane.result(inv, timeout=30)
    assert err.value.remote_type == "UnreturnedWrite"
    assert fplane.get(inv).attempt == 1  # it would fail the same way again: no retry
    # nothing of a failed body is published, not even the key it did return
    with pytest.raises(dls.NotFound):
        read_text(fplane, "bad", "kept.txt")


def test_generator_that_does_not_yield_a_write_fails(fplane: Any) -> None:
    f = fplane.udf(jobs.tiles_forgets_last)
    with fplane.scope("g2"):
        inv = f.submit(3)
    dls.run_worker(fplane, once=True)
    with pytest.raises(dls.Failed, match=r"tiles/002\.txt.*did not yield"):
        fplane.result(inv, timeout=30)
    # what it did yield was published at the yield
    assert read_text(fplane, "g2", "tiles/001.txt") == "tile 1"


def test_escapes_are_refused(fplane: Any) -> None:
    with pytest.raises(dls.InvalidArgument, match="climbs out of the data root"):  # noqa: SIM117
        with fplane.scope("a/b"):
            dls.run.read("../../../etc/passwd")
    with pytest.raises(dls.InvalidArgument, match="climbs out"):  # noqa: SIM117
        with dls.scope(".."):
            pass
    with pytest.raises(dls.InvalidArgument, match="not a relative key"):  # noqa: SIM117
        with fplane.scope():
            dls.run.read("/etc/passwd")
    # inside a body, too: the invocation fails and names the problem
    f = fplane.udf(jobs.climbs)
    with fplane.scope("x"):
        inv = f.submit("../../../etc/passwd", _max_attempts=1)
    dls.run_worker(fplane, once=True)
    with pytest.raises(dls.Failed, match="climbs out of the data root"):
        fplane.result(inv, timeout=30)


def test_dotdot_climbs_to_a_parent_scope(fplane: Any) -> None:
    put_input(fplane, "shared", "lut.txt", "lookup")
    f = fplane.udf(jobs.climbs)
    with fplane.scope("runs"), dls.scope("r1"):
        inv = f.submit("../../shared/lut.txt")
    assert fplane.get(inv).prefix == "runs/r1"
    dls.run_worker(fplane, once=True)
    assert Path(fplane.result(inv, timeout=30)).read_text() == "lookup"


def test_nested_scope_inside_a_body(fplane: Any) -> None:
    f = fplane.udf(jobs.sub_scope)
    with fplane.scope("n"):
        inv = f.submit()
    dls.run_worker(fplane, once=True)
    assert fplane.result(inv, timeout=30) == ["sub/deep.txt"]
    assert read_text(fplane, "n", "sub/deep.txt") == "deep"


def test_local_call_runs_the_same_contract(fplane: Any) -> None:
    put_input(fplane, "local", "in.txt", "Direct")
    f = fplane.udf(jobs.case_pair)
    with fplane.scope("local"):
        assert f("in.txt") == ["out/upper.txt", "out/lower.txt"]
    assert read_text(fplane, "local", "out/upper.txt") == "DIRECT"
    g = fplane.udf(jobs.forgets_a_key)
    with pytest.raises(dls.UnreturnedWrite, match="forgotten"), fplane.scope("local"):
        g()
    gen = fplane.udf(jobs.tiles)
    with fplane.scope("local"):
        assert list(gen(2)) == ["tiles/000.txt", "tiles/001.txt"]
    assert read_text(fplane, "local", "tiles/001.txt") == "tile 1"


def test_producer_block_discards_writes_on_error(fplane: Any) -> None:
    with pytest.raises(RuntimeError), fplane.scope("p"):
        Path(dls.run.write("half.txt")).write_text("half")
        raise RuntimeError("boom")
    with pytest.raises(dls.NotFound):
        read_text(fplane, "p", "half.txt")


def test_write_outside_a_block_is_refused() -> None:
    with pytest.raises(dls.InvalidArgument, match=r"q\.scope"):
        dls.run.write("x.txt")


def test_same_key_same_scope_is_idempotent_other_scope_is_not(fplane: Any) -> None:
    f = fplane.udf(jobs.add_one)
    with fplane.scope("s1"):
        a = f.submit(1, _key="k")
        b = f.submit(1, _key="k", _strict_key=True)
    assert a == b
    with fplane.scope("s2"), pytest.raises(dls.KeyReused):
        f.submit(1, _key="k", _strict_key=True)


def test_process_isolation_on_a_file_root(tmp_path: Path) -> None:
    q = make_plane(LocalStore(tmp_path / "store"), cache_dir=str(tmp_path / "cache"))
    put_input(q, "proc", "in.txt", "Child")
    pair, gen = q.udf(jobs.case_pair), q.udf(jobs.tiles)
    with q.scope("proc"):
        a, b = pair.submit("in.txt"), gen.submit(2)
    assert dls.run_worker(q, isolation="process", max_jobs=2, idle_exit=0) == 2
    assert q.result(a, timeout=30) == ["out/upper.txt", "out/lower.txt"]
    assert q.result(b, timeout=30) == ["tiles/000.txt", "tiles/001.txt"]
    assert read_text(q, "proc", "out/upper.txt") == "CHILD"
    assert read_text(q, "proc", "tiles/001.txt") == "tile 1"


def test_memory_root_in_a_child_process_is_a_clear_error(tmp_path: Path) -> None:
    q = make_plane(MemoryStore(), cache_dir=str(tmp_path / "cache"))
    put_input(q, "m", "in.txt", "x")
    with q.scope("m"):
        inv = q.udf(jobs.case_pair).submit("in.txt", _max_attempts=1)
    dls.run_worker(q, isolation="process", once=True)
    with pytest.raises(dls.Failed, match="isolation='thread'"):
        q.result(inv, timeout=30)


def test_worker_in_another_process(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    data = f"file://{tmp_path}/data"
    q = dls.Dispatch(url, data=data, cache_dir=str(tmp_path / "cache"))
    put_input(q, "remote", "in.txt", "Far Away")
    with q.scope("remote"):
        inv = q.udf(jobs.case_pair).submit("in.txt")
    code = (
        "import lakeshore as dls;"
        f"q = dls.Dispatch({url!r}, data={data!r});"
        "dls.run_worker(q, once=True, allow=['tests.jobs:*'])"
    )
    env = {**os.environ, "LAKESHORE_CACHE": str(tmp_path / "worker-cache")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    keys = q.result(inv, timeout=30)
    assert read_text(q, "remote", keys[0]) == "FAR AWAY"
    assert (tmp_path / "data/remote/out/lower.txt").read_text() == "far away"


def test_explicit_roots_and_the_cache(tmp_path: Path) -> None:
    q = make_plane(
        LocalStore(tmp_path / "s"), data="memory://explicit-root", cache_dir=str(tmp_path)
    )
    assert q.data_root.url == "memory://explicit-root"
    put_input(q, "c", "big.bin", "v1")
    with q.scope("c"):
        first = dls.run.read("big.bin")
        ino = os.stat(first).st_ino
        again = dls.run.read("big.bin")
    assert again == first and os.stat(again).st_ino == ino  # unchanged: not fetched again
    put_input(q, "c", "big.bin", "v2")
    with q.scope("c"):
        fresh = dls.run.read("big.bin")
    assert Path(fresh).read_text() == "v2" and os.stat(fresh).st_ino != ino
    # a body that scribbled on its cached copy does not poison the next read
    Path(fresh).write_text("scribbled")
    with q.scope("c"):
        assert Path(dls.run.read("big.bin")).read_text() == "v2"


def test_atomic_upload_on_a_file_root(tmp_path: Path) -> None:
    root = data_root(str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    ctx = RunContext(root, "producer")
    path = Path(ctx.write("a/b.bin"))
    path.write_bytes(b"x" * 1000)
    ctx.flush()
    assert (tmp_path / "data/a/b.bin").read_bytes() == b"x" * 1000
    assert not [p for p in (tmp_path / "data/a").iterdir() if p.name != "b.bin"]  # no temp left
    ctx.close()


def test_returned_key_never_created_is_an_error(tmp_path: Path) -> None:
    root = data_root(str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    ctx = RunContext(root, "body")
    ctx.write("ghost.txt")
    with pytest.raises(dls.InvalidArgument, match="never written"):
        ctx.finish(["ghost.txt"])
    ctx.close()


def test_key_logic_is_pure() -> None:
    assert join("a/b", "../c/./d//e") == "a/c/d/e"
    assert join("", "x/..") == ""
    for bad in ("/abs", "s3://b/k", "~/x", "a\\b", "a\x00b"):
        with pytest.raises(dls.InvalidArgument):
            join("", bad)
    assert keys_in({"a": ["x.txt", ("../y", 3)], "b": "not//a/key/../k"}, "p") == {
        "p/x.txt",
        "y",
        "p/not/a/k",
    }
    assert keys_in(["../../out"], "p") == set()  # escapes are not keys


def test_keys_that_name_a_folder_are_refused(fplane: Any) -> None:
    with fplane.scope("c"):
        for bad in ("", ".", "x/..", "dir/"):
            with pytest.raises(dls.InvalidArgument, match="names a folder"):
                dls.run.write(bad)


def test_a_key_and_a_key_under_it(fplane: Any) -> None:
    """Object stores hold both ``a`` and ``a/b``; filesystems cannot, and say so clearly.
    The local cache and staging folders never collide either way."""

    def write_both() -> None:
        with fplane.scope("nest"):
            a, ab = dls.run.write(["a", "a/b"])
            Path(a).write_text("file a")
            Path(ab).write_text("file a/b")

    if fplane.data_root.protocol != "s3":
        with pytest.raises(dls.InvalidArgument, match="cannot share a name"):
            write_both()
        return
    write_both()
    with fplane.scope("nest"):
        assert Path(dls.run.read("a")).read_text() == "file a"
        assert Path(dls.run.read("a/b")).read_text() == "file a/b"


def test_sync_body_returning_nothing_is_told_to_return(tmp_path: Path) -> None:
    q = make_plane(MemoryStore(), cache_dir=str(tmp_path))
    f = q.udf(jobs.writes_and_returns_none)
    with pytest.raises(dls.UnreturnedWrite, match=r"'lost\.txt' but did not return it"):
        f()


def test_local_generator_keeps_its_scope_when_iterated_outside(fplane: Any) -> None:
    gen = fplane.udf(jobs.tiles)
    with fplane.scope("later"):
        it = gen(2)  # created in the scope, iterated after the block
    assert list(it) == ["tiles/000.txt", "tiles/001.txt"]
    assert read_text(fplane, "later", "tiles/001.txt") == "tile 1"


def test_store_without_a_location_still_runs_plain_jobs(tmp_path: Path) -> None:
    class Wrapped(MemoryStore):
        def location(self) -> tuple[str, dict[str, Any]] | None:
            return Store.location(self)  # the base: no place for files

    q = make_plane(Wrapped(), cache_dir=str(tmp_path))
    plain, files = q.udf(jobs.add_one), q.udf(jobs.case_pair)
    a, b = plain.submit(1), files.submit("in.txt", _max_attempts=1)
    dls.run_worker(q, max_jobs=2, idle_exit=0)
    assert q.result(a, timeout=30) == 2
    with pytest.raises(dls.Failed, match="no data root"):
        q.result(b, timeout=30)


def test_odd_names_folders_and_cyclic_values_are_handled(tmp_path: Path) -> None:
    """Regressions found in review: '?' in keys, a file onto a folder, reads outside any
    block, cyclic return values, long names, encode-before-publish."""
    q = make_plane(LocalStore(tmp_path / "s"), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(dls.InvalidArgument, match=r"'\?'"), q.scope():
        dls.run.write("in.txt?versionId=1")
    put_input(q, "", "out/inner.txt", "x")
    with pytest.raises(dls.InvalidArgument, match="cannot share a name"), q.scope():
        Path(dls.run.write("out")).write_text("a file onto a folder")
    with pytest.raises(dls.InvalidArgument, match="no body or scope block"):
        dls.run.read("anything.txt")
    loop: list[Any] = ["a.txt"]
    loop.append(loop)
    assert keys_in(loop, "") == {"a.txt"}
    long_key = "n" * 200 + ".csv"
    put_input(q, "long", long_key, "long")
    assert read_text(q, "long", long_key) == "long"
    inv = q.udf(jobs.writes_then_unsendable).submit()
    dls.run_worker(q, once=True, isolation="thread")
    with pytest.raises(dls.Failed, match="UnsendableValue"):
        q.result(inv, timeout=30)
    with pytest.raises(dls.NotFound):
        read_text(q, "", "orphan.txt")  # encoded first: nothing was published


def test_memory_root_concurrent_reads_and_long_names(tmp_path: Path) -> None:
    q = make_plane(MemoryStore(), cache_dir=str(tmp_path))
    payload = os.urandom(2_000_000)
    key = "big/" + "z" * 230 + ".bin"
    with q.scope():
        Path(dls.run.write(key)).write_bytes(payload)
    got: list[bytes] = []

    def reader() -> None:
        with q.scope():
            got.append(Path(dls.run.read(key)).read_bytes())

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 8 and all(g == payload for g in got)


def test_killed_child_leaves_no_staging(tmp_path: Path) -> None:
    q = make_plane(LocalStore(tmp_path / "s"), cache_dir=str(tmp_path / "cache"))
    inv = q.udf(jobs.writes_then_blocks).submit(60, _timeout_s=1.0, _max_attempts=1)
    dls.run_worker(q, once=True, isolation="process")
    assert q.status(inv) == "timeout"
    staging = tmp_path / "cache" / "staging"
    assert not staging.exists() or not any(staging.iterdir())
