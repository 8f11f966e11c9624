"""Providers with real processes: the local provider scales a queue from zero to a fleet
and back to zero through a burst of work, the ``command`` provider's templates get their
values quoted and its tools' output is trusted no further than an id, and ``lakeshore
scale`` as a program."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.keys import QueueKeys
from lakeshore.model.provider import ProviderConfig
from lakeshore.protocol.scaler_lease import ScalerLeases
from lakeshore.providers import CommandProvider, LocalProvider, SlurmProvider, WorkerSpec
from lakeshore.providers.base import store_id, tag_of
from tests import jobs
from tests.waiting import alive, poll

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_the_local_provider_scales_from_zero_to_a_fleet_and_back(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    q.configure(
        "burst",
        provider={
            "kind": "local",
            "max_workers": 3,
            "jobs_per_worker": 5,
            "idle_exit_s": 1.5,
            "cooldown_s": 0,
        },
    )
    provider = LocalProvider(tmp_path / "state", env=_env())
    scaler = dls.Scaler(q, ["burst"], provider, allow=["tests.jobs:*"], interval_s=0.2)
    assert provider.list([scaler.tags[0]]) == []  # from zero
    f = q.udf(jobs.add_one, queue="burst")
    ids = [f.submit(i) for i in range(40)]
    stop = threading.Event()
    reports: list[Any] = []
    runner = threading.Thread(target=scaler.run, args=(stop, reports.append))
    runner.start()
    most = 0
    try:

        def drained() -> bool:
            nonlocal most
            alive = provider.list(scaler.tags)
            most = max(most, len(alive))
            assert len(alive) <= 3  # never above the queue's maximum
            done = all(q.status(i) == "succeeded" for i in ids)
            return done and not alive  # every worker left by its idle exit

        poll(drained, timeout=120, what="the burst done and the fleet back to zero")
    finally:
        stop.set()
        runner.join(30)
    assert not runner.is_alive()
    assert [q.result(i) for i in ids] == [i + 1 for i in range(40)]
    assert 1 <= most <= 3
    launched = [w for r in reports for w in r.launched]
    assert len(launched) >= 1
    assert not any(r.error for r in reports), [r.error for r in reports if r.error]
    # each worker left its log, and its pid file was cleared once it had gone
    logs = {p.stem for p in (tmp_path / "state").glob(f"{store_id(url)}/default/burst/*.log")}
    assert logs >= set(launched)
    assert not list((tmp_path / "state").glob("*/*/*/local-*.pid"))


def test_a_recycled_pid_is_not_taken_for_a_worker(tmp_path: Path) -> None:
    folder = tmp_path / store_id("file:///x") / "default" / "q"
    folder.mkdir(parents=True)
    (folder / "local-0000abcd.pid").write_text(str(os.getpid()))  # alive, not that worker
    (folder / "local-0000abce.pid").write_text("not a pid")
    tag = tag_of("file:///x", "default", "q")
    provider = LocalProvider(tmp_path)
    assert provider.list([tag]) == []
    assert len(list(folder.iterdir())) == 2  # young files stay: their worker may be starting
    for path in folder.iterdir():
        os.utime(path, (time.time() - 60, time.time() - 60))
    assert provider.list([tag]) == []
    assert list(folder.iterdir()) == []  # both files cleared


def _spec(argv: tuple[str, ...]) -> WorkerSpec:
    return WorkerSpec("file:///x", "default", "q", argv, ProviderConfig("command"))


def test_the_command_provider_quotes_what_it_fills_in(tmp_path: Path) -> None:
    env = {**os.environ, "D": str(tmp_path)}
    provider = CommandProvider(
        launch="""printf '%s\\n' {worker} > "$D/{name}.argv"; echo {name}""",
        list="""cd "$D" && for f in *.argv; do echo "${{f%.argv}} running"; done; """
        """echo 'x;rm-me running'; echo '' """,
        cancel="""rm "$D/{id}.argv" """,
        env=env,
    )
    argv = (sys.executable, "a b", "it's", "$HOME", "`touch pwned`", "x;y")
    ids = provider.launch(_spec(argv), 2)
    assert len(ids) == 2 and all(i.startswith("lakeshore-") for i in ids)
    for worker in ids:  # every word arrived as itself, nothing ran
        lines = (tmp_path / f"{worker}.argv").read_text().splitlines()
        assert lines == [*argv, "--worker-id", worker]
    assert not (tmp_path / "pwned").exists()
    tag = tag_of("file:///x", "default", "q")
    listed = provider.list([tag])
    assert sorted(w.id for w in listed) == sorted(ids)  # 'x;rm-me' is no id: passed over
    provider.cancel([ids[0], "../../etc/passwd; rm -rf ~"])
    assert [w.id for w in provider.list([tag])] == [ids[1]]


def test_the_command_provider_says_what_failed(tmp_path: Path) -> None:
    provider = CommandProvider("echo no >&2; exit 3", "true", "true {id}")
    with pytest.raises(dls.ProviderError, match="exited with 3: no") as caught:
        provider.launch(_spec(("w",)), 1)
    assert caught.value.returncode == 3
    with pytest.raises(dls.InvalidArgument, match="unknown field"):
        CommandProvider("run {command}", "true", "true")
    with pytest.raises(dls.InvalidArgument, match="empty"):
        CommandProvider("run {worker}", " ", "true")


def test_the_slurm_script_execs_the_worker_after_the_setup() -> None:
    argv = ("/venv/bin/python", "-m", "lakeshore", "worker")
    spec = WorkerSpec("file:///x", "default", "hpc", argv, ProviderConfig("slurm"))
    script = SlurmProvider(setup="module load python/3.11").script(spec)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash" and lines[2] == "module load python/3.11"
    assert lines[3].startswith("exec /venv/bin/python -m lakeshore worker --worker-id ")
    assert "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" in lines[3]


def test_a_missing_tool_is_a_provider_error(tmp_path: Path) -> None:
    provider = SlurmProvider(env={"PATH": str(tmp_path)})
    with pytest.raises(dls.ProviderError, match="not installed"):
        provider.list([tag_of("file:///x", "default", "q")])


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lakeshore", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_lakeshore_scale_as_a_program(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    env = {**_env(), "LAKESHORE_URL": url}
    q = dls.Dispatch(url)
    f = q.udf(jobs.add_one, queue="burst")
    inv = f.submit(1)
    out = _cli("scale", "burst", "--once", env=env)
    assert out.returncode == 2 and "has no provider" in out.stderr
    assert "lakeshore queue set burst provider=local" in out.stderr
    out = _cli("queue", "set", "burst", "provider=local", "provider.idle_exit_s=1", env=env)
    assert out.returncode == 0, out.stderr
    out = _cli("queue", "show", "burst", env=env)
    assert "local, up to 4 workers, 10 jobs each, idle exit 1 s" in out.stdout
    out = _cli("scale", "burst", "--once", "--setup", "x", env=env)
    assert out.returncode == 2 and "--setup: only for a slurm provider" in out.stderr
    state = str(tmp_path / "state")
    args = ("scale", "burst", "--once", "--allow", "tests.jobs:*", "--state-dir", state)
    out = _cli(*args, "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert '"launched": ["local-' in out.stdout
    assert q.result(inv, timeout=60) == 2
    out = _cli("status", env=env)
    assert "burst: local, up to 4 workers" in out.stdout
    out = _cli("scale", "nowhere", "--once", env=env)
    assert out.returncode == 2 and "no queue 'nowhere'" in out.stderr


def test_lakeshore_scale_stops_on_sigterm_and_gives_the_lease_back(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/plane"
    q = dls.Dispatch(url)
    q.configure("burst", provider="local")
    q.udf(jobs.add_one, queue="burst")  # no work: the scaler only holds its lease
    argv = [sys.executable, "-m", "lakeshore", "scale", "burst", "--interval", "0.2", "--json"]
    argv += ["--state-dir", str(tmp_path / "state")]
    scale = subprocess.Popen(
        argv, env={**_env(), "LAKESHORE_URL": url}, stdout=subprocess.PIPE, text=True
    )
    try:
        assert scale.stdout is not None
        first = json.loads(scale.stdout.readline())
        assert first["acting"] and first["why"] == "nothing to do"
        leases = ScalerLeases(q.store, QueueKeys("default", "burst"), "me", 30)
        held = leases.read()[0]
        assert held is not None and held.expires_at > q.store.now()
        scale.send_signal(signal.SIGTERM)
        assert scale.wait(30) == 0
    finally:
        if scale.poll() is None:
            scale.kill()
            scale.wait()
        if scale.stdout:
            scale.stdout.close()
    after = leases.read()[0]
    assert after is not None and after.expires_at == 0  # given back: the next one acts now
    assert leases.take(None)[0] is not None


def test_a_timed_out_tool_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    env = {**os.environ, "D": str(tmp_path)}
    template = """sh -c 'echo $$ > "$D/pid"; exec sleep 60' & wait"""
    provider = CommandProvider(template, "true", "true {id}", env=env)
    with pytest.raises(dls.ProviderError, match="did not finish"):
        provider.launch(_spec(("w",)), 1, timeout=1.0)
    pid = int(poll(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text()))
    poll(lambda: not alive(pid), timeout=10, what="the template's background child gone")


def test_undecodable_tool_output_is_no_crash(tmp_path: Path) -> None:
    provider = CommandProvider("true", r"printf '\377 running\n'", "true {id}")
    assert provider.list([tag_of("file:///x", "default", "q")]) == []


def _fake_slurm(tmp_path: Path, squeue: str) -> dict[str, str]:
    """``sbatch`` and ``squeue`` stand-ins on PATH: sbatch records its options and prints a
    new job id; squeue prints ``squeue``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/sbatch.log\ncat > /dev/null\n'
        f"n=$(wc -l < {tmp_path}/sbatch.log)\necho $((100 + n))\n"
    )
    (bin_dir / "squeue").write_text(f"#!/bin/sh\ncat <<'EOF'\n{squeue}EOF\n")
    for tool in ("sbatch", "squeue"):
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_a_big_launch_is_split_into_arrays_slurm_accepts(tmp_path: Path) -> None:
    provider = SlurmProvider(env=_fake_slurm(tmp_path, ""))
    spec = WorkerSpec("file:///x", "default", "hpc", ("w",), ProviderConfig("slurm"))
    ids = provider.launch(spec, 2500)
    arrays = [
        next(a for a in line.split() if a.startswith("--array="))
        for line in (tmp_path / "sbatch.log").read_text().splitlines()
    ]
    assert arrays == ["--array=0-999", "--array=0-999", "--array=0-499"]
    assert len(ids) == 2500 and ids[0] == "101_0" and ids[-1] == "103_499"


