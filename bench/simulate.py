"""The claim protocol with many workers on one queue, simulated: requests and races.

Every simulated worker is what a worker process with one slot would be: a plane of its own
(its own ``QueueOps``, so its own batch of ticket deletes) and the real
``lakeshore.protocol.claims.Claimer`` with a worker id of its own, over one shared
``MemoryStore``. Each runs the real steps of an attempt: ``Claimer.claim``, then
``QueueOps.put_result``, ``lifecycle.succeed`` and ``QueueOps.finish(tidy_later=True)``, as
a worker concludes a successful attempt; nothing of the protocol is written again here.

A thousand workers cannot run as a thousand threads on two cores and stay comparable, so
they run on a virtual clock. Each worker is a thread, but only one runs at a time: a
scheduler hands the turn to whichever worker's next event is due first. Every store request
takes a latency drawn from a seeded model (lognormal around a median per verb): it takes
effect at its midpoint and its answer arrives at its end, so while one worker waits for a
LIST, others list the same head, read the same tickets and race for them, as processes
would. A body takes ``--work-s`` (jittered), an idle worker pauses as ``run_worker`` does
(from 5 ms, doubling up to its ``max_poll_s``), and each plane's batch of ticket deletes
goes out ``BATCH_S`` after its first ticket, as its tidier thread would send it. The store,
the claimers' listing age and their tick clock all read the virtual clock.

What is counted, per verb and per phase (claim, finish, tidying, submit): every request to
the store, a LIST once per page of 1,000 keys as S3 serves it; PUTs that lost their
condition (a lost race, when it is a claim's); what every GET found (the invocation still
queued, taken by another worker, ended with its ticket not yet deleted, or no record yet);
and the listings. Each run checks that every invocation ran exactly once and ended
succeeded at its first attempt, that no ticket is left, and that the counters add up.

    bash scripts/bench simulate                          # 10, 100 and 1,000 workers
    bash scripts/bench simulate --workers 100 --per-worker 20 --work-s 0.1
    bash scripts/bench simulate --rate 500 --invocations 5000   # arrivals instead of a backlog
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import heapq
import inspect
import itertools
import json
import math
import random
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lakeshore as dls
from bench.bodies import noop
from lakeshore import codec
from lakeshore.errors import Conflict, NotFound
from lakeshore.keys import ROOT, QueueKeys, worker_key
from lakeshore.model import lifecycle
from lakeshore.model.record import Record
from lakeshore.plane import Plane
from lakeshore.protocol import claim_listing
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.tidy import BATCH, BATCH_S, Tidier
from lakeshore.store import MemoryStore, ObjectInfo, PutMode, Store
from lakeshore.store.base import OVERWRITE
from lakeshore.worker import run_worker
from tests.forwarding import Forwarding

WRITES_PER_PREFIX = 3500  # PUT/COPY/POST/DELETE per second per partitioned prefix
READS_PER_PREFIX = 5500  # GET/HEAD per second per partitioned prefix (LIST counted here too)
RESULTS = Path(__file__).resolve().parent / "results"
NS, QUEUE = "default", "default"
# run_worker's first pause after a poll that found nothing (lakeshore.worker._serve); the
# longest pause is read from run_worker's own default below
FIRST_POLL_S = 0.005
_DEFAULTS = inspect.signature(run_worker).parameters
MAX_POLL_S: float = _DEFAULTS["max_poll_s"].default
ANNOUNCE_S: float = _DEFAULTS["announce_s"].default  # a worker's sign of life, this often
# median latency of one request per verb, seconds: S3 from a client in the same region
LATENCY_S = {"GET": 0.015, "PUT": 0.025, "LIST": 0.030, "DELETE": 0.015}
LATENCY_SIGMA = 0.35  # lognormal spread: about two thirds of requests within ±40 % of the median
PAGE = 1000  # keys per LIST page, as S3 serves them


# -- the virtual clock ---------------------------------------------------------------------


class _Task:
    """A simulated worker: a thread that runs only while the scheduler has handed it the turn."""

    def __init__(self, name: str, body: Callable[[], None]) -> None:
        self.name = name
        self.body = body
        self.go = threading.Event()
        self.phase = "start"
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.sched: Scheduler | None = None

    def _main(self) -> None:
        assert self.sched is not None
        self.go.wait()
        self.go.clear()
        try:
            self.body()
        except BaseException as e:  # handed to the scheduler, which raises it in the run
            self.sched.failure = self.sched.failure or e
        finally:
            self.sched.back.set()


class Scheduler:
    """A discrete-event loop on a virtual clock. Tasks (threads) wait in ``sleep`` until their
    time comes; callbacks run in the loop itself. Ties go in the order they were scheduled,
    so the interleaving depends on the seed and on nothing the machine does; what still
    varies between two runs is the invocation ids (random ULIDs, whose hashes place the
    tickets in the claimers' lanes)."""

    def __init__(self) -> None:
        self.t = 0.0
        self._heap: list[tuple[float, int, _Task | Callable[[], None]]] = []
        self._seq = itertools.count()
        self.back = threading.Event()  # the running task handed the turn back
        self.current: _Task | None = None
        self.failure: BaseException | None = None
        self.phase = ""  # the phase callbacks count their requests under
        self._tasks: list[_Task] = []
        self._last_tick = -math.inf

    def ticks(self) -> float:
        """Elapsed virtual time, strictly increasing between calls like a real monotonic
        clock: code that compares two readings never sees the same instant twice."""
        self._last_tick = max(self.t, self._last_tick + 1e-9)
        return self._last_tick

    def at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), fn))

    def spawn(self, when: float, name: str, body: Callable[[], None]) -> _Task:
        task = _Task(name, body)
        task.sched = self
        self._tasks.append(task)
        task.thread.start()
        heapq.heappush(self._heap, (when, next(self._seq), task))
        return task

    def in_task(self) -> _Task | None:
        """The task whose thread is calling, or None in the loop (setup, callbacks)."""
        task = self.current
        return task if task is not None and threading.current_thread() is task.thread else None

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass for the calling task."""
        task = self.in_task()
        assert task is not None, "sleep outside a task"
        heapq.heappush(self._heap, (self.t + max(0.0, seconds), next(self._seq), task))
        self.back.set()
        task.go.wait()
        task.go.clear()

    def run(self) -> None:
        while self._heap:
            when, _, what = heapq.heappop(self._heap)
            self.t = max(self.t, when)
            if isinstance(what, _Task):
                self.current = what
                what.go.set()
                self.back.wait()
                self.back.clear()
                self.current = None
                if self.failure is not None:
                    raise self.failure
            else:
                what()
        for task in self._tasks:
            task.thread.join()


# -- the store -----------------------------------------------------------------------------


class _Latency:
    def __init__(self, rng: random.Random, scale: float) -> None:
        self._rng, self._scale = rng, scale

    def draw(self, verb: str) -> float:
        return self._scale * self._rng.lognormvariate(math.log(LATENCY_S[verb]), LATENCY_SIGMA)


class SimStore(Forwarding):
    """The shared memory store as every simulated worker sees it: each request waits its
    latency on the virtual clock (half before it takes effect, half after) and is counted
    under the calling worker's phase as ``(phase, what)``."""

    def __init__(self, inner: MemoryStore, sched: Scheduler, latency: _Latency) -> None:
        super().__init__(inner)
        self.sched = sched
        self.latency = latency
        self.keys = QueueKeys(NS, QUEUE)
        self.root = self.keys.base + "/"  # the queue's prefix: every key of the queue
        self.ns_root = f"{ROOT}/{NS}/"
        self.counts: Counter[tuple[str, str]] = Counter()

    # counting -------------------------------------------------------------------------------

    def _phase(self) -> str:
        task = self.sched.in_task()
        return task.phase if task is not None else self.sched.phase

    def _count(self, what: str, key: str, n: int = 1) -> None:
        """Count ``what`` under the calling worker's phase; a request outside the queue's
        prefix (a sign of life, the census of them) is counted apart, by its folder, e.g.
        ``_workers LIST``."""
        if not key.startswith(self.root):
            what = f"{key[len(self.ns_root) :].split('/')[0]} {what}"
        self.counts[(self._phase(), what)] += n

    def _wait(self, verb: str) -> float:
        """The first half of a request's latency (the second half is returned): a call from
        the loop (setup, callbacks) takes no time."""
        if self.sched.in_task() is None:
            return 0.0
        lat = self.latency.draw(verb)
        self.sched.sleep(lat / 2)
        return lat / 2

    def _answer(self, rest: float) -> None:
        if rest:
            self.sched.sleep(rest)

    def _found(self, key: str) -> str:
        """What a GET of ``key`` finds: the invocation still queued, running (held by the
        reader's own worker or another), ended, or no record (yet)."""
        inv = QueueKeys.id_of(key) if key.startswith(self.keys.tickets_prefix) else None
        if inv is None and key.startswith(self.root) and key.endswith("/record"):
            inv = key[len(self.root) :].split("/")[0]
        if inv is None:
            return "GET other"
        try:
            data, _ = self.inner.get(self.keys.record(inv))
        except NotFound:
            return "GET queued" if key != self.keys.record(inv) else "GET no record"
        rec = Record.from_bytes(data, self.keys.record(inv))
        if rec.terminal:
            return "GET ended"
        task = self.sched.in_task()
        if rec.state == "running" and rec.lease is not None:
            mine = task is not None and rec.lease.worker == task.name
            return "GET own" if mine else "GET taken"
        return "GET queued"

    # verbs ----------------------------------------------------------------------------------

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        rest = self._wait("GET")
        self._count("GET", key)
        self._count(self._found(key), key)
        try:
            return self.inner.get(key, max_bytes)
        finally:
            self._answer(rest)

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        rest = self._wait("PUT")
        self._count("PUT", key)
        try:
            return self.inner.put(key, data, mode)
        except Conflict:
            self._count("PUT conflict", key)
            raise
        finally:
            self._answer(rest)

    def delete(self, key: str, if_match: str | None = None) -> None:
        rest = self._wait("DELETE")
        self._count("DELETE", key)
        try:
            self.inner.delete(key, if_match)
        finally:
            self._answer(rest)

    def delete_many(self, keys: Sequence[str]) -> None:
        # one DeleteObjects POST per 1,000 keys; S3 may count every key against the prefix
        for i in range(0, len(keys), BATCH):
            chunk = list(keys[i : i + BATCH])
            rest = self._wait("DELETE")
            self._count("BATCH_DELETE", chunk[0])
            self._count("BATCH_KEYS", chunk[0], len(chunk))
            self.inner.delete_many(chunk)
            self._answer(rest)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        return self._pages(prefix, start_after)

    def _pages(self, prefix: str, start_after: str | None) -> Iterator[ObjectInfo]:
        """Page by page, each page one request seen at its own time, as S3 serves it."""
        cursor = start_after
        while True:
            rest = self._wait("LIST")
            self._count("LIST", prefix)
            page = list(itertools.islice(self.inner.list(prefix, cursor), PAGE))
            if not page:
                self._count("LIST empty", prefix)
            self._answer(rest)
            yield from page
            if len(page) < PAGE:
                return
            cursor = page[-1].key


