"""The moto tier's fix for a fake-only failure (tests/moto_keys.py): a GET that holds an
object moto has just replaced or deleted still reads it, and the buffer is closed once
nobody holds the object, with no ResourceWarning (which this suite turns into errors)."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from lakeshore.store import Store
from tests.tiers import TEST_BUCKET


def _fake_key(name: str) -> Any:
    from moto.s3.models import s3_backends

    backend = s3_backends["123456789012"]["global"]
    return backend.get_bucket(TEST_BUCKET).keys[name]


def test_an_object_replaced_under_a_get_is_still_read(moto_store: Store) -> None:
    moto_store.put("k", b"first")
    held = _fake_key(moto_store.prefix.rstrip("/") + "/k")  # as a GET in another thread holds it
    moto_store.put("k", b"second")  # the overwrite
    moto_store.delete("k")  # and the delete
    assert held.value == b"first"  # moto's eager close made this a ValueError
    from moto.s3.models import FakeKey

    buffer = held._value_buffer
    FakeKey.instances_tracked.remove(held)  # moto's own list, emptied at the mock's reset
    del held
    gc.collect()
    assert buffer.closed  # closed once nobody holds it


def test_without_the_fix_moto_closes_what_a_get_holds(
    moto_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failure the fix is for, shown on moto itself (so a moto that fixes it is seen)."""
    from moto.s3.models import FakeKey

    monkeypatch.undo()  # moto's own dispose again
    moto_store.put("k", b"first")
    held = _fake_key(moto_store.prefix.rstrip("/") + "/k")
    moto_store.delete("k")
    with pytest.raises(ValueError, match="closed file"):
        held.value  # noqa: B018
    assert FakeKey.dispose.__module__ == "moto.s3.models"
