"""``dls.run``: the files of a body, read and written by key.

File bytes never ride the queue. A body asks for local paths: ``run.read(key)`` fetches the
object at ``<data root>/<scope>/<key>`` into a per-worker cache, ``run.write(key)`` hands out
a staging path, and the keys the body returns (or yields) are uploaded then. A key written
and never returned fails the invocation, naming the key. In a producer, the same verbs work
inside a ``q.scope(...)`` block, whose files are uploaded before each submit.

The machinery lives in :mod:`lakeshore.files`; the contract is on docs/files.md.
"""

from __future__ import annotations

from lakeshore.files.context import RunContext, active, flush, read, scope, write
from lakeshore.files.root import DataRoot, Fence, data_root

__all__ = [
    "DataRoot",
    "Fence",
    "RunContext",
    "active",
    "data_root",
    "flush",
    "read",
    "scope",
    "write",
]
