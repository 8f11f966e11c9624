"""Issue 22, items 4 and 5: files stay in their data root, and the read cache never confuses a
key with its own bookkeeping.

* Item 4: on a ``file://`` data root, nothing a body reads or writes may lead out of the root
  through a symbolic link: not a link planted before the invocation ran (the issue's scenario: a
  producer points ``job1/out`` at a victim's folder and ``job1/in`` at a secrets folder, and a
  harmless copy body runs), not one swapped in while lakeshore creates a folder, and not one
  swapped in after ``run.read`` handed out its path. Links that stay inside the root are
  refused too (one rule, documented), and so is anything that is not a plain file (a FIFO
  would hang the body).
* Item 5: on a data root that is not local, reads go through a per-worker cache. A key whose
  file name is ``.meta`` must read back its own bytes, and a cache left by an older release
  (where that collision lived) must not be read.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.files.context import RunContext
from lakeshore.files.root import data_root, discard_staging
from lakeshore.store import LocalStore, MemoryStore
from tests.tiers import make_plane, seaweed_store

# -- bodies (module level: a child process imports them by reference) -----------------------


def copy_file(src: str, dst: str) -> str:
    """A harmless body: copy one key to another."""
    data = Path(dls.run.read(src)).read_bytes()
    Path(dls.run.write(dst)).write_bytes(data)
    return dst


# -- helpers ------------------------------------------------------------------------------


def _local_plane(tmp_path: Path) -> tuple[Any, Path]:
    """A plane on a local store, whose default data root is a ``file://`` folder."""
    q = make_plane(LocalStore(tmp_path / "store"), cache_dir=str(tmp_path / "cache"))
    root = Path(q.data_root.url.removeprefix("file://"))
    root.mkdir(parents=True, exist_ok=True)
    return q, root


def _outside(tmp_path: Path) -> tuple[Path, Path]:
    """A victim's folder (a place to write into) and a secrets folder (a file to steal)."""
    victim = tmp_path / "victim-home" / ".ssh"
    victim.mkdir(parents=True)
    secrets = tmp_path / "worker-secrets"
    secrets.mkdir()
    (secrets / "credentials").write_text("aws_secret_access_key = hunter2")
    return victim, secrets


