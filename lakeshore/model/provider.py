"""A queue's provider block: who supplies its workers, and the bounds the scaler keeps to.

Stored inside the queue record (``provider``, ``None`` by default: workers are attached by
hand). It holds data only, never shell text or module names: whoever can write the queue
record must not be able to make a scaler run a command or a worker import a module. What
runs (a SLURM set-up line, the ``command`` provider's templates, ``--import`` modules) is
given to ``lakeshore scale`` on the machine it runs on.

Pure: no store, no provider tool here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from lakeshore.errors import InvalidArgument

__all__ = ["KINDS", "SLURM_FIELDS", "ProviderConfig"]

KINDS = ("local", "slurm", "command")
# passed to sbatch as one argv element each (--partition=VALUE), never through a shell
SLURM_FIELDS = ("partition", "account", "qos", "time_limit", "mem", "gres", "constraint")
# one argv element, so & | [ ] (SLURM's feature expressions) are only characters
_TOKEN = re.compile(r"[A-Za-z0-9\[][A-Za-z0-9_.:,+=/*&|\[\]-]{0,127}\Z")
# name -> (lowest, highest); the highest keeps a typo (or a hostile record) from ordering
# a fleet no one can pay for, or a wait no one will live to see
_INTS = {
    "max_workers": (1, 10_000),
    "jobs_per_worker": (1, 1_000_000),
    "concurrency": (1, 1024),
    "cpus_per_task": (1, 4096),
}
_SECONDS = {
    "cooldown_s": (0.0, 86_400.0),
    "idle_exit_s": (1.0, 7 * 86_400.0),
    "grace_s": (0.0, 3600.0),
}


@dataclass(frozen=True)
class ProviderConfig:
    """Who supplies a queue's workers and within which bounds.

    Attributes:
        kind: ``"local"`` (processes on the scaler's machine), ``"slurm"`` (array jobs) or
            ``"command"`` (the scaler's shell templates: Kubernetes, AWS Batch, a VM pool).
        max_workers: hard maximum of this queue's workers alive at once, started or not.
            There is no minimum: workers leave after ``idle_exit_s`` without work, and a
            queue with nothing to do has none (a floor would need workers that never idle
            out, and a way to retire them; not built).
        jobs_per_worker: live invocations one worker is meant to take; the scaler wants
            ``ceil(live / jobs_per_worker)`` workers.
        cooldown_s: least time between two launches for the queue.
        idle_exit_s: a worker leaves after this long without work (its ``--idle-exit``).
        concurrency: attempts at once per worker (its ``--concurrency``).
        grace_s: after SIGTERM (a cancel, a time limit) running attempts get this long to
            finish before they are handed back. Keep it below SLURM's ``KillWait``.
        partition, account, qos, time_limit, mem, gres, constraint, cpus_per_task: SLURM
            resources (``kind="slurm"`` only), passed to ``sbatch`` as given.
    """

    kind: str
    max_workers: int = 4
    jobs_per_worker: int = 10
    cooldown_s: float = 30.0
    idle_exit_s: float = 60.0
    concurrency: int = 1
    grace_s: float = 20.0
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None
    mem: str | None = None
    gres: str | None = None
    constraint: str | None = None
    cpus_per_task: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in KINDS:
            problems.append(f"provider kind must be one of {KINDS}, got {self.kind!r}")
        for name, (lo, hi) in _INTS.items():
            value = getattr(self, name)
            if value is None and name == "cpus_per_task":
                continue
            if type(value) is not int or not lo <= value <= hi:
                problems.append(f"provider {name} must be an integer {lo}..{hi}, got {value!r}")
        for name, (flo, fhi) in _SECONDS.items():
            value = getattr(self, name)
            if (
                type(value) not in (int, float)
                or not math.isfinite(value)
                or not flo <= value <= fhi
            ):
                problems.append(f"provider {name} must be a number {flo:g}..{fhi:g}, got {value!r}")
        for name in SLURM_FIELDS:
            value = getattr(self, name)
            if value is not None and (type(value) is not str or not _TOKEN.match(value)):
                problems.append(
                    f"provider {name} must be one word of letters, digits and _.:,+=/*&|[]- "
                    f"(at most 128), got {value!r}"
                )
        if self.kind != "slurm":
            slurm_only = [n for n in (*SLURM_FIELDS, "cpus_per_task") if getattr(self, n)]
            if slurm_only:
                problems.append(f"provider {', '.join(slurm_only)}: only for kind 'slurm'")
        if problems:
            raise InvalidArgument(
                "queue config", "; ".join(problems), "fix the provider setting(s) and try again"
            )

    @classmethod
    def from_value(cls, value: Any) -> ProviderConfig | None:
        """A provider block from what a caller or a record gave: ``None``, a kind name, a
        map of fields (``kind`` required) or a ``ProviderConfig``.

        Raises:
            InvalidArgument: an unknown field, a missing kind or a bad value.
        """
        if value is None or isinstance(value, ProviderConfig):
            return value
        if isinstance(value, str):
            return cls(kind=value)
        if type(value) is not dict:
            raise InvalidArgument(
                "queue config",
                f"provider must be a kind name, a map of settings or None, got {value!r}",
                "e.g. provider='slurm' or provider={'kind': 'slurm', 'max_workers': 4}",
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown or "kind" not in value:
            what = f"unknown provider setting(s) {unknown}" if unknown else "no provider kind"
            raise InvalidArgument("queue config", what, f"known settings: {sorted(known)}")
        return cls(**value)

    def with_field(self, name: str, value: Any) -> ProviderConfig:
        """A validated copy with one field changed (``queue set provider.NAME=VALUE``).

        Raises:
            InvalidArgument: an unknown field or a bad value.
        """
        known = {f.name for f in dataclasses.fields(self)}
        if name not in known:
            raise InvalidArgument(
                "queue config",
                f"unknown provider setting {name!r}",
                f"known settings: {sorted(known)}",
            )
        if name in _SECONDS and type(value) is int:
            value = float(value)
        if name in SLURM_FIELDS and type(value) in (int, float):
            value = str(value)  # `queue set provider.partition=2024` reads a number
        return dataclasses.replace(self, **{name: value})

    def public(self) -> dict[str, Any]:
        """The fields that say something: the kind, the bounds, and SLURM resources set."""
        d = dataclasses.asdict(self)
        return {k: v for k, v in d.items() if v is not None}

    def describe(self) -> str:
        """One line for ``queue show`` and ``status``: ``slurm, up to 4 workers, …``."""
        resources = (*SLURM_FIELDS, "cpus_per_task")
        extra = [f"{k}={v}" for k, v in self.public().items() if k in resources]
        return (
            f"{self.kind}, up to {self.max_workers} workers, "
            f"{self.jobs_per_worker} jobs each, idle exit {self.idle_exit_s:g} s"
            + (f" ({', '.join(extra)})" if extra else "")
        )
