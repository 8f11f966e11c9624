"""moto's in-process S3 closes an object's buffer as soon as the object is overwritten or
deleted (``FakeKey.dispose``), while a GET in another thread may hold that object and be
about to read it: the GET then fails inside botocore's handler with ``ValueError: I/O
operation on closed file``, a failure no S3 server has. A worker overwriting a record or
deleting a journal segment while a reader fetches it meets that window now and then
(``test_retry_replaces_a_failed_attempts_frames[moto]`` did, once in a fresh-clone CI).

:func:`close_buffers_when_unreferenced` makes moto close a replaced object's buffer when
the object is collected instead: what a request already holds stays readable, as it does
on a server. The fake's behaviour is otherwise unchanged; the client is not touched.
"""

from __future__ import annotations

from typing import Any

import pytest


def close_buffers_when_unreferenced(monkeypatch: pytest.MonkeyPatch) -> None:
    """For this test: moto marks an overwritten or deleted object disposed, and closes its
    buffer when the object is garbage collected (``FakeKey.__del__``)."""
    from moto.s3.models import FakeKey

    eager = FakeKey.dispose

    def dispose(self: Any, garbage: bool = False) -> None:
        if garbage:  # collected: nobody can read it any more
            self.disposed = True  # (so moto does not warn that it was left open)
            eager(self, garbage=True)
            return
        self.disposed = True

    monkeypatch.setattr(FakeKey, "dispose", dispose)
