"""Start and stop a real SLURM cluster (munged, slurmctld, one slurmd) on loopback for the session.

Code that drives SLURM (array jobs, cancellation) is only believable against the real scheduler,
with its scheduling delays and its own way of delivering signals; a fake would answer what we
expect. The daemons come from the distribution (Debian's ``slurm-wlm`` and ``munge``;
``scripts/test`` installs them when it can).

Everything lives in one directory the caller gives: the configuration, the munge key and socket,
the controller's state, the node's spool and the logs. The session never touches ``/etc/slurm``,
``/etc/munge`` or a cluster the machine already runs: commands reach this cluster only through
``SLURM_CONF``, which :attr:`SlurmCluster.env` carries and which the session never exports
globally (a test passes it to the subprocesses it starts).

Every daemon runs in the foreground as a child of this process, so :meth:`SlurmCluster.stop`
ends exactly the processes it started, by handle and never by name, and each daemon receives
SIGTERM should this process die without stopping it (``PR_SET_PDEATHSIG``).

The node claims more CPUs than the machine has (``SlurmdParameters=config_overrides``): tests
need several one-CPU tasks running at once on a two-core CI runner, and the tasks mostly wait.
Root is required: slurmd starts each job as its submitter, which only root can do.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.seaweed import free_ports

__all__ = ["SlurmCluster", "find_slurm", "start_slurm"]

PARTITION = "debug"
# The daemons live in sbin, which a non-root PATH (and some CI images) leave out.
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
_CLIENTS = ("sbatch", "squeue", "scancel", "sinfo")
_DAEMONS = ("munged", "slurmctld", "slurmd")
_PR_SET_PDEATHSIG = 1


def _which(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    return shutil.which(name, path=path)


def find_slurm() -> str | None:
    """Why this machine cannot run the cluster, or None when it can.

    A reason rather than a path: the cluster needs seven binaries and root, and a skip should
    say which of them is missing.
    """
    missing = [name for name in (*_CLIENTS, *_DAEMONS) if _which(name) is None]
    if missing:
        return (
            f"{', '.join(missing)} not found "
            "(apt-get install slurm-wlm munge; scripts/test does it as root)"
        )
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs, and this session is not root"
    return None


@dataclass
class SlurmCluster:
    """A running cluster: one controller and one node, reached through :attr:`env`."""

    workdir: Path
    conf: Path
    node: str
    cpus: int
    partition: str = PARTITION
    version: str = ""
    # The variables a command needs to reach this cluster; merge them into a subprocess's env.
    env: dict[str, str] = field(default_factory=dict)
    _daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)

    def environ(self) -> dict[str, str]:
        """This process's environment pointed at the cluster: any ``SLURM_*`` inherited from
        an enclosing allocation is dropped, so a command cannot act on another cluster."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**base, **self.env}

    def run(
        self, argv: Sequence[str], *, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a SLURM command (``sbatch``, ``squeue``…) against this cluster; text output.

        Raises:
            subprocess.CalledProcessError: with ``check``, the command failed (its stderr is
                in the message).
        """
        exe = _which(argv[0]) or argv[0]
        proc = subprocess.run(
            [exe, *argv[1:]], env=self.environ(), capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            err = subprocess.CalledProcessError(
                proc.returncode, list(argv), proc.stdout, proc.stderr
            )
            err.add_note(proc.stderr.strip())
            raise err
        return proc

    def jobs(self) -> set[str]:
        """Ids of the jobs ``squeue`` lists (pending, running, completing): an array job's
        tasks count under the array's id, the one ``sbatch`` printed."""
        return set(self.run(["squeue", "--noheader", "--format=%F"]).stdout.split())

    def logs(self, chars: int = 2000) -> str:
        """The tail of each daemon's log, for an error message."""
        parts = []
        # The node first: it starts last and is the likeliest to have failed. A daemon's
        # stderr repeats its log, so it is shown only when the log is empty (a daemon that
        # died before opening it).
        for name in ("slurmd", "slurmctld", "munged"):
            for suffix in ("log", "out"):
                path = self.workdir / "log" / f"{name}.{suffix}"
                if path.exists() and path.stat().st_size:
                    parts.append(f"--- {path}\n{path.read_text(errors='replace')[-chars:]}")
                    break
        return "\n".join(parts) or "(no daemon wrote a log)"

    def stop(self, timeout: float = 20.0) -> None:
        """Cancel what still runs, then end the daemons this object started, and any job
        process or ``slurmstepd`` of this cluster left behind. Safe to call twice, and on a
        cluster whose start failed halfway."""
        ctld = self._daemons.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            self._cancel_all(timeout)
        # The node first (it reports to the controller), munge last (everything else uses it).
        for name in ("slurmd", "slurmctld"):
            _end(self._daemons.get(name))
        _end_strays(self.conf)
        _end(self._daemons.get("munged"))

    def _cancel_all(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            if not self.jobs():
                return
            self.run(["scancel", f"--partition={self.partition}"], check=False)
            deadline = time.monotonic() + timeout
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)  # the controller offers no way to wait for a job's end


def _end(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _end_strays(conf: Path) -> None:
    """Kill what this cluster's jobs left: ``slurmstepd`` outlives slurmd by design, and so
    does a job process that ignored SIGTERM. They are recognised by ``SLURM_CONF`` naming this
    cluster's (unique, per-session) configuration in their environment; nothing else is."""
    marker = f"SLURM_CONF={conf}".encode()
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if marker in environ:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _die_with_parent() -> None:
    """In the daemon, before exec: get SIGTERM when the session dies (even by SIGKILL)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _slurm_conf(d: Path, node: str, host: str, cpus: int, ctld_port: int, slurmd_port: int) -> str:
    lines = {
        "ClusterName": "lakeshore",
        "SlurmctldHost": f"{host}(127.0.0.1)",
        "SlurmctldPort": ctld_port,
        "SlurmdPort": slurmd_port,
        # Listen on the configured addresses (127.0.0.1), not on every interface.
        "CommunicationParameters": "NoCtldInAddrAny,NoInAddrAny",
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "AuthInfo": f"socket={d / 'munge' / 'munge.socket'}",
        "CredType": "cred/munge",
        "StateSaveLocation": d / "state",
        "SlurmdSpoolDir": d / "spool" / "%n",
        "SlurmctldPidFile": d / "run" / "slurmctld.pid",
        "SlurmdPidFile": d / "run" / "slurmd.pid",
        "SlurmctldLogFile": d / "log" / "slurmctld.log",
        "SlurmdLogFile": d / "log" / "slurmd.log",
        "SlurmctldDebug": "info",
        "SlurmdDebug": "info",
        "MailProg": "/bin/true",
        # No cgroups: they need a systemd-managed hierarchy, which containers rarely give.
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "MpiDefault": "none",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core",
        # Trust the CPUs below, not the hardware: more one-CPU tasks run at once than the
        # machine has cores (they mostly wait), and the node is not drained for the mismatch.
        "SlurmdParameters": "config_overrides",
        "SchedulerType": "sched/backfill",
        # A test submits and waits for its tasks: schedule at once, not after the default
        # 3 s batch delay or 60 s / 30 s main and backfill cycles.
        "SchedulerParameters": "batch_sched_delay=0,sched_interval=1,sched_min_interval=0,"
        "bf_interval=1",
        "KillWait": 5,  # SIGTERM to SIGKILL when a job is cancelled or runs out of time
        "MinJobAge": 2,  # forget finished jobs soon (the recommended minimum)
        "InactiveLimit": 0,
        "ReturnToService": 2,  # a node that registers is usable, whatever it was before
        "JobAcctGatherType": "jobacct_gather/none",  # no accounting: sacct does not work
    }
    text = "".join(f"{key}={value}\n" for key, value in lines.items())
    return text + (
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n"
        f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP\n"
    )


def start_slurm(tmpdir: Path, cpus: int = 8, timeout: float = 30.0) -> SlurmCluster:
    """Start munged, slurmctld and slurmd under ``tmpdir``; return once the node is idle.

    Raises:
        RuntimeError: a daemon exited, or the node was not idle within ``timeout`` seconds
            (the message carries the tail of each daemon's log). Nothing started is left
            running.
    """
    d = Path(tmpdir).resolve()
    host = socket.gethostname().split(".")[0]
    node = host  # slurmd finds its NodeName by the host's name; -N says it outright as well
    # slurmd makes a unix socket per job step, <spool>/<node>/<node>_<job>.<step>, and a
    # socket's path must fit in 108 bytes: fail here rather than at the first job
    step_socket = d / "spool" / node / f"{node}_4294967294.4294967294"
    if len(bytes(step_socket)) >= 108:
        raise RuntimeError(f"{d}: too long a path for the daemons' sockets; give a shorter one")
    for sub in ("munge", "state", "run", "log", f"spool/{node}"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    munge = d / "munge"
    munge.chmod(0o700)  # munged refuses a key or socket directory others can write to
    key = munge / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    ctld_port, slurmd_port = free_ports(2)
    conf = d / "slurm.conf"
    conf.write_text(_slurm_conf(d, node, host, cpus, ctld_port, slurmd_port))
    cluster = SlurmCluster(d, conf, node, cpus, env={"SLURM_CONF": str(conf)})
    try:
        _launch(
            cluster,
            "munged",
            [
                "--foreground",
                # the socket's directory is root-only (the key's, mode 700), which munged
                # refuses without --force; every client of this cluster is root
                "--force",
                f"--socket={munge / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={d / 'log' / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
        )
        _wait(cluster, lambda: (munge / "munge.socket").exists(), timeout, "munged's socket")
        _launch(cluster, "slurmctld", ["-D", "-c"])  # -c: no jobs from a reused directory
        _launch(cluster, "slurmd", ["-D", "-N", node])
        _wait(cluster, lambda: _node_state(cluster) == "idle", timeout, f"node {node} idle")
        cluster.version = cluster.run(["sinfo", "--version"]).stdout.split()[-1]
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _launch(cluster: SlurmCluster, name: str, args: list[str]) -> None:
    exe = _which(name)
    if exe is None:
        raise RuntimeError(f"{name} not found")
    with open(cluster.workdir / "log" / f"{name}.out", "wb") as out:  # the daemon keeps its own
        cluster._daemons[name] = subprocess.Popen(
            [exe, *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cluster.environ(),
            cwd=cluster.workdir,
            start_new_session=True,  # a ^C to the session reaches pytest, which stops us
            preexec_fn=_die_with_parent,
        )


def _node_state(cluster: SlurmCluster) -> str:
    proc = cluster.run(
        ["sinfo", "--noheader", "--nodes", cluster.node, "--format=%T"], check=False, timeout=10
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _wait(cluster: SlurmCluster, ready: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        dead = {n: p.returncode for n, p in cluster._daemons.items() if p.poll() is not None}
        if dead:
            problem = f"{', '.join(f'{n} exited with {rc}' for n, rc in dead.items())}"
            break
        if ready():
            return
        if time.monotonic() > deadline:
            problem = f"{what} not reached within {timeout:.0f} s"
            break
        time.sleep(0.1)  # polling daemons that are booting; no event to wait on
    raise RuntimeError(f"SLURM cluster did not come up: {problem}\n{cluster.logs()}")
