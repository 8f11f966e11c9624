"""``slurm``: workers as SLURM array jobs, seen with ``squeue`` and stopped with ``scancel``.

One launch is one ``sbatch --array=0-(n-1)``: each task ``exec``s ``lakeshore worker
--idle-exit …`` (after the scaler's set-up line, if any), so the worker itself receives the
SIGTERM SLURM sends on ``scancel``, preemption or the time limit, and hands its running
attempt back within its grace. The job name is the queue's tag, which is how ``squeue``
finds a queue's workers again, waiting ones included, from any scaler.

No accounting database is needed: only live jobs matter, and ``squeue`` lists those.
"""

from __future__ import annotations

import getpass
import os
import shlex
from collections.abc import Collection, Mapping, Sequence

from lakeshore.errors import ProviderError
from lakeshore.providers.base import Launched, Provider, WorkerSpec, run_tool, valid_id

__all__ = ["SlurmProvider"]

# squeue's long state names: waiting to run, or running (being signalled or cleaned up
# counts: the task still holds its allocation)
_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING"}
_PENDING |= {"SUSPENDED", "STOPPED"}
_RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"}
_OPTIONS = {
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "time_limit": "--time",
    "mem": "--mem",
    "gres": "--gres",
    "constraint": "--constraint",
    "cpus_per_task": "--cpus-per-task",
}


class SlurmProvider(Provider):
    """Array jobs on the cluster this machine submits to.

    Args:
        setup: shell lines run before the worker (``module load python; source venv/bin/
            activate``): given to the scaler on its machine, never read from the store.
        log_dir: where the tasks' output goes (``%x-%A_%a.out``); default: SLURM's (the
            scaler's working directory).
        env: the environment of ``sbatch``/``squeue``/``scancel`` (and so, with SLURM's
            default ``--export=ALL``, of the workers); default: the scaler's.
    """

    kind = "slurm"

    def __init__(
        self,
        setup: str | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> None:
        self.setup = setup
        self.log_dir = os.fspath(log_dir) if log_dir else None
        self.env = env
        self.user = user or getpass.getuser()

    def script(self, spec: WorkerSpec) -> str:
        """The batch script of one array task."""
        lines = ["#!/bin/sh", f"# lakeshore worker for queue {spec.ns}/{spec.queue}"]
        if self.setup:
            lines.append(self.setup)
        worker_id = '"slurm-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
        lines.append(f"exec {shlex.join(spec.argv)} --worker-id {worker_id}")
        return "\n".join(lines) + "\n"

    def launch(self, spec: WorkerSpec, n: int, timeout: float = 60.0) -> list[str]:
        argv = ["sbatch", "--parsable", f"--job-name={spec.tag}", f"--array=0-{n - 1}"]
        if self.log_dir:
            argv.append(f"--output={os.path.join(self.log_dir, '%x-%A_%a.out')}")
        for field, option in _OPTIONS.items():
            value = getattr(spec.block, field)
            if value is not None:
                argv.append(f"{option}={value}")
        out = run_tool(argv, "slurm launch", env=self.env, stdin=self.script(spec), timeout=timeout)
        job = out.strip().split(";", 1)[0]
        if not job.isdigit():
            raise ProviderError(
                "slurm launch",
                f"sbatch printed {out.strip()[:80]!r}, not a job id",
                "check the sbatch on this machine; `squeue` shows what it queued",
            )
        return [f"{job}_{i}" for i in range(n)]

    def list(self, tags: Collection[str]) -> list[Launched]:
        if not tags:
            return []
        out = run_tool(
            [
                "squeue",
                "--noheader",
                "--array",
                f"--user={self.user}",
                f"--name={','.join(sorted(tags))}",
                "--format=%i|%j|%T",
            ],
            "slurm list",
            env=self.env,
        )
        alive = []
        for line in out.splitlines():
            job, _, rest = line.strip().partition("|")
            name, _, state = rest.partition("|")
            if name not in tags or valid_id(job) is None:
                continue
            if state in _PENDING:
                alive.append(Launched(job, name, "pending"))
            elif state in _RUNNING:
                alive.append(Launched(job, name, "running"))
        return alive

    def cancel(self, ids: Sequence[str]) -> None:
        safe = [i for i in ids if valid_id(i) is not None]
        if safe:
            run_tool(["scancel", *safe], "slurm cancel", env=self.env)
