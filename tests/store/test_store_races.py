"""Races on the stores whose conditional writes are atomic: exactly one winner per round,
and no lost update under compare-and-swap. Threads on every atomic tier; processes on the
local directory store."""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakeshore.doctor import race
from lakeshore.errors import Conflict
from lakeshore.store import CREATE, LocalStore, Store, if_match
from tests.tiers import ATOMIC_TIERS, BOTO3_TIER, tier_store


@pytest.fixture(params=[*ATOMIC_TIERS, BOTO3_TIER])
def atomic_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The atomic tiers, and SeaweedFS through every S3 client."""
    yield from tier_store(request, tmp_path)


THREADS = 8
ROUNDS = 40
# On SeaweedFS each loser of a conditional write answers after whole seconds (1-4 s, see
# docs/benchmarks.md): 40 rounds took 57-77 s a test. A store that is not atomic lets several
# writers win in every round where they overlap (seaweedfs#8800: all of them), which these
# rounds of 8 threads show as surely as 40.
S3_ROUNDS = 8


def _rounds(s: Store) -> int:
    return S3_ROUNDS if s.url.startswith("s3://") else ROUNDS


def _line(what: str, url: str, rounds: int, who: str, winners: list[int]) -> str:
    return (
        f"{what:<22} {url[:40]:<40} {rounds} rounds x {who}: winners/round {sorted(set(winners))}"
    )


def _won(fn: object) -> bool:
    try:
        fn()  # type: ignore[operator]
    except Conflict:
        return False
    return True


@pytest.mark.slow
def test_thread_race_create_only(atomic_store: Store, report: list[str]) -> None:
    s, rounds = atomic_store, _rounds(atomic_store)
    winners = race(
        THREADS, rounds, lambda r, t: _won(lambda: s.put(f"c/{r}", str(t).encode(), CREATE))
    )
    report.append(_line("race create-only", s.url, rounds, f"{THREADS} threads", winners))
    assert winners == [1] * rounds
    for r in range(rounds):  # the object holds the winner's bytes, intact
        assert s.get(f"c/{r}")[0].decode().isdigit()


@pytest.mark.slow
def test_thread_race_if_match(atomic_store: Store, report: list[str]) -> None:
    s, rounds = atomic_store, _rounds(atomic_store)
    etags = [s.put(f"m/{r}", b"start") for r in range(rounds)]
    winners = race(
        THREADS,
        rounds,
        lambda r, t: _won(lambda: s.put(f"m/{r}", str(t).encode(), if_match(etags[r]))),
    )
    report.append(_line("race if-match", s.url, rounds, f"{THREADS} threads", winners))
    assert winners == [1] * rounds


def _increment(s: Store, key: str, times: int) -> int:
    """CAS-increment a counter ``times`` times, retrying lost races; return the conflicts seen."""
    conflicts = 0
    for _ in range(times):
        while True:
            data, etag = s.get(key)
            try:
                s.put(key, str(int(data) + 1).encode(), if_match(etag))
                break
            except Conflict:
                conflicts += 1
    return conflicts


@pytest.mark.slow
def test_cas_counter_loses_no_update(atomic_store: Store, report: list[str]) -> None:
    s, threads, per = atomic_store, 6, 25
    s.put("counter", b"0")
    conflicts: list[int] = []
    pool = [
        threading.Thread(target=lambda: conflicts.append(_increment(s, "counter", per)))
        for _ in range(threads)
    ]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert int(s.get("counter")[0]) == threads * per
    report.append(
        f"CAS counter {s.url[:40]}: {threads}x{per} increments, exact; "
        f"{sum(conflicts)} lost CAS retried"
    )


# -- processes on one directory --------------------------------------------------------------


def _proc_create(root: str, rounds: int, barrier: object, out: object, me: int) -> None:
    s = LocalStore(root)
    for r in range(rounds):
        barrier.wait()  # type: ignore[attr-defined]
        out.put((r, me, _won(lambda r=r: s.put(f"pc/{r}", str(me).encode(), CREATE))))  # type: ignore[attr-defined]


def _proc_if_match(root: str, etags: list[str], barrier: object, out: object, me: int) -> None:
    s = LocalStore(root)
    for r, etag in enumerate(etags):
        barrier.wait()  # type: ignore[attr-defined]
        out.put(
            (r, me, _won(lambda r=r, etag=etag: s.put(f"pm/{r}", str(me).encode(), if_match(etag))))
        )  # type: ignore[attr-defined]


def _proc_counter(root: str, times: int) -> None:
    _increment(LocalStore(root), "pcounter", times)


def _run_procs(target: object, args_for: list[tuple[object, ...]]) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=a) for a in args_for]  # type: ignore[arg-type]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0, f"racer exited with {p.exitcode}"


@pytest.mark.parametrize("mode", ["create", "if_match"])
def test_process_race_local(tmp_path: Path, mode: str, report: list[str]) -> None:
    root, procs, rounds = str(tmp_path / "store"), 4, 40
    s = LocalStore(root)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    if mode == "create":
        _run_procs(_proc_create, [(root, rounds, barrier, out, i) for i in range(procs)])
    else:
        etags = [s.put(f"pm/{r}", b"start") for r in range(rounds)]
        _run_procs(_proc_if_match, [(root, etags, barrier, out, i) for i in range(procs)])
    results = [out.get(timeout=10) for _ in range(procs * rounds)]
    winners = [sum(1 for r, _, won in results if r == rnd and won) for rnd in range(rounds)]
    report.append(_line(f"process race {mode}", "local", rounds, f"{procs} processes", winners))
    assert winners == [1] * rounds


def test_process_cas_counter_local(tmp_path: Path) -> None:
    root, procs, per = str(tmp_path / "store"), 4, 30
    LocalStore(root).put("pcounter", b"0")
    _run_procs(_proc_counter, [(root, per) for _ in range(procs)])
    assert int(LocalStore(root).get("pcounter")[0]) == procs * per