def _root_ctx(tmp_path: Path, prefix: str = "") -> RunContext:
    root = data_root(str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    (tmp_path / "data").mkdir(exist_ok=True)
    return RunContext(root, "producer", prefix=prefix)


# -- item 4: the scenario -----------------------------------------------------------


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_symlinks_planted_by_a_producer_lead_no_copy_body_out_of_the_root(
    tmp_path: Path, isolation: str, report: list[str]
) -> None:
    q, root = _local_plane(tmp_path)
    victim, secrets = _outside(tmp_path)
    (root / "job1").mkdir()
    (root / "job1" / "out").symlink_to(victim)  # a write under out/ would land in victim
    (root / "job1" / "in").symlink_to(secrets)  # a read under in/ would read the secrets
    copy = q.udf(copy_file)
    with q.scope("job1"):
        Path(dls.run.write("payload.txt")).write_text("ssh-ed25519 AAAA attacker")
        plant = copy.submit("payload.txt", "out/authorized_keys", _max_attempts=1)
        steal = copy.submit("in/credentials", "loot.txt", _max_attempts=1)
    assert dls.run_worker(q, max_jobs=2, idle_exit=0, isolation=isolation) == 2

    assert list(victim.iterdir()) == [], "the body wrote into a folder outside the data root"
    assert not (root / "job1" / "loot.txt").exists(), "the body copied a secret into the root"
    for inv, key in ((plant, "out/authorized_keys"), (steal, "in/credentials")):
        with pytest.raises(dls.Failed) as err:
            q.result(inv, timeout=30)
        assert err.value.remote_type.endswith("PermissionDenied")
        assert key in err.value.remote_message and "symbolic link" in err.value.remote_message
    report.append(
        f"planted links in a file:// root ({isolation}): 2 copy bodies refused "
        "(PermissionDenied), nothing written outside, no secret read"
    )


def test_a_link_as_the_last_part_of_a_key_is_neither_read_nor_written_through(
    tmp_path: Path,
) -> None:
    victim, secrets = _outside(tmp_path)
    target = victim / "authorized_keys"
    target.write_text("the victim's own key")
    ctx = _root_ctx(tmp_path, "job")
    (tmp_path / "data" / "job").mkdir()
    (tmp_path / "data" / "job" / "secret.txt").symlink_to(secrets / "credentials")
    (tmp_path / "data" / "job" / "keys").symlink_to(target)
    with pytest.raises(dls.PermissionDenied, match=r"job/secret\.txt.*symbolic link"):
        ctx.read("job/secret.txt")
    Path(ctx.write("job/keys")).write_text("attacker")
    ctx.flush()  # replaces the link itself, inside the root
    assert target.read_text() == "the victim's own key"
    assert (tmp_path / "data" / "job" / "keys").read_text() == "attacker"
    assert not (tmp_path / "data" / "job" / "keys").is_symlink()
    ctx.close()


def test_links_that_stay_inside_the_root_are_refused_too(tmp_path: Path) -> None:
    ctx = _root_ctx(tmp_path)
    (tmp_path / "data" / "real").mkdir()
    (tmp_path / "data" / "real" / "x.txt").write_text("inside")
    (tmp_path / "data" / "alias").symlink_to(tmp_path / "data" / "real")
    with pytest.raises(dls.PermissionDenied, match=r"'alias/x\.txt'.*symbolic link") as err:
        ctx.read("alias/x.txt")
    assert "link" in err.value.todo
    Path(ctx.write("alias/y.txt")).write_text("y")
    with pytest.raises(dls.PermissionDenied, match="symbolic link"):
        ctx.flush()
    assert not (tmp_path / "data" / "real" / "y.txt").exists()
    assert ctx.read("real/x.txt") == str(tmp_path / "data" / "real" / "x.txt")  # in place
    ctx.close()


def test_a_fifo_in_the_root_is_refused_instead_of_hanging_the_body(tmp_path: Path) -> None:
    ctx = _root_ctx(tmp_path)
    os.mkfifo(tmp_path / "data" / "pipe")
    with pytest.raises(dls.PermissionDenied, match="not a regular file"):
        ctx.read("pipe")
    ctx.close()


def test_a_link_swapped_in_while_an_upload_creates_its_folder_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attacker wins the race at the worst moment: right after the upload created
    ``job1/out``, it becomes a link to the victim's folder."""
    victim, _ = _outside(tmp_path)
    ctx = _root_ctx(tmp_path)
    out = tmp_path / "data" / "job1" / "out"
    real_mkdir = os.mkdir
    swapped: list[str] = []

    def mkdir_then_swap(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        if dir_fd is None:
            real_mkdir(path, mode)
            made = Path(os.fsdecode(path)).absolute()
        else:
            real_mkdir(path, mode, dir_fd=dir_fd)
            made = Path(os.readlink(f"/proc/self/fd/{dir_fd}")) / os.fsdecode(path)
        if made == out and not swapped:
            os.rename(out, out.with_name("out-moved"))
            out.symlink_to(victim)
            swapped.append(str(made))

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    Path(ctx.write("job1/out/authorized_keys")).write_text("ssh-ed25519 AAAA attacker")
    with pytest.raises(dls.PermissionDenied, match=r"job1/out/authorized_keys"):
        ctx.flush()
    monkeypatch.undo()
    assert swapped, "the race was not staged"
    assert list(victim.iterdir()) == [], "the upload followed a link swapped in meanwhile"
    ctx.close()


def test_a_link_swapped_in_after_run_read_on_a_shared_root_changes_nothing(
    tmp_path: Path,
) -> None:
    """On a root that other users can change (a folder writable by the group), the path
    ``run.read`` hands out must not be theirs to redirect once it has been checked."""
    _, secrets = _outside(tmp_path)
    ctx = _root_ctx(tmp_path)
    shared = tmp_path / "data" / "job1"
    (shared / "in").mkdir(parents=True)
    shared.chmod(0o2775)  # a group folder: another member may rename what is inside
    (shared / "in" / "credentials").write_text("the producer's input")
    path = ctx.read("job1/in/credentials")
    os.rename(shared / "in", shared / "in-moved")  # the producer swaps the folder for a link
    (shared / "in").symlink_to(secrets)
    assert Path(path).read_text() == "the producer's input"
    assert not path.startswith(str(tmp_path / "data"))  # a private copy, not the shared path
    again = ctx.read("job1/in-moved/credentials")  # unchanged: the cached copy is reused
    assert Path(again).read_text() == "the producer's input"
    ctx.close()


def test_a_private_root_is_still_read_in_place(tmp_path: Path) -> None:
    ctx = _root_ctx(tmp_path, "p")
    Path(ctx.write("p/a/b.txt")).write_text("b")
    ctx.flush()
    assert ctx.read("p/a/b.txt") == str(tmp_path / "data" / "p" / "a" / "b.txt")
    assert not (tmp_path / "cache" / "cache").exists()  # no copy was made
    ctx.close()


def test_a_data_root_that_is_itself_a_link_is_used(tmp_path: Path) -> None:
    """The root is the operator's choice (``/scratch`` may be a link to a mount): only what
    lies below it is walked without following links."""
    (tmp_path / "mnt").mkdir()
    (tmp_path / "data").symlink_to(tmp_path / "mnt")
    ctx = _root_ctx(tmp_path)
    Path(ctx.write("k.txt")).write_text("k")
    ctx.flush()
    assert (tmp_path / "mnt" / "k.txt").read_text() == "k"
    assert Path(ctx.read("k.txt")).read_text() == "k"
    ctx.close()


# -- item 5: the cache layout ---------------------------------------------------------------


@pytest.fixture(params=["memory", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)])
def remote_plane(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A plane whose data root is not local, so reads go through the cache."""
    store: Any = (
        MemoryStore()
        if request.param == "memory"
        else seaweed_store(request.getfixturevalue("seaweed"))
    )
    yield make_plane(store, cache_dir=str(tmp_path / "cache"))
    store.close()


def test_a_key_named_dot_meta_reads_back_its_own_bytes(remote_plane: Any) -> None:
    q = remote_plane
    with q.scope("model"):
        Path(dls.run.write(".meta")).write_bytes(b"\x00weights v1")
        Path(dls.run.write("w.bin")).write_bytes(b"other")
    for _ in range(2):  # a first fetch, then the cached copy
        with q.scope("model"):
            assert Path(dls.run.read(".meta")).read_bytes() == b"\x00weights v1"
            assert Path(dls.run.read("w.bin")).read_bytes() == b"other"
    with q.scope("model"):
        Path(dls.run.write(".meta")).write_bytes(b"weights v2")
    with q.scope("model"):
        assert Path(dls.run.read(".meta")).read_bytes() == b"weights v2"


def test_a_cache_of_the_old_layout_is_not_read(tmp_path: Path) -> None:
    """A cache filled by 0.3 (file and note side by side) holds a stamped copy that a new
    worker must ignore: it may be the note itself, read back as a key's bytes."""
    q = make_plane(MemoryStore(), cache_dir=str(tmp_path / "cache"))
    with q.scope("m"):
        Path(dls.run.write("w.bin")).write_bytes(b"real")
    fs, base = _fs_and_base(q)
    info = fs.info(f"{base}/m/w.bin")
    full = "m/w.bin"
    digest = hashlib.sha256(full.encode()).hexdigest()
    old = tmp_path / "cache" / "cache" / hashlib.sha256(q.data_root.url.encode()).hexdigest()[:16]
    old = old / digest[:2] / digest[2:24]
    old.mkdir(parents=True)
    (old / "w.bin").write_bytes(b"stale")
    st = (old / "w.bin").stat()
    change = next(
        (info[k] for k in ("ETag", "etag", "mtime", "LastModified", "created") if k in info), ""
    )
    (old / ".meta").write_text(
        f"{info.get('size')}:{change}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    )
    with q.scope("m"):
        assert Path(dls.run.read("w.bin")).read_bytes() == b"real"


def _fs_and_base(q: Any) -> tuple[Any, str]:
    ctx = RunContext(q.data_root, "producer")
    return ctx._filesystem("test")


# -- other places a name from the store becomes a local path --------------------------------


def test_a_run_tag_that_is_not_a_plain_name_never_reaches_past_the_staging_folder(
    tmp_path: Path,
) -> None:
    """A run's tag (``<id>-<attempt>`` from the record) names its staging folder and is
    globbed to remove it after a kill: a tag holding ``..`` must not remove, or stage into,
    anything outside ``staging/``."""
    root = data_root(str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    neighbour = tmp_path / "cache" / "victim-keep"
    neighbour.mkdir(parents=True)
    (neighbour / "precious.txt").write_text("keep me")
    discard_staging(root, "../victim")
    assert (neighbour / "precious.txt").read_text() == "keep me"
    ctx = RunContext(root, "body", staging_name="../../escaped")
    staged = Path(ctx.write("a.txt"))
    assert staged.resolve().is_relative_to((tmp_path / "cache" / "staging").resolve())
    assert not list(tmp_path.glob("escaped-*"))
    ctx.close()
