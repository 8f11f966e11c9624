"""Upstream's ``dls.run`` and ``dls.scope``, over lakeshore's files contract.

``run.write(key)`` and ``run.read(key)`` give local paths (``pathlib.Path`` here, as
upstream); a body that writes a key returns it, and lakeshore uploads it to the plane's
data root. ``run.publish`` uploads to DreamLake's service, which lakeshore does not have.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lakeshore import run as _files
from lakeshore.errors import InvalidArgument, NotFound
from lakeshore.files.root import data_root
from lakeshore.scope import current_prefix, mirror, resolve

__all__ = ["KeyError_", "RunContext", "run", "scope"]

KeyError_ = InvalidArgument  # upstream's bad-key error; lakeshore's is also a ValueError


class RunContext:
    """Upstream builds run contexts by hand; lakeshore builds them itself around each body,
    local call and ``dls.scope`` block.

    Raises:
        NotImplementedError: always.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "dls.RunContext: lakeshore makes run contexts itself; use dls.scope and dls.run"
        )


class _Run:
    """The files of the current body, local call or scope block; outside all of them, plain
    paths under the working directory (upstream's run root)."""

    @property
    def prefix(self) -> str:
        """The current scope's prefix ("" outside any)."""
        return current_prefix()

    @property
    def root(self) -> Path:
        """The working directory: upstream's run root, and this plane's data root unless it
        is a bucket."""
        return Path.cwd()

    def write(self, key: str, *, dir: bool = False) -> Path:
        """A local path to write ``key`` to (a folder with ``dir``); a body returns the key.

        Raises:
            KeyError_: a malformed key.
        """
        outside = _files.active() is None  # no body, local call or scope block
        path = self._plain(key, "run.write") if outside else Path(_files.write(key))
        (path if dir else path.parent).mkdir(parents=True, exist_ok=True)
        return path

    def read(self, key: str) -> Path:
        """A local path holding ``key``'s object.

        Raises:
            KeyError_: a malformed key, or no object under it.
        """
        if _files.active() is None:
            path = self._plain(key, "run.read")
            if not path.exists():
                raise KeyError_(
                    f"run.read {key!r}",
                    f"not found under prefix {self.prefix!r} (root {Path.cwd()})",
                    "write it first or check the key",
                )
            return path
        try:
            return Path(_files.read(key))
        except NotFound as e:
            raise KeyError_(e.op, e.what, e.todo) from None

    def read_all(self, keys: Any) -> Any:
        """:meth:`read` of every key of a str, list, tuple or dict, keeping its shape."""
        return mirror(keys, self.read, "run.read_all")

    def write_all(self, keys: Any, *, dir: bool = False) -> Any:
        """:meth:`write` of every key of a str, list, tuple or dict, keeping its shape."""
        return mirror(keys, lambda key: self.write(key, dir=dir), "run.write_all")

    def flush(self) -> None:
        """Upload what the current scope block wrote so far."""
        _files.flush()

    def publish(
        self, path: Any, *, name: str | None = None, type: str | None = None
    ) -> dict[str, Any]:
        """Refused: DreamLake's service is not part of lakeshore.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(
            "dls.run.publish uploads to DreamLake's service, which lakeshore does not have: "
            "write with dls.run.write and return the key"
        )

    @staticmethod
    def _plain(key: str, op: str) -> Path:
        return Path.cwd() / resolve(key, op)


run = _Run()


@contextmanager
def scope(sub: str = "", *, root: Any | None = None) -> Iterator[str]:
    """Join ``sub`` onto the current prefix for ``dls.run`` and the submits of the block;
    yields the prefix. ``root`` (a directory) is where the block's own files go; bodies on
    workers use their plane's data root, as upstream's workers use theirs."""
    base = Path.cwd() if root is None else Path(root).expanduser().resolve()
    # a scope inside a body keeps the body's root; outside, upstream's root (the directory)
    where = None if root is None else data_root(str(base))
    with _files.scope(sub, root=where, default_root=lambda: data_root(str(base))) as p:
        yield p
