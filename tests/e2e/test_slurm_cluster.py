"""The session's SLURM cluster does what the SLURM tests rely on: an array job's tasks run at
once (more of them than the machine has cores), and a plain ``scancel`` delivers SIGTERM to a
batch job's process. If these fail, a failure of a test built on them says nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.slurm import SlurmCluster
from tests.waiting import poll

pytestmark = pytest.mark.slurm

TASKS = 6


def sbatch(cluster: SlurmCluster, script: Path, *options: str) -> str:
    """Submit ``script``; return the job id. Two minutes at most, should a test lose it."""
    out = cluster.run(
        [
            "sbatch",
            "--parsable",
            "--time=2",
            f"--chdir={script.parent}",
            f"--output={script.parent}/%x-%A_%a.out",
            *options,
            str(script),
        ]
    ).stdout
    return out.strip().split(";")[0]


def test_array_tasks_run_at_once(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "task.sh"
    # Each task says it started, then waits for the release, for 60 s at most by itself.
    script.write_text(
        "#!/bin/sh\n"
        f"touch {tmp_path}/started.$SLURM_ARRAY_TASK_ID\n"
        "i=0\n"
        f"while [ ! -e {tmp_path}/release ]; do\n"
        "  i=$((i + 1)); [ $i -gt 600 ] && exit 3\n"
        "  sleep 0.1\n"
        "done\n"
    )
    job = sbatch(slurm_cluster, script, f"--array=0-{TASKS - 1}", "--cpus-per-task=1")

    def started() -> list[Path]:
        return sorted(tmp_path.glob("started.*"))

    try:
        poll(lambda: len(started()) == TASKS, timeout=15, what=f"{TASKS} tasks running at once")
        assert [p.suffix for p in started()] == [f".{i}" for i in range(TASKS)]
        running = slurm_cluster.run(
            ["squeue", "--noheader", f"--jobs={job}", "--states=RUNNING", "--format=%i"]
        ).stdout.split()
        assert len(running) == TASKS, running  # and the controller agrees
        (tmp_path / "release").touch()
        poll(lambda: job not in slurm_cluster.jobs(), timeout=15, what="the array leaving squeue")
    finally:
        (tmp_path / "release").touch()
    outputs = sorted(tmp_path.glob("task.sh-*.out"))
    assert len(outputs) == TASKS


def test_plain_scancel_delivers_sigterm(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    ready, marker = tmp_path / "ready", tmp_path / "got-term"
    body = (
        "import pathlib, signal, sys, time\n"
        "def term(signum, frame):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('TERM')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "deadline = time.monotonic() + 60\n"
        "while time.monotonic() < deadline:\n"
        "    time.sleep(0.1)\n"
        "sys.exit(3)\n"
    )
    (tmp_path / "body.py").write_text(body)
    script = tmp_path / "job.sh"
    # exec: the batch step's process is python itself, as a worker started by a script would be
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'body.py'}\n")
    job = sbatch(slurm_cluster, script)
    poll(ready.exists, timeout=15, what="the job's handler installed")
    slurm_cluster.run(["scancel", job])
    poll(
        lambda: marker.exists() and marker.read_text() == "TERM",
        timeout=10,  # SIGKILL follows after KillWait (5 s): no marker then
        what="SIGTERM reaching the job's python",
    )
    poll(lambda: job not in slurm_cluster.jobs(), timeout=15, what="the job leaving squeue")
