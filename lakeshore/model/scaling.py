"""The scaler's decision rule: how many workers a queue wants, and what to launch or cancel.

Pure arithmetic on what the scaler just read: live invocations (tickets), the queue's
workers the provider lists (waiting ones count: a task stuck in the SLURM queue is a worker
on its way, so the scaler never submits again for the same work), the workers of every queue
this scaler serves (for its own cap), and the time since the last launch.

    wanted = min(ceil(live / jobs_per_worker), max_workers)
    launch = wanted - alive, if positive, within the scaler's cap, once the cool-down is over
    cancel = every waiting worker, once nothing is live (never a running one: those leave
             by idle exit)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lakeshore.model.provider import ProviderConfig

__all__ = ["Decision", "decide"]


@dataclass(frozen=True)
class Decision:
    wanted: int
    launch: int = 0
    cancel: int = 0  # of the waiting workers
    why: str = ""


def decide(
    block: ProviderConfig,
    live: int,
    running: int,
    pending: int,
    *,
    fleet: int | None = None,
    cap: int | None = None,
    since_launch: float | None = None,
) -> Decision:
    """What to do for one queue now.

    Args:
        block: the queue's provider block (bounds, jobs per worker, cool-down).
        live: the queue's queued and running invocations.
        running, pending: the queue's workers the provider lists, started or waiting.
        fleet: workers of every queue this scaler serves, for ``cap`` (default: this queue's).
        cap: the scaler's own maximum over all its queues (None: no cap of its own).
        since_launch: seconds since the queue's last launch (None: never).
    """
    alive = running + pending
    wanted = math.ceil(live / block.jobs_per_worker) if live > 0 else 0
    wanted = min(wanted, block.max_workers)
    if wanted > alive:
        n = wanted - alive
        if cap is not None:
            room = max(0, cap - (alive if fleet is None else fleet))
            if room == 0:
                return Decision(wanted, why=f"at the scaler's cap of {cap} workers")
            n = min(n, room)
        if since_launch is not None and since_launch < block.cooldown_s:
            left = block.cooldown_s - since_launch
            return Decision(wanted, why=f"cooling down, {left:.0f} s left")
        return Decision(wanted, launch=n, why=f"{live} live, {alive} workers")
    if live == 0 and pending > 0:
        # only once the queue is empty: cancelling while the depth merely dips would lose
        # the waiting tasks their place in the SLURM queue, to submit them again next round
        return Decision(wanted, cancel=pending, why="nothing live: waiting workers not needed")
    if live == 0:
        return Decision(
            wanted, why=f"nothing live; {alive} leave by idle exit" if alive else "nothing to do"
        )
    return Decision(wanted, why="enough workers")