class _SimTidier(Tidier):
    """A plane's background tidying without its thread: the batch goes out on the virtual
    clock when the tidier's own rule (``_due``: ``BATCH`` tickets, or the oldest waited
    ``BATCH_S``) says so, as a callback of the loop."""

    def __init__(self, store: Store, sched: Scheduler) -> None:
        super().__init__(store, clock=lambda: sched.t)
        self._sched = sched
        self._planned = False

    def _start(self) -> None:  # called with self._cond held, after a delete or a step
        if self._planned:
            return
        self._planned = True
        # a hair past due: ``_due`` compares a difference of two clock readings
        when = self._sched.t if self._steps else self._doomed_since + BATCH_S + 1e-6
        self._sched.at(when, self._send)

    def _send(self) -> None:
        with self._cond:
            self._planned = False
            steps, self._steps = self._steps, []
            batch: list[str] = []
            if self._due():
                batch, self._doomed = self._doomed[:BATCH], self._doomed[BATCH:]
                self._doomed_since = self._clock()
            if self._doomed or self._steps:
                self._start()
        self._sched.phase = "tidying"
        for fn in steps:
            self._run_one(fn)
        if batch:
            self._run_one(lambda: self._store.delete_many(batch))


@contextlib.contextmanager
def _claims_on(sched: Scheduler) -> Iterator[None]:
    """The claim scheduler ages its listing on ``time.monotonic()`` (it takes no clock for
    it): for the run, its module sees the virtual clock there, everything else of ``time``
    as it is."""
    real = claim_listing.time
    shim = types.SimpleNamespace(
        **{k: getattr(real, k) for k in dir(real) if not k.startswith("__")}
    )
    shim.monotonic = sched.ticks
    claim_listing.time = shim  # type: ignore[assignment]
    try:
        yield
    finally:
        claim_listing.time = real


