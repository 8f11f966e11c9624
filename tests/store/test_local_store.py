"""LocalStore's cheaper hot path (issue 16) keeps its guarantees: no temp file is left behind
by any kind of write, unnamed temp files fall back to named ones where the system refuses
them, short reads and writes are completed, crowded directories are pruned less often and
never left empty for a listing to walk into; and the shared helpers the hot path leans on
(the key check, ``Record.next_write``) decide exactly as the rules they stand for."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeshore.errors import Conflict, InvalidArgument
from lakeshore.model.record import Blob, Record
from lakeshore.store import CREATE, OVERWRITE, LocalStore, check_key, if_match
from lakeshore.store import local as local_mod
from lakeshore.store.base import _key_problem, _key_problem_of

# -- the key check ------------------------------------------------------------------------------

_KEY_CHARS = st.sampled_from(["a", "b", ".", "/", "%", " ", "é", "\x00", "\x1f", "\x7f", "\n"])


@settings(max_examples=600, deadline=None)
@given(st.lists(_KEY_CHARS, max_size=12).map("".join))
def test_the_one_match_key_check_decides_as_the_rules_do(key: str) -> None:
    assert _key_problem(key) == _key_problem_of(key)


@pytest.mark.parametrize(
    "key",
    ["a" * 1024, "é" * 512, "a" * 1025, "é" * 513, "x/" + "é" * 511, "\ud800/a", "../a", "a/./b"],
)
def test_key_length_and_segments_at_the_edges(key: str) -> None:
    assert _key_problem(key) == _key_problem_of(key)
    if _key_problem_of(key) is None:
        assert check_key(key) == key
    else:
        with pytest.raises(InvalidArgument):
            check_key(key)


# -- Record.next_write --------------------------------------------------------------------------


def _record() -> Record:
    return Record(
        id="01M8SG4TDXSCNH9XZTWYH9K8F2", ns="n", queue="q", fn="m:f", args=Blob(inline=b"\x90")
    )


def test_next_write_is_replace_with_a_new_rev_and_wid() -> None:
    rec = _record()
    nxt = rec.next_write(state="running", attempt=1)
    want = dataclasses.replace(rec, state="running", attempt=1, rev=rec.rev + 1, wid=nxt.wid)
    assert nxt == want and type(nxt) is Record
    assert nxt.wid != rec.wid and rec.state == "queued" and rec.rev == 0  # rec unchanged
    assert Record.from_bytes(nxt.to_bytes()) == nxt
    with pytest.raises(dataclasses.FrozenInstanceError):
        nxt.state = "failed"  # type: ignore[misc]


def test_next_write_refuses_a_field_records_do_not_have() -> None:
    with pytest.raises(TypeError, match="stat"):
        _record().next_write(stat="running")


# -- LocalStore ---------------------------------------------------------------------------------


def _tmp_files(store: LocalStore) -> list[str]:
    return os.listdir(store.root / ".tmp")


def test_no_write_leaves_a_temp_file_behind(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    e1 = store.put("a/b", b"one", CREATE)
    with pytest.raises(Conflict):
        store.put("a/b", b"again", CREATE)
    e2 = store.put("a/b", b"two", if_match(e1))
    with pytest.raises(Conflict):
        store.put("a/b", b"stale", if_match(e1))
    store.put("a/c", b"over", OVERWRITE)
    assert store.get("a/b") == (b"two", e2)
    assert _tmp_files(store) == []


def test_create_falls_back_to_named_temp_files_where_unnamed_ones_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "s")
    real_open = os.open
    opened: list[str] = []

    def no_tmpfile(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if flags & getattr(os, "O_TMPFILE", 0) == getattr(os, "O_TMPFILE", -1):
            raise OSError(errno.EOPNOTSUPP, "not on this filesystem")
        opened.append(str(path))
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", no_tmpfile)
    etag = store.put("x/y/z", b"data", CREATE)
    with pytest.raises(Conflict):
        store.put("x/y/z", b"other", CREATE)
    assert store.get("x/y/z") == (b"data", etag)
    assert store._unnamed is False  # asked once, then not again
    assert any("/.tmp/" in p for p in opened), "the named temp file was not used"
    assert _tmp_files(store) == []


@pytest.mark.skipif(not hasattr(os, "O_TMPFILE"), reason="Linux only")
def test_create_uses_no_named_temp_file_where_unnamed_ones_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "s")
    assert store._unnamed
    made: list[str] = []
    real_open = os.open

    def watch(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if flags & os.O_CREAT:
            made.append(str(path))
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", watch)
    etag = store.put("p/q", b"v", CREATE)
    assert store.get("p/q") == (b"v", etag)
    assert not [p for p in made if "/.tmp/" in p]


def test_short_reads_and_writes_are_completed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "s")
    data = bytes(range(256)) * 40
    real_read, real_write = os.read, os.write
    monkeypatch.setattr(os, "write", lambda fd, b: real_write(fd, bytes(b[:7])))
    monkeypatch.setattr(os, "read", lambda fd, n: real_read(fd, min(n, 5)))
    e1 = store.put("k/created", data, CREATE)
    e2 = store.put("k/over", data, OVERWRITE)
    assert store.get("k/created") == (data, e1)
    assert store.get("k/over") == (data, e2)
    assert {i.key: i.etag for i in store.list("k/")} == {"k/created": e1, "k/over": e2}


def test_a_foreign_file_has_the_same_etag_in_a_listing_and_a_read(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    (store.root / "objects" / "stray.obj").write_bytes(b"not an object of ours")
    data, etag = store.get("stray")
    assert data == b"not an object of ours"
    assert [(i.key, i.etag, i.size) for i in store.list()] == [("stray", etag, len(data))]


class _Ticks:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _count_rmdirs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names ``os.rmdir`` is asked to remove (each relative to its parent's handle)."""
    tried: list[str] = []
    real = os.rmdir

    def rmdir(path: Any, *args: Any, **kw: Any) -> None:
        tried.append(str(path))
        real(path, *args, **kw)

    monkeypatch.setattr(os, "rmdir", rmdir)
    return tried


