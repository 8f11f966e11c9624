"""open_store URL forms, the error tree's shape, and import hygiene of the layers."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import lakeshore
from lakeshore.errors import Conflict, InvalidArgument, LakeshoreError, NotFound, StoreUnavailable
from lakeshore.store import LocalStore, MemoryStore, open_store


def test_memory_urls_are_independent() -> None:
    a, b = open_store(":memory:"), open_store(":memory:")
    assert isinstance(a, MemoryStore)
    a.put("k", b"1")
    with pytest.raises(NotFound):
        b.get("k")


@pytest.mark.parametrize("form", ["file://{p}", "{p}", "file://{p}?fsync=1"])
def test_local_forms(tmp_path: Path, form: str) -> None:
    s = open_store(form.format(p=tmp_path / "st"))
    assert isinstance(s, LocalStore)
    assert s.root == tmp_path / "st"
    assert s.fsync is form.endswith("fsync=1")
    s.put("x", b"y")
    assert open_store(str(tmp_path / "st")).get("x")[0] == b"y"  # same directory, same data


def test_home_form(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    s = open_store("file://~/.lakeshore")
    assert isinstance(s, LocalStore) and s.root == tmp_path / ".lakeshore"


def test_s3_form_parses_options() -> None:
    from lakeshore.store.s3 import S3Store

    s = open_store(
        "s3://bkt/some/prefix?endpoint_url=http://127.0.0.1:1&region=eu-west-1&addressing=path",
        aws_access_key_id="x",
        aws_secret_access_key="y",
    )
    assert isinstance(s, S3Store)
    assert (s.bucket, s.prefix, s.url) == ("bkt", "some/prefix/", "s3://bkt/some/prefix")
    assert s.client.meta.region_name == "eu-west-1"
    assert s.client.meta.endpoint_url == "http://127.0.0.1:1"
    assert s.client.meta.config.s3["addressing_style"] == "path"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "ftp://x",
        "s3://",
        "s3://b/p?bogus=1",
        "s3://b?addressing=sideways",
        "file://",
        "file:///x?nope=1",
        "file:///x?fsync=maybe",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        open_store(url)
    assert " — " in str(err.value)


def test_error_shape_and_pickling() -> None:
    e = Conflict("put a/b", "condition if_match(x) did not hold", "re-read", key="a/b")
    assert str(e) == "put a/b: condition if_match(x) did not hold — re-read"
    assert (e.op, e.what, e.todo, e.key) == (
        "put a/b",
        "condition if_match(x) did not hold",
        "re-read",
        "a/b",
    )
    with pytest.raises(AttributeError):
        _ = e.nonexistent
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is Conflict and str(back) == str(e) and back.key == "a/b"
    assert issubclass(StoreUnavailable, LakeshoreError)
    assert issubclass(InvalidArgument, ValueError) and issubclass(NotFound, KeyError)
    assert str(NotFound("get k", "absent", "create it")) == "get k: absent — create it"


PUBLIC = {
    # the facade and its helpers
    "DEFAULT_URL", "DataRoot", "Dispatch", "Frame", "QueueConfig", "Record", "Topic", "Udf",
    "__version__", "default_plane", "open_store", "run", "run_worker", "scope", "udf",
    # the work queue
    "WorkQueue", "AsyncWorkQueue", "Job",
    # elastic queues
    "ProviderConfig", "Scaler",
    # schedules
    "Schedule",
    # every error a caller can meet (the tree in lakeshore/errors.py)
    "LakeshoreError", "NotFound", "Conflict", "Fenced", "InvalidArgument", "UnreturnedWrite",
    "PermissionDenied", "StoreError", "TooLarge", "StoreUnavailable", "RecordError",
    "NewerRecord", "DecodeError", "CorruptSegment", "IllegalTransition", "JobError", "Failed",
    "Killed", "TimedOut", "NotFinished", "QueueFull", "KeyReused", "MapFailed",
    "UnknownFunction", "TopicClosed", "HookFailed", "ProviderError",
    # what a body raises to fail at once (outside the tree: lakeshore never raises it)
    "Permanent",
}  # fmt: skip
# in the tree, never raised to a caller: the worker turns them into an invocation's outcome
INTERNAL_ERRORS = {"Unsendable", "Stopped", "Abandoned"}


def test_public_surface() -> None:
    assert set(lakeshore.__all__) == PUBLIC
    assert len(lakeshore.__all__) == len(PUBLIC)  # no name twice
    for name in lakeshore.__all__:
        assert hasattr(lakeshore, name)


def test_every_error_class_lives_in_errors_and_is_exported() -> None:
    """One home for the error tree: no module defines an exception class of its own (a
    private one that never leaves its module aside), and every class of the tree is in
    ``errors.__all__`` and, unless internal, in ``lakeshore.__all__``."""
    import ast

    from lakeshore import errors

    defined = {
        name
        for name, obj in vars(errors).items()
        if isinstance(obj, type)
        and issubclass(obj, BaseException)
        and obj.__module__ == errors.__name__
    }
    assert set(errors.__all__) == defined
    assert defined - INTERNAL_ERRORS <= set(lakeshore.__all__)
    assert defined >= INTERNAL_ERRORS and not INTERNAL_ERRORS & set(lakeshore.__all__)
    for name in defined - {"Stopped", "Abandoned", "Permanent"}:
        assert issubclass(getattr(errors, name), errors.LakeshoreError), name
    root = Path(lakeshore.__file__).parent
    elsewhere = []
    for path in root.rglob("*.py"):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {ast.unparse(b) for b in node.bases}
                if any(b.endswith(("Error", "Exception")) or b in defined for b in bases):
                    elsewhere.append(f"{path.relative_to(root)}:{node.name}")
    assert elsewhere == []


def test_layers_import_only_what_they_own() -> None:
    """`import lakeshore` and local stores never load boto3 or fsspec; the store layer never
    imports a queue-layer module."""
    code = (
        "import sys, lakeshore, lakeshore.store, lakeshore.doctor, lakeshore.cli;"
        "lakeshore.store.open_store(':memory:');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3','botocore','fsspec')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    root = Path(lakeshore.__file__).parent
    for path in root.rglob("*.py"):  # only the run-context module talks to fsspec
        imports = [ln for ln in path.read_text().splitlines() if "import fsspec" in ln]
        owner = path.relative_to(root).as_posix() == "files/context.py"
        assert not imports or owner, (path, imports)
    for path in (root / "store").glob("*.py"):
        text = path.read_text()
        assert "import boto3" not in text or path.name == "s3.py", path
        for line in text.splitlines():
            if line.startswith(("from lakeshore", "import lakeshore")):
                assert line.startswith(("from lakeshore.store", "from lakeshore.errors")), (
                    path,
                    line,
                )


def test_local_filesystem_errors_are_translated(tmp_path: Path) -> None:
    from lakeshore.errors import StoreError

    s = LocalStore(tmp_path / "st")
    s.put("ok", b"1")
    tmp_dir = tmp_path / "st" / ".tmp"
    tmp_dir.rmdir()
    tmp_dir.write_bytes(b"")  # temp files can no longer be created: like a full or broken disk
    with pytest.raises(StoreError) as err:
        s.put("k", b"v")
    assert str(err.value).startswith("put k: filesystem error")
    (tmp_path / "st" / "objects" / "bad.obj").write_bytes(b"junk")  # not written by lakeshore
    assert s.get("bad")[0] == b"junk"  # read as it is: the layer above judges the bytes


def test_local_fsync_mode_writes_and_reads(tmp_path: Path) -> None:
    s = LocalStore(tmp_path / "st", fsync=True)
    e = s.put("a/b", b"durable")
    assert s.get("a/b") == (b"durable", e)


def test_an_empty_url_is_refused_not_taken_for_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A variable meant to hold a URL that came out empty must not open the home store."""
    from lakeshore.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("LAKESHORE_URL", raising=False)
    with pytest.raises(InvalidArgument, match="the store URL is empty"):
        lakeshore.Dispatch("")
    for argv in (["status", "--url", ""], ["ls", "--url", " "], ["doctor", ""], ["demo", ""]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2, argv
        assert "an empty URL names no store" in capsys.readouterr().err, argv
    assert not (tmp_path / ".lakeshore").exists(), "no home store was made"
    assert lakeshore.Dispatch(None, store=MemoryStore()).url.endswith(".lakeshore")  # None: default


# what a user sees on a Dispatch: the verbs, the async spellings, four read-only properties
# and the plane under the facade (for lakeshore's own layers and for tests)
DISPATCH_SURFACE = {
    "udf", "scope", "get", "status", "result", "stream", "astream", "cancel", "retry", "logs",
    "retry_many",
    "follow_logs", "configure", "queue_config", "topic",
    "schedule", "schedules", "unschedule", "tick_schedules",
    "aget", "astatus", "aresult", "acancel",
    "url", "ns", "store", "data_root", "plane",
}  # fmt: skip


def test_a_dispatch_shows_the_users_verbs_and_holds_its_plane() -> None:
    from lakeshore.plane import Plane, plane_of

    q = lakeshore.Dispatch(":memory:", ns="surface")
    public = {name for name in dir(q) if not name.startswith("_")}
    assert public == DISPATCH_SURFACE
    assert public == {name for name in dir(lakeshore.Dispatch) if not name.startswith("_")}
    assert not isinstance(q, Plane) and isinstance(q.plane, Plane)
    for internal in ("ops", "claimer", "locate", "remember", "registry", "settings"):
        assert not hasattr(q, internal), internal
    for internal in ("in_process", "queues", "submit_call", "lease_s", "allow_pickle"):
        assert not hasattr(q, internal), internal
    for prop in ("url", "ns", "store", "data_root", "plane"):
        with pytest.raises(AttributeError):
            setattr(q, prop, None)
    assert (q.url, q.ns, q.store, q.data_root) == (
        q.plane.url,
        q.plane.ns,
        q.plane.store,
        q.plane.data_root,
    )
    assert repr(q) == "Dispatch(':memory:', ns='surface')"
    assert plane_of(q) is q.plane and plane_of(q.plane) is q.plane
    with pytest.raises(InvalidArgument, match="not a plane"):
        plane_of("memory")  # type: ignore[arg-type]


def test_what_takes_a_plane_takes_a_dispatch_or_its_plane() -> None:
    from tests import jobs
    from tests.fleet import Fleet, scaler_for

    q = lakeshore.Dispatch(":memory:")
    f = q.udf(jobs.add_one)
    assert f.plane is q  # a function declared on a Dispatch names it
    ids = [f.submit(1), f.submit(2)]
    assert lakeshore.run_worker(q, isolation="thread", max_jobs=1, idle_exit=0) == 1
    assert lakeshore.run_worker(q.plane, isolation="thread", max_jobs=1, idle_exit=0) == 1
    assert [q.result(i, timeout=5) for i in ids] == [2, 3]
    for given in (q, q.plane):
        wq = lakeshore.WorkQueue("work", given)
        assert wq.plane is given
        inv = wq.submit("p")
        job = wq.claim()
        assert job is not None and job.id == inv
        job.ack("done")
        assert (wq.status(inv), wq.result(inv, timeout=5)) == ("succeeded", "done")
        scaler = scaler_for(given, Fleet())
        assert scaler.plane is q.plane
        assert [r.queue for r in scaler.tick()] == ["hpc"]