def test_squeue_states_count_as_waiting_unless_running_or_ended(tmp_path: Path) -> None:
    tag = tag_of("file:///x", "default", "hpc")
    rows = [
        ("7_0", "RUNNING"),
        ("7_1", "PENDING"),
        ("7_2", "SPECIAL_EXIT"),  # held: a worker on its way, never launched again
        ("7_3", "SOME_NEW_STATE"),
        ("7_4", "COMPLETED"),
        ("7_5", "CANCELLED"),
        ("7_[6-9]", "PENDING"),  # not an id
    ]
    text = "".join(f"{job}|{tag}|{state}\n" for job, state in rows)
    text += "8_0|lakeshore:default:other:0000|RUNNING\n"
    provider = SlurmProvider(env=_fake_slurm(tmp_path, text))
    states = {w.id: w.state for w in provider.list([tag])}
    assert states == {"7_0": "running", "7_1": "pending", "7_2": "pending", "7_3": "pending"}


def test_a_template_that_cannot_be_filled_in_is_refused_at_once() -> None:
    with pytest.raises(dls.InvalidArgument, match="cannot be filled in"):
        CommandProvider("run {name:d}", "true", "true {id}")
    with pytest.raises(dls.InvalidArgument, match="cannot be filled in"):
        CommandProvider("run {name!z}", "true", "true {id}")


