"""A ``file://`` store never follows a symbolic link below ``objects/`` (issue 31, finding
10b): a folder of a key that is a link to a directory outside the root, which holds a
valid-looking object, reads as absent, is skipped by listings, and is never written or
deleted through. Every scenario runs twice: with ``openat2`` where the kernel has it, and
with the part-by-part walk that stands in for it elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lakeshore.errors import Conflict, NotFound, StoreError
from lakeshore.store import CREATE, OVERWRITE, LocalStore, if_match


def _tree(root: Path) -> dict[str, tuple[str, bytes, int]]:
    """Everything below ``root``: kind, bytes and modification time of each entry."""
    seen: dict[str, tuple[str, bytes, int]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            p = Path(folder, name)
            seen[str(p.relative_to(root))] = ("dir", b"", p.lstat().st_mtime_ns)
        for name in files:
            p = Path(folder, name)
            seen[str(p.relative_to(root))] = ("file", p.read_bytes(), p.lstat().st_mtime_ns)
    return seen


@pytest.fixture(params=["openat2", "walk"])
def linked(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[LocalStore, Path, str]:
    """A store whose ``objects/ns/q`` is a link to another store's ``objects/ns/q``, which
    holds the object ``ns/q/rec``; returns the store, the outside folder and its etag."""
    other = LocalStore(tmp_path / "other")
    etag = other.put("ns/q/rec", b"outside")
    other.put("ns/q/deeper/one", b"outside too")
    outside = other.root / "objects" / "ns" / "q"
    store = LocalStore(tmp_path / "store")
    store.put("ns/real", b"mine")  # objects/ns is a real folder
    (store.root / "objects" / "ns" / "q").symlink_to(outside, target_is_directory=True)
    if request.param == "walk":
        store._openat2 = None
    elif store._openat2 is None:
        pytest.skip("this kernel has no openat2")
    return store, outside, etag


def test_a_linked_folder_reads_as_absent(linked: tuple[LocalStore, Path, str]) -> None:
    store, outside, _ = linked
    before = _tree(outside)
    for key in ("ns/q/rec", "ns/q/deeper/one"):
        with pytest.raises(NotFound):
            store.get(key)
    assert _tree(outside) == before


def test_a_listing_skips_a_linked_folder(linked: tuple[LocalStore, Path, str]) -> None:
    store, outside, _ = linked
    before = _tree(outside)
    assert [i.key for i in store.list()] == ["ns/real"]
    assert [i.key for i in store.list("ns/")] == ["ns/real"]
    assert [i.key for i in store.list("ns/q")] == []
    assert [i.key for i in store.list("ns/q/")] == []  # starting inside the link
    assert [i.key for i in store.list("ns/q/deeper/")] == []
    assert _tree(outside) == before


@pytest.mark.parametrize("key", ["ns/q/rec", "ns/q/new", "ns/q/deeper/new", "ns/q/made/new"])
def test_a_put_never_writes_through_a_linked_folder(
    linked: tuple[LocalStore, Path, str], key: str
) -> None:
    store, outside, etag = linked
    before = _tree(outside)
    for mode in (CREATE, OVERWRITE):
        with pytest.raises(StoreError, match="symbolic link"):
            store.put(key, b"through the link", mode)
    with pytest.raises(Conflict):  # the object it names is absent here
        store.put(key, b"through the link", if_match(etag))
    assert _tree(outside) == before
    assert os.listdir(store.root / ".tmp") == []


def test_a_delete_never_deletes_through_a_linked_folder(
    linked: tuple[LocalStore, Path, str],
) -> None:
    store, outside, etag = linked
    before = _tree(outside)
    store.delete("ns/q/rec")  # absent, as far as this store goes: nothing to do
    store.delete("ns/q/rec", if_match=etag)
    store.delete("ns/q/deeper/one")
    store.delete_many(["ns/q/rec", "ns/q/deeper/one"])
    assert _tree(outside) == before
    assert (store.root / "objects" / "ns" / "q").is_symlink()  # and the link stays


def test_the_store_works_again_once_the_link_is_gone(
    linked: tuple[LocalStore, Path, str],
) -> None:
    store, outside, _ = linked
    before = _tree(outside)
    (store.root / "objects" / "ns" / "q").unlink()
    etag = store.put("ns/q/rec", b"mine", CREATE)
    assert store.get("ns/q/rec") == (b"mine", etag)
    assert [i.key for i in store.list("ns/")] == ["ns/q/rec", "ns/real"]
    assert _tree(outside) == before


def test_a_link_at_the_top_of_objects_is_not_followed(tmp_path: Path) -> None:
    other = LocalStore(tmp_path / "other")
    other.put("lakeshore/ns/rec", b"outside")
    outside = other.root / "objects" / "lakeshore"
    before = _tree(outside)
    store = LocalStore(tmp_path / "store")
    (store.root / "objects" / "lakeshore").symlink_to(outside, target_is_directory=True)
    with pytest.raises(NotFound):
        store.get("lakeshore/ns/rec")
    assert list(store.list()) == list(store.list("lakeshore/ns/")) == []
    with pytest.raises(StoreError, match="symbolic link"):
        store.put("lakeshore/ns/new", b"x")
    store.delete("lakeshore/ns/rec")
    assert _tree(outside) == before


def test_objects_itself_may_not_be_a_link(tmp_path: Path) -> None:
    other = LocalStore(tmp_path / "other")
    other.put("k", b"outside")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "objects").symlink_to(other.root / "objects")
    with pytest.raises(StoreError, match="symbolic link"):
        LocalStore(tmp_path / "store")


def test_the_root_itself_may_be_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    store = LocalStore(tmp_path / "alias")
    etag = store.put("a/b", b"v")
    assert store.get("a/b") == (b"v", etag)
    assert (tmp_path / "real" / "objects" / "a" / "b.obj").is_file()
