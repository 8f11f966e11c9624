"""What every provider does: launch workers for a queue, list the ones alive, cancel some.

A provider is a thin adapter over a tool that already schedules things (a process table,
SLURM, Kubernetes): lakeshore never runs a scheduler of its own. It keeps no state the tool
does not: what is alive is whatever the tool lists, so a scaler that restarts (or a second
scaler after a takeover) sees the fleet as it is, launched-but-waiting workers included.
"""

from __future__ import annotations

import abc
import re
import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from lakeshore.errors import ProviderError
from lakeshore.model.provider import ProviderConfig

__all__ = ["STATES", "Launched", "Provider", "WorkerSpec", "run_tool", "tag_of", "valid_id"]

STATES = ("pending", "running")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,199}\Z")


def tag_of(ns: str, queue: str) -> str:
    """The name every worker of ``queue`` carries in its provider (a SLURM job name):
    unambiguous, because names of namespaces and queues never hold a colon."""
    return f"lakeshore:{ns}:{queue}"


@dataclass(frozen=True)
class WorkerSpec:
    """One kind of worker to launch: the command that serves ``queue`` (without its
    ``--worker-id``, which the provider adds so each worker's name says where it runs) and
    the queue's provider block (resources, for the providers that take them)."""

    ns: str
    queue: str
    argv: tuple[str, ...]
    block: ProviderConfig

    @property
    def tag(self) -> str:
        return tag_of(self.ns, self.queue)


@dataclass(frozen=True)
class Launched:
    """A worker a provider launched and still lists: ``pending`` (waiting to start, e.g. in
    the SLURM queue) or ``running``."""

    id: str
    tag: str
    state: str


class Provider(abc.ABC):
    """Launch, list and cancel workers. Every method may be slow (it runs a tool); none
    writes to the store.

    Raises (every method): ProviderError when the tool fails, is missing or times out.
    """

    kind: str = ""

    @abc.abstractmethod
    def launch(self, spec: WorkerSpec, n: int, timeout: float = 60.0) -> list[str]:
        """Start ``n`` workers of ``spec`` within ``timeout`` seconds; returns their ids.

        The scaler gives half its lease as ``timeout``: a launch still under way when the
        lease could pass to another scaler would be one that scaler cannot see yet.
        """

    @abc.abstractmethod
    def list(self, tags: Collection[str]) -> list[Launched]:
        """The workers with these tags that are still pending or running."""

    @abc.abstractmethod
    def cancel(self, ids: Sequence[str]) -> None:
        """Stop these workers (SIGTERM first: a running attempt is handed back)."""

    def close(self) -> None:  # noqa: B027 - most providers hold nothing
        """Let go of what the provider holds (not the workers: they live on)."""


def valid_id(value: str) -> str | None:
    """A worker id as a tool printed it, or None when it is not one (then it is passed
    over: a tool's output is not trusted to name what to cancel)."""
    return value if _ID.match(value) else None


def run_tool(
    argv: Sequence[str] | str,
    op: str,
    *,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 60.0,
    shell: bool = False,
) -> str:
    """Run a provider's tool and return what it printed.

    Raises:
        ProviderError: the tool is missing, exits non-zero or takes longer than ``timeout``.
    """
    shown = argv if isinstance(argv, str) else " ".join(argv)
    try:
        done = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            shell=shell,
            check=False,
        )
    except FileNotFoundError:
        raise ProviderError(
            op,
            f"{shown.split()[0]!r} is not installed here",
            "run the scaler where the provider's tools are (a SLURM login node for slurm)",
            command=shown,
        ) from None
    except subprocess.TimeoutExpired:
        raise ProviderError(
            op,
            f"{shown!r} did not finish in {timeout:g} s",
            "check the provider's tool; nothing is launched until it answers",
            command=shown,
        ) from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ProviderError(
            op,
            f"{shown!r} exited with {done.returncode}: {said[-1] if said else 'no message'}",
            "fix what the tool says; nothing more is launched until it succeeds",
            command=shown,
            returncode=done.returncode,
        )
    return done.stdout
