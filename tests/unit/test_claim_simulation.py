"""The claim simulation of ``bench/simulate.py`` (the real claimer, many workers on a virtual
clock): small enough for the suite, and checked to tell a broken run from a good one."""

from __future__ import annotations

from bench.simulate import Config, simulate, summary
from lakeshore.store import MemoryStore, PutMode
from lakeshore.store.base import OVERWRITE


def test_twenty_workers_run_a_hundred_invocations_exactly_once_and_the_counts_add_up() -> None:
    r = simulate(Config(workers=20, invocations=100, work_s=0.05, start_spread_s=0.0))
    assert r.problems == []
    assert r.whole.claims == r.ran == r.whole.outcomes == 100
    claim, finish = r.whole.counts["claim"], r.whole.counts["finish"]
    # every claim is one record write that landed; every lost race one that did not
    assert claim["PUT"] - claim.get("PUT conflict", 0) == 100
    assert finish == {"PUT": 100}  # one outcome write each, none fenced
    # every GET is classified by what it found, and every ticket went, by a batch or a drop
    assert sum(v for k, v in claim.items() if k.startswith("GET ")) == claim["GET"]
    assert r.whole.counts["tidying"]["BATCH_KEYS"] + claim.get("DELETE", 0) >= 100
    # twenty workers that start together on one head of the queue collide
    s = summary(r)["all"]
    assert s["lost_races_per_claim"] + s["gets_taken"] > 0
    assert s["list"] > 0 and s["invocations_per_s"] > 0


class _Careless(MemoryStore):
    """A store that ignores the conditions of writes: two claims of one invocation both land."""

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        return super().put(key, data, OVERWRITE)


def test_the_simulation_reports_invocations_run_twice_on_a_store_without_conditions() -> None:
    r = simulate(
        Config(workers=20, invocations=100, work_s=0.05, start_spread_s=0.0), inner=_Careless()
    )
    assert any("ran more than once" in p for p in r.problems), r.problems