def test_a_crowded_directory_is_pruned_at_most_once_per_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "s")
    ticks = store._ticks = _Ticks()
    keys = [f"q/ready/{i:04d}-{'x' * 40}" for i in range(400)]
    for k in keys:
        store.put(k, b"", CREATE)
    crowded = str(store.root / "objects" / "q" / "ready")
    if os.stat(crowded).st_size <= local_mod._CROWDED_BYTES:
        pytest.skip("this filesystem does not report directory sizes")
    tried = _count_rmdirs(monkeypatch)
    for k in keys[:100]:
        store.delete(k)
    # one try, refused (not empty): the other 99 deletes in the window did not scan it again
    assert tried.count("ready") == 1
    ticks.t += local_mod._CROWDED_S + 0.01
    store.delete(keys[100])
    assert tried.count("ready") == 2  # the window is over: tried again
    for k in keys[101:]:
        store.delete(k)
    # the last delete fell in a window: the empty directory is still there ...
    assert os.path.isdir(crowded)
    assert [i.key for i in store.list("q/")] == []
    # ... until a listing walks into it, which removes it (and finds nothing)
    assert not os.path.exists(crowded)
    store.put("q/ready/again", b"v", CREATE)  # and writers recreate it
    assert [i.key for i in store.list("q/")] == ["q/ready/again"]


def test_small_directories_are_pruned_by_every_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "s")
    store._ticks = _Ticks()  # time stands still: only the size can exempt a directory
    for name in ("record", "result", "log"):
        store.put(f"ns/q/01ABC/{name}", b"v", CREATE)
    tried = _count_rmdirs(monkeypatch)
    for name in ("record", "result", "log"):
        store.delete(f"ns/q/01ABC/{name}")
    assert not (store.root / "objects" / "ns").exists()  # every level pruned at once
    assert len(tried) == 2 + 3  # two refused tries, then the three levels


def test_a_listing_removes_empty_directories_it_walks_into(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put("a/b/c", b"v", CREATE)
    empty = store.root / "objects" / "a" / "empty" / "deeper"
    empty.mkdir(parents=True)
    assert [i.key for i in store.list("a/")] == ["a/b/c"]
    assert not empty.exists()
    assert (store.root / "objects" / "a" / "empty").exists()  # emptied by that walk: the next
    assert [i.key for i in store.list()] == ["a/b/c"]
    assert not (store.root / "objects" / "a" / "empty").exists()
    assert (store.root / "objects" / "a").exists()  # not empty


@pytest.mark.parametrize("mode", [CREATE, OVERWRITE], ids=["create", "overwrite"])
def test_a_put_whose_parent_a_delete_prunes_mid_makedirs_still_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: Any
) -> None:
    """A producer writes _tickets/4/<id> while a tidier's delete empties and prunes
    _tickets/: the put made _tickets/ and then found it gone when it made _tickets/4 (a CI
    run met this). The put retries; it never fails with "No such file or directory"."""
    store = LocalStore(tmp_path)
    store.put("q/_tickets/4/old", b"x")
    store.delete("q/_tickets/4/old")  # prunes q/_tickets/4, q/_tickets and q
    real, lost = os.mkdir, []

    def mkdir_losing_a_parent(name: str, *args: Any, **kwargs: Any) -> None:
        if name == "4" and not lost:  # the race, once: _tickets/ vanished before this mkdir
            lost.append(name)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", name)
        real(name, *args, **kwargs)

    monkeypatch.setattr(local_mod.os, "mkdir", mkdir_losing_a_parent)
    store.put("q/_tickets/4/new", b"y", mode)
    assert lost, "the race was injected"
    assert store.get("q/_tickets/4/new")[0] == b"y"


def test_a_batch_delete_prunes_each_folder_it_emptied_and_keeps_the_rest(tmp_path: Path) -> None:
    """delete_many goes folder by folder (each reached and pruned once): what it leaves is
    what one delete per key would leave."""
    store = LocalStore(tmp_path)
    doomed = ["a/1/x", "a/1/y", "a/2/x", "b/z", "c"]
    for key in [*doomed, "a/2/keep"]:
        store.put(key, b"v")
    store.delete_many([*doomed, "a/3/never", "d/e/never"])
    objects = tmp_path / "objects"
    assert [i.key for i in store.list()] == ["a/2/keep"]
    assert not (objects / "a" / "1").exists() and not (objects / "b").exists()
    assert (objects / "a" / "2").is_dir()