# -- the simulation ------------------------------------------------------------------------


@dataclasses.dataclass
class Config:
    workers: int = 100
    invocations: int = 1000
    work_s: float = 0.5  # a body's run time (each one jittered ±50 %)
    rate: float = 0.0  # invocations submitted per second; 0: all of them before the start
    start_spread_s: float = 0.5  # workers start at random times within this
    latency_scale: float = 1.0  # multiplies every request's latency
    seed: int = 1
    limit_s: float = 3600.0  # virtual time after which the workers give up (a problem)
    progress: bool = False  # say on stderr at every tenth of the outcomes (long runs)


@dataclasses.dataclass
class Part:
    """What happened in a stretch of a run: the whole of it, or its steady part."""

    counts: dict[str, dict[str, int]]  # phase -> what -> n
    outcomes: int  # invocations that ended in it
    claims: int
    passes: int  # calls of Claimer.claim, those that found nothing included
    claim_cpu_s: float  # CPU time spent inside them (the claimer's own work)
    seconds: float  # virtual


@dataclasses.dataclass
class Report:
    config: Config
    seconds: float  # real time the simulation took
    ran: int  # bodies run
    whole: Part  # from the first worker's start to the last outcome
    steady: Part | None  # between the 10th and the 90th percentile of outcomes
    problems: list[str]