def test_a_tool_that_escapes_its_session_does_not_hold_the_scaler(tmp_path: Path) -> None:
    env = {**os.environ, "D": str(tmp_path)}
    # the escaped child keeps the tool's stdout open for ten minutes (pytest's limit is 5)
    template = """setsid sh -c 'echo $$ > "$D/pid"; exec sleep 600' & wait"""
    provider = CommandProvider(template, "true", "true {id}", env=env)
    try:
        with pytest.raises(dls.ProviderError, match="may still have launched"):
            provider.launch(_spec(("w",)), 1, timeout=1.0)
    finally:
        pid = int(poll(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text()))
        os.kill(pid, signal.SIGKILL)


def test_sbatch_and_squeue_get_the_options_that_keep_the_count_right(tmp_path: Path) -> None:
    env = _fake_slurm(tmp_path, "")
    env["SQUEUE_PARTITION"] = "elsewhere"  # the scaler's profile must not filter the list
    (tmp_path / "bin" / "squeue").write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/squeue.args\nenv > {tmp_path}/squeue.env\n'
    )
    provider = SlurmProvider(env=env)
    provider.launch(WorkerSpec("file:///x", "default", "q", ("w",), ProviderConfig("slurm")), 1)
    assert "--no-requeue" in (tmp_path / "sbatch.log").read_text().split()
    provider.list([tag_of("file:///x", "default", "q")])
    args = (tmp_path / "squeue.args").read_text().split()
    assert {"--all", "--states=all", "--array"} <= set(args)
    assert "SQUEUE_PARTITION" not in (tmp_path / "squeue.env").read_text()
