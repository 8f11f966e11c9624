"""What every provider does: launch workers for a queue, list the ones alive, cancel some.

A provider is a thin adapter over a tool that already schedules things (a process table,
SLURM, Kubernetes): lakeshore never runs a scheduler of its own. It keeps no state the tool
does not: what is alive is whatever the tool lists, so a scaler that restarts (or a second
scaler after a takeover) sees the fleet as it is, launched-but-waiting workers included.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import os
import re
import signal
import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from lakeshore.errors import ProviderError
from lakeshore.model.provider import ProviderConfig

__all__ = [
    "STATES",
    "Launched",
    "Provider",
    "WorkerSpec",
    "parse_tag",
    "run_tool",
    "store_id",
    "tag_of",
    "valid_id",
]

STATES = ("pending", "running")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,199}\Z")


def store_id(url: str) -> str:
    """Eight hex digits naming the store workers are given: two stores with a namespace and
    a queue of the same names (two projects on one cluster) never count each other's
    workers."""
    return hashlib.sha256(url.encode()).hexdigest()[:8]


def tag_of(url: str, ns: str, queue: str) -> str:
    """The name every worker of ``queue`` carries in its provider (a SLURM job name):
    ``lakeshore:<ns>:<queue>:<store id>``, unambiguous because names of namespaces and
    queues never hold a colon."""
    return f"lakeshore:{ns}:{queue}:{store_id(url)}"


def parse_tag(tag: str) -> tuple[str, str, str]:
    """``(ns, queue, store id)`` of a tag made by :func:`tag_of`.

    Raises:
        ValueError: not such a tag.
    """
    root, ns, queue, store = tag.split(":")
    if root != "lakeshore":
        raise ValueError(tag)
    return ns, queue, store


@dataclass(frozen=True)
class WorkerSpec:
    """One kind of worker to launch: the command that serves ``queue`` (without its
    ``--worker-id``, which the provider adds so each worker's name says where it runs) and
    the queue's provider block (resources, for the providers that take them). ``url`` is
    the store URL the workers get: part of the tag."""

    url: str
    ns: str
    queue: str
    argv: tuple[str, ...]
    block: ProviderConfig

    @property
    def tag(self) -> str:
        return tag_of(self.url, self.ns, self.queue)


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


def _abandon(proc: subprocess.Popen[bytes]) -> None:
    """Reap a killed tool without waiting on its pipes: a process that escaped into a
    session of its own may hold them open for as long as it lives."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            if pipe is not None:
                pipe.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def run_tool(
    argv: Sequence[str] | str,
    op: str,
    *,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 60.0,
    shell: bool = False,
) -> str:
    """Run a provider's tool and return what it printed (undecodable bytes replaced).

    The tool runs in a session of its own: on a timeout the whole session is killed, so a
    template's background subshell cannot go on launching after the scaler gave up on it.

    Raises:
        ProviderError: the tool is missing, cannot be run, exits non-zero or takes longer
            than ``timeout``.
    """
    shown = argv if isinstance(argv, str) else " ".join(argv)
    try:
        given = stdin.encode() if stdin is not None else None
    except UnicodeEncodeError as e:  # before anything starts: nothing half-done
        raise ProviderError(
            op, f"the input for {shown!r} cannot be encoded: {e}", "fix --setup or --import"
        ) from None
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            shell=shell,
            start_new_session=True,
        )
    except OSError as e:
        missing = isinstance(e, FileNotFoundError)
        raise ProviderError(
            op,
            f"{shown.split()[0]!r} is not installed here" if missing else f"{shown!r}: {e}",
            "run the scaler where the provider's tools are (a SLURM login node for slurm)",
            command=shown,
        ) from None
    try:
        out, err = proc.communicate(given, timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        _abandon(proc)
        raise ProviderError(
            op,
            f"{shown!r} did not finish in {timeout:g} s: killed, with its session; what it "
            "had started in a session of its own may still have launched",
            "check the provider's tool; the next rounds count what it launched",
            command=shown,
        ) from None
    said = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
    if proc.returncode != 0:
        lines = said.splitlines()
        raise ProviderError(
            op,
            f"{shown!r} exited with {proc.returncode}: {lines[-1] if lines else 'no message'}",
            "fix what the tool says; nothing more is launched until it succeeds",
            command=shown,
            returncode=proc.returncode,
        )
    return out.decode(errors="replace")
