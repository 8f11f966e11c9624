"""The scaler: reads a queue's depth, decides how many workers it needs, asks the provider.

A :class:`Scaler` is the only code that joins the store and a provider. Each round, per queue,
it reads the queue record's provider block, counts the live tickets (only as far as a larger
count would change the decision), takes or renews the queue's scaler lease
(``lakeshore.protocol.scaler_lease``), lists the provider's workers, decides
(``lakeshore.model.scaling.decide``) and launches or cancels.

One scaler acts per queue, and none acts in doubt: without the lease, the store or the
provider's list, a round launches nothing. A launch is fenced by writing its time into the
lease right before the provider is asked and must end within half that lease, and a round
whose lease is older than half its length acts not at all, so a scaler that lost the lease
can never launch beside the one that took it over. It never stops a running worker: workers
leave by ``--idle-exit``. The round and its rules: docs/providers.md#one-scaler-acts-the-lease.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lakeshore.errors import (
    InvalidArgument,
    LakeshoreError,
    NewerRecord,
    NotFound,
    ProviderError,
    RecordError,
)
from lakeshore.keys import check_name
from lakeshore.model import lifecycle
from lakeshore.model.provider import ProviderConfig
from lakeshore.model.record import Record
from lakeshore.model.scaling import decide
from lakeshore.plane import HasPlane, Plane, plane_of
from lakeshore.protocol.census import live_tickets
from lakeshore.protocol.scaler_lease import MAX_LEASE_S, Held, ScalerLeases
from lakeshore.protocol.steps import QueueOps
from lakeshore.providers.base import Provider, WorkerSpec, tag_of
from lakeshore.store.base import ObjectInfo

__all__ = ["JUDGED_UP_TO", "ScaleReport", "Scaler"]

JUDGED_UP_TO = 64  # live invocations up to which the tickets' contents are read
_IMPLAUSIBLE_RECHECK_S = 600.0

log = logging.getLogger("lakeshore.scale")


@dataclass
class ScaleReport:
    """What one round did for one queue."""

    queue: str
    acting: bool = False
    holder: str | None = None  # who holds the lease when this scaler does not
    live: int | None = None
    more: bool = False  # live is a lower bound: counting stopped where it changed nothing
    running: int = 0
    pending: int = 0
    wanted: int = 0
    launched: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    why: str = ""
    error: str | None = None

    def line(self) -> str:
        """One line for the scaler's log."""
        if self.error:
            return f"{self.queue}: {self.error}"
        if self.holder is not None:
            return f"{self.queue}: another scaler acts ({self.holder}); launching nothing"
        if self.live is None:  # let go, or no provider
            return f"{self.queue}: {self.why}"
        done = ""
        if self.launched:
            done = f"; launched {len(self.launched)}: {', '.join(self.launched)}"
        if self.cancelled:
            done += f"; cancelled {len(self.cancelled)} waiting: {', '.join(self.cancelled)}"
        return (
            f"{self.queue}: {self.live}{'+' if self.more else ''} live, workers "
            f"{self.running} running + "
            f"{self.pending} waiting, wants {self.wanted} ({self.why}){done}"
        )

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class Scaler:
    """Keeps the queues' workers in line with their depth, through one provider.

    Args:
        plane: the store and namespace of the queues: a ``Dispatch``, or its ``Plane``.
        queues: the queues to serve; each must have a provider block of this provider's kind.
        provider: launches, lists and cancels the workers.
        url: the store URL workers get (default: the plane's).
        imports: the workers' ``--import`` modules.
        allow: the workers' ``--allow`` patterns.
        python: the interpreter workers run (default: this one, which suits a shared venv).
        max_workers: the scaler's own cap over all its queues together, whatever the queue
            records say (None: the records' maxima only).
        interval_s: seconds between rounds.
        lease_s: the lease's length: 2 × interval_s to ``MAX_LEASE_S`` (default
            ``max(3 × interval_s, 30)``).
        clock: the store's clock, for tests (default ``plane.store.now``).
        monotonic: the scaler's own clock, for tests.

    Raises:
        InvalidArgument: no queues, a bad name, a ``:memory:`` store (workers elsewhere
            cannot see it), or a bad interval, lease or cap.
    """

    def __init__(
        self,
        plane: Plane | HasPlane,
        queues: Sequence[str],
        provider: Provider,
        *,
        url: str | None = None,
        imports: Sequence[str] = (),
        allow: Sequence[str] = (),
        python: str | None = None,
        max_workers: int | None = None,
        interval_s: float = 30.0,
        lease_s: float | None = None,
        clock: Callable[[], float] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not queues:
            raise InvalidArgument("scale", "no queue given", "name the queues to scale")
        plane = plane_of(plane)
        self.plane: Plane = plane
        self.url = url or plane.store.url
        if self.url == ":memory:":
            raise InvalidArgument(
                "scale",
                "a :memory: store lives inside one process: launched workers cannot reach it",
                "use a file:// or s3:// store",
            )
        if max_workers is not None and (type(max_workers) is not int or max_workers < 1):
            raise InvalidArgument(
                "scale", f"max_workers must be >= 1, got {max_workers!r}", "give a whole number"
            )
        if not 0.05 <= interval_s <= MAX_LEASE_S / 2:
            raise InvalidArgument(
                "scale",
                f"the interval must be 0.05..{MAX_LEASE_S / 2:g} s, got {interval_s}",
                f"give another (the lease must last two rounds, at most {MAX_LEASE_S:g} s)",
            )
        lease_s = lease_s if lease_s is not None else min(max(3 * interval_s, 30.0), MAX_LEASE_S)
        if not 2 * interval_s <= lease_s <= MAX_LEASE_S:
            raise InvalidArgument(
                "scale",
                f"the lease must last 2 x the interval ({2 * interval_s:g} s) to "
                f"{MAX_LEASE_S:g} s, got {lease_s:g}",
                "a lease shorter than two rounds lapses between them: lengthen it",
            )
        self.provider = provider
        self.queues = [check_name(q, "queue") for q in dict.fromkeys(queues)]
        self.imports, self.allow = list(imports), list(allow)
        self.python = python or sys.executable
        self.max_workers, self.interval_s = max_workers, interval_s
        self.lease_s = float(lease_s)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.monotonic = monotonic
        self._leases = {
            q: ScalerLeases(plane.store, plane.ops(q).keys, self.owner, self.lease_s, clock)
            for q in self.queues
        }
        self._held: dict[str, Held] = {}
        # queue -> ticket key -> (its etag, counts as work, judged again after this store time)
        self._judged: dict[str, dict[str, tuple[str, bool, float]]] = {}

    @property
    def tags(self) -> list[str]:
        """The names its queues' workers carry in the provider (a SLURM job name)."""
        return [tag_of(self.url, self.plane.ns, q) for q in self.queues]

    def worker_argv(self, queue: str, block: ProviderConfig) -> tuple[str, ...]:
        """The command of one worker of ``queue`` (the provider adds ``--worker-id``)."""
        argv = [self.python, "-m", "lakeshore", "worker", "--url", self.url]
        argv += ["--ns", self.plane.ns, "--queue", queue, "--idle-exit", f"{block.idle_exit_s:g}"]
        argv += ["--concurrency", str(block.concurrency), "--grace", f"{block.grace_s:g}"]
        for module in self.imports:
            argv += ["--import", module]
        for pattern in self.allow:
            argv += ["--allow", pattern]
        return tuple(argv)

    def tick(self) -> list[ScaleReport]:
        """One round over every queue (see the module docstring)."""
        reports = []
        launched_now = 0
        for queue in self.queues:
            report = ScaleReport(queue)
            reports.append(report)
            try:
                launched_now += self._one(report, launched_now)
            except LakeshoreError as e:  # the store or the provider's tool: no launch
                report.error = str(e)
            except Exception as e:  # a bug must not end the loop that keeps the fleet
                log.debug("scale round of %s failed", queue, exc_info=True)
                report.error = f"scale {queue}: {type(e).__name__}: {e} — a bug; please report it"
        return reports

    def _one(self, report: ScaleReport, launched_now: int) -> int:
        """One queue's part of a round; returns how many workers it launched."""
        queue, leases = report.queue, self._leases[report.queue]
        block = self.plane.settings.read(queue)[0].provider
        if block is None or block.kind != self.provider.kind:
            self._let_go(queue)  # the scaler of the queue's provider must be able to act
            if block is None:
                report.why = "no provider on the queue record: workers are attached by hand"
            else:
                report.error = (
                    f"the queue's provider is {block.kind!r} but this scaler runs "
                    f"{self.provider.kind!r}: launching nothing — start a {block.kind} scaler"
                )
            return 0
        # the depth before the lease: a deep (or forged) ticket listing never eats into it;
        # counting stops where no larger number would change the decision
        ops = self.plane.ops(queue)
        enough = block.max_workers * block.jobs_per_worker
        # delayed work counts once it is as near as _judge counts it (its id tells, unread)
        due_by = ops.store.now() + block.idle_exit_s
        tickets, report.more = live_tickets(ops.store, ops.keys, enough, due_by)
        live = len(tickets)
        if not report.more and 0 < live <= JUDGED_UP_TO:
            # a near-empty queue: read what its tickets hold (once per ticket and etag), so a
            # gc tombstone or a work queue's payload does not keep a worker cycling for ever
            live = sum(map(self._judge(ops, block.idle_exit_s), tickets))
        started = self.monotonic()
        held, seen = leases.take(self._held.pop(queue, None))
        if held is None:
            report.holder = seen.owner if seen else "a scaler whose write won just now"
            return 0
        self._held[queue] = held
        report.acting = True
        # listed after the lease is held, never before: a launch by the lease's previous
        # holder is then finished and visible (its launches end within half its lease)
        listed = self.provider.list(self.tags)
        mine = [w for w in listed if w.tag == tag_of(self.url, self.plane.ns, queue)]
        report.live = live
        if report.more:  # counting stopped early: at least enough, whatever it had reached
            live = max(live, enough)
        report.running = sum(w.state == "running" for w in mine)
        report.pending = len(mine) - report.running
        launched_at = held.lease.launched_at
        since = None if launched_at is None else max(0.0, leases.clock() - launched_at)
        d = decide(
            block,
            live,
            report.running,
            report.pending,
            fleet=len(listed) + launched_now,  # may count this round's launches twice: safe
            cap=self.max_workers,
            since_launch=since,
        )
        report.wanted, report.why = d.wanted, d.why
        if not (d.launch or d.cancel):
            return 0
        if self.monotonic() - started > self.lease_s / 2:
            report.why = "this round took over half the lease: acting next round instead"
            return 0
        if d.cancel:
            waiting = sorted((w.id for w in mine if w.state == "pending"), key=_newest_first)
            report.cancelled = waiting[: d.cancel]
            self.provider.cancel(report.cancelled)
        if d.launch:
            return self._launch(report, held, block, d.launch)
        return 0

    def _launch(self, report: ScaleReport, held: Held, block: ProviderConfig, n: int) -> int:
        """Mark the launch in the lease, then launch, all within half a lease of the mark:
        the lease the mark renewed lasts a whole one, so the launch is over (and listed)
        before any other scaler can take the lease."""
        queue, leases = report.queue, self._leases[report.queue]
        deadline = self.monotonic() + self.lease_s / 2
        marked = leases.mark_launch(held)
        if marked is None:  # taken over between the renewal and now
            self._held.pop(queue, None)
            report.acting, report.why = False, "the lease was taken over: launching nothing"
            return 0
        self._held[queue] = marked
        left = deadline - self.monotonic()
        if left <= 0:
            report.why = "the lease write took over half the lease: launching next round"
            return 0
        argv = self.worker_argv(queue, block)
        spec = WorkerSpec(self.url, self.plane.ns, queue, argv, block)
        try:
            report.launched = self.provider.launch(spec, n, timeout=left)
        except ProviderError as e:  # some arrays may be queued: say which, and the error
            report.launched = list(e.details.get("launched", []))
            report.error = str(e)
        return len(report.launched)

    def _judge(self, ops: QueueOps, horizon: float) -> Callable[[ObjectInfo], bool]:
        """Whether a ticket stands for work this scaler's workers take. A ticket that holds
        a record (an invocation nothing has claimed yet, or a gc tombstone) counts when it
        is a queued function call of a schema this version reads: not a tombstone, a
        payload or a newer record, nor one whose times cannot be true
        (``lifecycle.implausible``: claimers fail it) or that is not due within ``horizon``
        (the workers' ``idle_exit_s``: one launched for it would leave first). Any other
        ticket (a claimed, released or rerun invocation's, which holds a marker while the
        truth is in its record) counts. Remembered by key and etag: a ticket is read once,
        and one not yet due again once it is that close."""
        judged = self._judged.setdefault(ops.keys.queue, {})
        now = ops.store.now()

        def counts(info: ObjectInfo) -> bool:
            hit = judged.get(info.key)
            if hit is not None and hit[0] == info.etag and hit[2] > now:
                return hit[1]
            until = math.inf
            try:
                rec = Record.from_bytes(ops.read_bounded(info.key)[0], info.key)
                verdict = rec.state in ("queued", "running") and not rec.is_payload
                if verdict and lifecycle.implausible(rec, now) is not None:
                    # the first claimer fails it: no work (judged again in a while, in case
                    # it was this scaler's clock that was off)
                    verdict, until = False, now + _IMPLAUSIBLE_RECHECK_S
                elif verdict and rec.not_before > now + horizon:
                    # not due before a worker launched now would have left again: work
                    # only once it is that close
                    verdict, until = False, rec.not_before - horizon
            except (NotFound, NewerRecord):
                verdict = False  # gone since the listing, or not this version's to run
            except RecordError:
                verdict = True  # a marker (or unreadable): live as far as the ticket says
            if len(judged) > 4 * JUDGED_UP_TO:
                judged.clear()  # tickets come and go: forget the old ones now and then
            judged[info.key] = (info.etag, verdict, until)
            return verdict

        return counts

    def _let_go(self, queue: str) -> None:
        held = self._held.pop(queue, None)
        if held is not None:
            self._leases[queue].release(held)

    def run(
        self,
        stop: threading.Event | None = None,
        on_report: Callable[[ScaleReport], None] | None = None,
        once: bool = False,
    ) -> None:
        """Rounds every ``interval_s`` until ``stop`` is set (or one round, ``once``); the
        leases are given back at the end, so the next scaler need not wait one out."""
        stop = stop or threading.Event()
        try:
            while True:
                for report in self.tick():
                    (on_report or _log)(report)
                if once or stop.wait(self.interval_s):
                    return
        finally:
            self.close()

    def close(self) -> None:
        """Give back the leases held (best effort) and let go of the provider."""
        for queue, held in list(self._held.items()):
            with contextlib.suppress(LakeshoreError):
                self._leases[queue].release(held)
        self._held.clear()
        self.provider.close()


def _newest_first(worker: str) -> tuple[int, int, int, str]:
    """SLURM ids (``<job>_<task>``) by number, newest first (the last queued go first);
    other ids after them, by name."""
    job, _, task = worker.partition("_")
    if job.isdigit() and task.isdigit():
        return (0, -int(job), -int(task), "")
    return (1, 0, 0, worker)


def _log(report: ScaleReport) -> None:
    log.log(logging.WARNING if report.error else logging.INFO, "%s", report.line())
