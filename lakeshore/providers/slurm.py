"""``slurm``: workers as SLURM array jobs, seen with ``squeue`` and stopped with ``scancel``.

One launch is one ``sbatch --array=0-(n-1)``: each task ``exec``s ``lakeshore worker
--idle-exit …`` (after the scaler's set-up line, if any), so the worker itself receives the
SIGTERM SLURM sends on ``scancel``, preemption or the time limit, and hands its running
attempt back within its grace. The job name is the queue's tag, which is how ``squeue``
finds a queue's workers again, waiting ones included, from any scaler.

No accounting database is needed: only live jobs matter, and ``squeue`` lists those.
"""

from __future__ import annotations

import builtins
import os
import shlex
import time
from collections.abc import Collection, Mapping, Sequence

from lakeshore.errors import ProviderError
from lakeshore.providers.base import Launched, Provider, WorkerSpec, run_tool, valid_id

__all__ = ["SlurmProvider"]

# squeue's long state names: running (being signalled or cleaned up counts: the task still
# holds its allocation), ended, and everything else — pending, held, requeued, suspended, or
# a state this version does not know — counts as waiting, so it is never launched again
_RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"}
_ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL"}
_ENDED |= {"OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED"}
MAX_ARRAY = 1000  # tasks per sbatch: SLURM's default MaxArraySize is 1001
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
    ) -> None:
        self.setup = setup
        self.log_dir = os.fspath(log_dir) if log_dir else None
        self.env = env

    def script(self, spec: WorkerSpec) -> str:
        """The batch script of one array task."""
        # bash: what set-up lines are written for (`source`, Lmod's `module` function)
        lines = ["#!/bin/bash", f"# lakeshore worker for queue {spec.ns}/{spec.queue}"]
        if self.setup:
            lines.append(self.setup)
        worker_id = '"slurm-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
        lines.append(f"exec {shlex.join(spec.argv)} --worker-id {worker_id}")
        return "\n".join(lines) + "\n"

    def launch(self, spec: WorkerSpec, n: int, timeout: float = 60.0) -> list[str]:
        """One array job per ``MAX_ARRAY`` workers.

        Raises:
            ProviderError: an ``sbatch`` failed; ``launched`` (when not empty) holds the ids
                of the arrays queued before it.
        """
        deadline = time.monotonic() + timeout
        ids: builtins.list[str] = []
        while len(ids) < n:
            size = min(MAX_ARRAY, n - len(ids))
            try:
                ids += self._array(spec, size, deadline - time.monotonic())
            except ProviderError as e:
                if ids:  # said, with what is queued: the scaler reports both
                    e.details["launched"] = ids
                raise
        return ids

    def _array(self, spec: WorkerSpec, n: int, timeout: float) -> builtins.list[str]:
        if timeout <= 0:
            raise ProviderError(
                "slurm launch", "no time left in this round", "the rest follows next round"
            )
        # --no-requeue: a preempted or failed worker is the scaler's to replace, or the
        # requeued task would come back beside its replacement
        argv = ["sbatch", "--parsable", "--no-requeue", f"--job-name={spec.tag}"]
        argv.append(f"--array=0-{n - 1}")
        if self.log_dir:
            try:  # a task whose output file cannot be opened dies before the worker starts
                os.makedirs(self.log_dir, exist_ok=True)
            except OSError as e:
                raise ProviderError(
                    "slurm launch",
                    f"cannot make the log folder {self.log_dir}: {e}",
                    "fix --log-dir",
                ) from None
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
        # --all: also jobs in hidden partitions; every user's, as a scaler of another account
        # may have taken over; no SQUEUE_* variable of the scaler's filters the list
        env = {k: v for k, v in (self.env or os.environ).items() if not k.startswith("SQUEUE_")}
        out = run_tool(
            [
                "squeue",
                "--noheader",
                "--all",
                "--states=all",
                "--array",
                f"--name={','.join(sorted(tags))}",
                "--format=%i|%j|%T",
            ],
            "slurm list",
            env=env,
        )
        alive = []
        for line in out.splitlines():
            job, _, rest = line.strip().partition("|")
            name, _, state = rest.partition("|")
            if name not in tags or valid_id(job) is None:
                continue
            if state in _RUNNING:
                alive.append(Launched(job, name, "running"))
            elif state not in _ENDED:
                alive.append(Launched(job, name, "pending"))
        return alive

    def cancel(self, ids: Sequence[str]) -> None:
        safe = [i for i in ids if valid_id(i) is not None]
        if safe:
            run_tool(["scancel", *safe], "slurm cancel", env=self.env)
