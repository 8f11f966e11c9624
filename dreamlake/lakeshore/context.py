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

from dreamlake.lakeshore.dispatch import default_dispatch
from lakeshore import run as _files
from lakeshore.errors import InvalidArgument
from lakeshore.run import data_root
from lakeshore.scope import current_prefix, mirror

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
    """The files of the current body, local call or scope block."""

    @property
    def prefix(self) -> str:
        return current_prefix()

    def write(self, key: str, *, dir: bool = False) -> Path:
        path = Path(_files.write(key))
        if dir:
            path.mkdir(parents=True, exist_ok=True)
        return path

    def read(self, key: str) -> Path:
        return Path(_files.read(key))

    def read_all(self, keys: Any) -> Any:
        return mirror(keys, self.read, "run.read_all")

    def write_all(self, keys: Any, *, dir: bool = False) -> Any:
        return mirror(keys, lambda key: self.write(key, dir=dir), "run.write_all")

    def flush(self) -> None:
        _files.flush()

    def publish(
        self, path: Any, *, name: str | None = None, type: str | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError(
            "dls.run.publish uploads to DreamLake's service, which lakeshore does not have: "
            "write with dls.run.write and return the key"
        )


run = _Run()


@contextmanager
def scope(sub: str = "", *, root: Any | None = None) -> Iterator[str]:
    """Join ``sub`` onto the current prefix for ``dls.run`` and the submits of the block;
    yields the prefix. ``root`` (a directory) is where the block's own files go; bodies on
    workers use their plane's data root, as upstream's workers use theirs."""
    where = None if root is None else data_root(Path(root).expanduser().resolve().as_uri())
    with _files.scope(sub, root=where, default_root=lambda: default_dispatch().data_root) as p:
        yield p