class Simulation:
    def __init__(self, config: Config, inner: MemoryStore | None = None) -> None:
        self.config = config
        self.sched = Scheduler()
        self._rng = random.Random(config.seed)
        self.inner = inner if inner is not None else MemoryStore()
        # MemoryStore counts its time on time.monotonic from a wall-clock anchor and takes
        # only the anchor: its clock (object mtimes, now()) is put on the virtual clock here
        epoch = time.time()
        self.inner._clock = lambda: epoch + self.sched.t  # type: ignore[method-assign]
        self.store = SimStore(self.inner, self.sched, _Latency(self._rng, config.latency_scale))
        self.ran: Counter[str] = Counter()
        self.claims = 0
        self.passes = 0  # calls of Claimer.claim, those that found nothing included
        self.claim_cpu_s = 0.0  # CPU time spent inside them (the claimer's own work)
        self.done = 0
        self.submitted = 0
        self.ids: list[str] = []
        self._marks: dict[int, Part] = {}
        self._first_start = math.inf
        self._began = time.perf_counter()
        self._last_outcome = 0.0

    def over(self) -> bool:
        if self.sched.t > self.config.limit_s:
            return True  # a run that does not end: reported by _check
        return self.submitted == self.config.invocations and self.done >= self.submitted

    def _producer(self) -> Callable[[], None]:
        q = dls.Dispatch(":memory:", store=self.store, ns=NS)
        f = q.udf(noop)

        def submit_one() -> None:
            self.sched.phase = "submit"
            self.ids.append(f.submit(x=len(self.ids)))
            self.submitted += 1

        return submit_one

    def _worker(self, w: int) -> Callable[[], None]:
        name = f"sim-{w:05d}"
        plane = Plane(store=self.store, ns=NS)
        ops = plane.ops(QUEUE)  # as Plane.claimer builds it, with the virtual tick clock
        ops._tidier = _SimTidier(self.store, self.sched)
        claimer = Claimer(ops, name, ticks=self.sched.ticks)
        jitter = random.Random(self.config.seed * 100_003 + w)

        def body() -> None:
            task = self.sched.in_task()
            assert task is not None
            self._first_start = min(self._first_start, self.sched.t)
            delay, announced = FIRST_POLL_S, -math.inf
            while not self.over():
                if self.sched.t - announced >= ANNOUNCE_S:
                    # run_worker's sign of life (before its first claim, then every
                    # announce_s): what a census of the workers counts
                    task.phase, announced = "announce", self.sched.t
                    sign = {"worker": name, "queues": [QUEUE], "status": "running"}
                    self.store.put(worker_key(NS, name), codec.encode(sign), OVERWRITE)
                task.phase = "claim"
                cpu = time.thread_time()  # this thread's CPU only: not the turns it waited
                held = claimer.claim(self.store.now(), None, self.over)
                self.claim_cpu_s += time.thread_time() - cpu
                self.passes += 1
                if held is None:
                    task.phase = "idle"
                    self.sched.sleep(delay)
                    delay = min(delay * 2, MAX_POLL_S)
                    continue
                delay = FIRST_POLL_S
                self.claims += 1
                rec = held.record
                self.ran[rec.id] += 1
                task.phase = "body"
                self.sched.sleep(self.config.work_s * jitter.uniform(0.5, 1.5))
                task.phase = "finish"
                result = ops.put_result(rec, b"\xc0", plane.spill_bytes)
                final = lifecycle.succeed(rec, held.token, result, self.store.now())
                ops.finish(held, final, tidy_later=True)
                self.done += 1
                self._last_outcome = self.sched.t
                self._mark()

        return body

    def _mark(self) -> None:
        n = self.config.invocations
        if self.config.progress and self.done % max(1, n // 10) == 0:
            print(
                f"    {self.done}/{n} ended, {self.sched.t:.1f} s virtual, "
                f"{time.perf_counter() - self._began:.0f} s real",
                file=sys.stderr,
            )
        for pct in (10, 90):
            if self.done == max(1, self.config.invocations * pct // 100):
                self._marks[pct] = self._part(self.store.counts.copy(), self.sched.t)

    def _part(self, counts: Counter[tuple[str, str]], seconds: float) -> Part:
        by_phase: dict[str, dict[str, int]] = {}
        for (phase, what), n in sorted(counts.items()):
            by_phase.setdefault(phase, {})[what] = n
        return Part(by_phase, self.done, self.claims, self.passes, self.claim_cpu_s, seconds)

    def run(self) -> Report:
        cfg = self.config
        random.seed(cfg.seed)  # the claimers' random pick over the head of the queue
        began = self._began = time.perf_counter()
        submit = self._producer()
        self.store.counts.clear()
        if cfg.rate > 0:
            for i in range(cfg.invocations):
                self.sched.at(i / cfg.rate, submit)
        else:
            for _ in range(cfg.invocations):
                submit()
        self.sched.phase = ""
        for w in range(cfg.workers):
            start = self._rng.uniform(0.0, cfg.start_spread_s)
            self.sched.spawn(start, f"sim-{w:05d}", self._worker(w))
        with _claims_on(self.sched):
            self.sched.run()
        return self._report(time.perf_counter() - began)

    # -- the report ---------------------------------------------------------------------------

    def _report(self, seconds: float) -> Report:
        drain = self._last_outcome - min(self._first_start, self._last_outcome)
        whole = self._part(self.store.counts, drain)
        steady = None
        if 10 in self._marks and 90 in self._marks:
            a, b = self._marks[10], self._marks[90]
            counts = {
                phase: {w: n - a.counts.get(phase, {}).get(w, 0) for w, n in seen.items()}
                for phase, seen in b.counts.items()
            }
            steady = Part(
                counts,
                b.outcomes - a.outcomes,
                b.claims - a.claims,
                b.passes - a.passes,
                b.claim_cpu_s - a.claim_cpu_s,
                b.seconds - a.seconds,
            )
        return Report(
            config=self.config,
            seconds=seconds,
            ran=sum(self.ran.values()),
            whole=whole,
            steady=steady,
            problems=self._check(whole.counts),
        )

    def _check(self, counts: dict[str, dict[str, int]]) -> list[str]:
        """Exactly once, nothing left behind, and counters that add up."""
        problems: list[str] = []
        n = self.config.invocations
        if self.sched.t > self.config.limit_s:
            problems.append(f"not drained within {self.config.limit_s:g} s of virtual time")
        if len(self.ids) != n or len(set(self.ids)) != n:
            problems.append(f"{len(set(self.ids))} distinct ids submitted, not {n}")
        twice = [i for i, k in self.ran.items() if k > 1]
        never = [i for i in self.ids if self.ran[i] == 0]
        if twice:
            problems.append(f"{len(twice)} invocations ran more than once, e.g. {twice[0]}")
        if never:
            problems.append(f"{len(never)} invocations never ran, e.g. {never[0]}")
        keys = QueueKeys(NS, QUEUE)
        wrong = 0
        for inv in self.ids:
            try:
                rec = Record.from_bytes(self.inner.get(keys.record(inv))[0], keys.record(inv))
            except NotFound:
                wrong += 1
                continue
            if rec.state != "succeeded" or rec.attempt != 1:
                wrong += 1
        if wrong:
            problems.append(f"{wrong} records are not succeeded at their first attempt")
        left = list(self.inner.list(keys.tickets_prefix))
        if left:
            problems.append(f"{len(left)} tickets left after the last batch delete")
        claim, finish = counts.get("claim", {}), counts.get("finish", {})
        if self.claims != sum(self.ran.values()):
            problems.append(f"{self.claims} claims counted but {sum(self.ran.values())} runs")
        # every claim is one record write that landed; every lost race one that did not
        won = claim.get("PUT", 0) - claim.get("PUT conflict", 0)
        if won != self.claims:
            problems.append(f"{won} claim writes landed for {self.claims} claims")
        if finish.get("PUT", 0) != self.done or finish.get("PUT conflict", 0):
            problems.append(f"{finish.get('PUT', 0)} outcome writes for {self.done} outcomes")
        for phase, seen in counts.items():
            found = sum(v for k, v in seen.items() if k.startswith("GET "))
            if found != seen.get("GET", 0):
                problems.append(f"{phase}: {found} GETs classified of {seen.get('GET', 0)}")
        return problems


def simulate(config: Config, inner: MemoryStore | None = None) -> Report:
    """Run one simulation (on ``inner``, a fresh memory store by default)."""
    return Simulation(config, inner).run()


# -- the command ---------------------------------------------------------------------------


_VERBS = ("GET", "PUT", "LIST", "DELETE", "BATCH_DELETE")


def figures(part: Part) -> dict[str, float]:
    """Per invocation (ended in the part) unless said otherwise; rates per virtual second.
    Submits are left out: a producer's requests, one PUT per invocation."""
    n = max(1, part.outcomes)
    queue: Counter[str] = Counter()
    outside = 0
    for phase, seen in part.counts.items():
        if phase == "submit":
            continue
        for what, k in seen.items():
            if what.startswith("_"):
                outside += k  # a worker's sign of life and the census of them
            else:
                queue[what] += k
    claim = part.counts.get("claim", {})
    per = {v.lower(): queue[v] / n for v in _VERBS}
    span = max(part.seconds, 1e-9)
    return {
        "invocations": part.outcomes,
        "seconds": part.seconds,
        "requests": sum(per.values()),
        **per,
        "batch_keys": queue["BATCH_KEYS"] / n,
        "lost_races_per_claim": claim.get("PUT conflict", 0) / max(1, part.claims),
        "gets_queued": claim.get("GET queued", 0) / n,
        "gets_taken": (claim.get("GET taken", 0) + claim.get("GET own", 0)) / n,
        "gets_ended": claim.get("GET ended", 0) / n,
        "gets_no_record": claim.get("GET no record", 0) / n,
        "empty_listings": claim.get("LIST empty", 0) / n,
        "passes": part.passes / n,
        "claim_cpu_ms": 1000 * part.claim_cpu_s / max(1, part.claims),
        "namespace_requests": outside / n,
        "invocations_per_s": part.outcomes / span,
        # writes: PUT, DELETE and every key of a batch delete (the cautious reading)
        "writes_per_s": (queue["PUT"] + queue["DELETE"] + queue["BATCH_KEYS"]) / span,
        "reads_per_s": (queue["GET"] + queue["LIST"]) / span,
        "writes_of_limit": (queue["PUT"] + queue["DELETE"] + queue["BATCH_KEYS"])
        / span
        / WRITES_PER_PREFIX,
        "reads_of_limit": (queue["GET"] + queue["LIST"]) / span / READS_PER_PREFIX,
        "requests_per_s": sum(queue[v] for v in _VERBS) / span,
        "namespace_requests_per_s": outside / span,
    }


def summary(r: Report) -> dict[str, Any]:
    """The configuration and figures of one run: the whole of it and its steady part."""
    return {
        **dataclasses.asdict(r.config),
        "real_s": r.seconds,
        "all": figures(r.whole),
        "steady": figures(r.steady) if r.steady is not None else None,
        "problems": r.problems,
    }


_COLUMNS = (  # heading, width, format, figure
    ("req/inv", 7, ".2f", "requests"),
    ("GET", 6, ".2f", "get"),
    ("PUT", 5, ".2f", "put"),
    ("LIST", 5, ".2f", "list"),
    ("DEL", 5, ".2f", "delete"),
    ("batch", 5, ".2f", "batch_delete"),
    ("races/claim", 11, ".3f", "lost_races_per_claim"),
    ("taken GETs", 10, ".2f", "gets_taken"),
    ("ended GETs", 10, ".2f", "gets_ended"),
    ("passes", 6, ".2f", "passes"),
    ("CPU ms", 6, ".1f", "claim_cpu_ms"),
    ("inv/s", 6, ".0f", "invocations_per_s"),
    ("writes/s", 8, ".0f", "writes_per_s"),
    ("of 3,500", 8, ".2f", "writes_of_limit"),
    ("reads/s", 8, ".0f", "reads_per_s"),
    ("of 5,500", 8, ".2f", "reads_of_limit"),
    ("seconds", 7, ".1f", "seconds"),
)


def _print(row: dict[str, Any], heading: bool) -> None:
    if heading:
        print(
            f"\n  {'workers':>7} {'invoc.':>6} {'part':>6} "
            + " ".join(f"{h:>{w}}" for h, w, _, _ in _COLUMNS)
        )
    for part in ("all", "steady"):
        f = row[part]
        if f is None:
            continue
        print(
            f"  {row['workers']:>7} {row['invocations']:>6} {part:>6} "
            + " ".join(f"{f[k]:>{w}{fmt}}" for _, w, fmt, k in _COLUMNS)
        )
    for p in row["problems"]:
        print(f"      PROBLEM: {p}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="10,100,1000", help="comma-separated worker counts")
    ap.add_argument("--per-worker", type=int, default=5, help="invocations per worker")
    ap.add_argument("--invocations", type=int, default=0, help="instead of --per-worker")
    ap.add_argument("--work-s", type=float, default=0.5)
    ap.add_argument("--rate", type=float, default=0.0, help="arrivals/s (0: a backlog)")
    ap.add_argument("--start-spread-s", type=float, default=0.5)
    ap.add_argument("--latency-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rows = []
    medians = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in LATENCY_S.items())
    print(
        f"\nlakeshore claim simulation, {time.strftime('%Y-%m-%d')}: memory store, virtual "
        f"clock, request latency medians {medians}"
        f" × {args.latency_scale:g}, bodies {args.work_s:g} s ±50 %, "
        + (f"{args.rate:g} arrivals/s" if args.rate else "a backlog submitted before the start")
    )
    for workers in (int(x) for x in args.workers.split(",")):
        config = Config(
            workers=workers,
            invocations=args.invocations or max(200, args.per_worker * workers),
            work_s=args.work_s,
            rate=args.rate,
            start_spread_s=args.start_spread_s,
            latency_scale=args.latency_scale,
            seed=args.seed,
            progress=True,
        )
        rows.append(summary(simulate(config)))
        _print(rows[-1], heading=len(rows) == 1)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "simulate.json").write_text(json.dumps(rows, indent=2))
    print(
        "\n  The workers' requests (a submit adds one PUT to the same prefix, not counted here)."
        "\n  Per invocation: requests to the queue's prefix by verb (LIST: per page of 1,000 keys;"
        "\n  DEL: single deletes of stale tickets; batch: DeleteObjects requests); races/claim:"
        "\n  claim writes that lost their condition, per claim; taken GETs: reads of an invocation"
        "\n  another worker held already; ended GETs: of one that had ended, its ticket not yet"
        "\n  deleted; passes: calls of Claimer.claim; CPU ms: the claimer's own CPU per claim."
        "\n  inv/s, writes/s (PUT, DELETE, each key of a batch delete) and reads/s (GET, LIST)"
        "\n  per virtual second, and as shares of one partitioned prefix's 3,500 writes and"
        "\n  5,500 reads a second (S3's published rates). all: the whole run, start-up and"
        "\n  tail included; steady: between the 10th and the 90th percentile of outcomes."
        "\n  seconds: virtual."
    )
    if any(s["problems"] for s in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
