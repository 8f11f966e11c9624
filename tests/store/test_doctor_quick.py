"""`lakeshore doctor --quick`: on SeaweedFS it runs every probe but the two races, says which
it skipped, gives a verdict for one writer, and sends a fraction of the full run's requests
(counted at the store, not timed)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest

from lakeshore.cli import main
from lakeshore.doctor import diagnose
from lakeshore.store import MemoryStore, Store
from tests.forwarding import Forwarding
from tests.seaweed import Seaweed
from tests.tiers import FAKE_CREDS, TEST_BUCKET, seaweed_store

RACES = ["create race", "if-match race"]


class Counting(Forwarding):
    """Every request the doctor sends through the store, by verb."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()

    def _count(self, verb: str) -> None:
        with self.lock:
            self.calls[verb] += 1

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self._count("GET")
        return super().get(key, max_bytes)

    def put(self, key: str, data: bytes, mode: Any = None) -> str:
        self._count("PUT")
        return super().put(key, data) if mode is None else super().put(key, data, mode)

    def delete(self, key: str, if_match: str | None = None) -> None:
        self._count("DELETE")
        super().delete(key, if_match)

    def list(self, prefix: str = "", start_after: str | None = None) -> Any:
        self._count("LIST")
        return super().list(prefix, start_after)


@pytest.mark.seaweedfs
def test_quick_skips_the_races_and_sends_a_fraction_of_the_requests(seaweed: Seaweed) -> None:
    inner = seaweed_store(seaweed)
    try:
        full_store, quick_store = Counting(inner), Counting(inner)
        full = diagnose(full_store, threads=4, rounds=5)
        quick = diagnose(quick_store, threads=4, rounds=5, quick=True)
    finally:
        inner.close()
    assert full.safe and quick.safe, quick.render()
    assert full.skipped == [] and quick.skipped == RACES
    names = [c.name for c in quick.checks]
    assert [c.name for c in full.checks if c.name not in RACES] == names
    assert "verdict: SAFE FOR ONE WRITER" in quick.render()
    assert "create race and if-match race" in quick.render()
    # what the races cost: 4 x 5 contended PUTs each, the 5 seeds of the second, and the
    # cleanup's DELETE of each round's object; everything else is the same requests
    skipped = full_store.calls - quick_store.calls
    assert skipped == Counter({"PUT": 4 * 5 * 2 + 5, "DELETE": 5 * 2})
    assert quick_store.calls == Counter({"PUT": 25, "DELETE": 20, "GET": 7, "LIST": 5})


def test_the_request_counts_the_docs_give() -> None:
    """docs/local-s3.md: 57 requests for --quick, 437 at the default 8 threads x 20 rounds."""
    quick, full = Counting(MemoryStore()), Counting(MemoryStore())
    diagnose(quick, quick=True)
    diagnose(full)
    assert (sum(quick.calls.values()), sum(full.calls.values())) == (57, 437)


@pytest.mark.seaweedfs
def test_quick_from_the_command_line_on_seaweedfs(
    seaweed: Seaweed, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_CREDS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_CREDS["aws_secret_access_key"])
    url = f"s3://{TEST_BUCKET}/doctor-quick?endpoint_url={seaweed.endpoint}"
    assert main(["--url", url, "doctor", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "race" not in "".join(ln for ln in out.splitlines() if ln.startswith("  "))
    assert out.strip().splitlines()[-1].startswith("verdict: SAFE FOR ONE WRITER")
    assert main(["doctor", url, "--quick", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["safe"] is True and data["skipped"] == RACES
