"""Scripts written for the upstream SDK run unchanged over lakeshore (issue 19).

Each script of ``tests/upstream_scripts/`` runs twice: against ``dreamlake-lakeshore``
0.5.0 in its own virtualenv (``bench/upstream_env.sh``; upstream's in-process plane), and
against this repository's ``dreamlake.lakeshore`` with memory, a local directory and
SeaweedFS as the plane. What they print must be the same. The scripts print what a user
relies on (values, ids compared with each other, error classes), never ids or timings.
Without the upstream package (no network to install it) the comparison is skipped, saying
why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ulid import ULID

from tests.seaweed import Seaweed
from tests.tiers import FAKE_CREDS, TEST_BUCKET

# one process of the suite runs them all: upstream's venv and its outputs are made once
pytestmark = pytest.mark.xdist_group("upstream")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "tests" / "upstream_scripts").glob("*.py"))
_TIMEOUT_S = 300.0


def _clean_env(home: Path) -> dict[str, str]:
    """The environment a script runs in: none of this session's lakeshore or AWS settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LAKESHORE_", "AWS_", "DREAMLAKE_")) and k != "PYTHONPATH"
    }
    env["HOME"] = str(home)
    env["LAKESHORE_HOME"] = str(home / "lakeshore-home")
    return env


def _run(python: str, script: str, plane: str, cwd: Path, env: dict[str, str]) -> str:
    run = subprocess.run(
        [
            python,
            *(["-I"] if "PYTHONPATH" not in env else []),
            str(ROOT / "tests" / "upstream_scripts" / script),
        ],
        cwd=cwd,
        env={**env, "PLANE": plane},
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
    )
    assert run.returncode == 0, f"{script} on {plane} failed:\n{run.stdout}\n{run.stderr[-3000:]}"
    return run.stdout


@pytest.fixture(scope="session")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What each script prints against upstream 0.5.0."""
    made = subprocess.run(
        ["bash", str(ROOT / "bench" / "upstream_env.sh")],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
    )
    if made.returncode != 0:
        last = (made.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"upstream dreamlake-lakeshore 0.5.0 cannot be installed here: {last}")
    python = made.stdout.strip()
    out = {}
    for script in SCRIPTS:
        home = tmp_path_factory.mktemp("upstream")
        out[script] = _run(python, script, ":memory:", home, _clean_env(home))
    return out


@pytest.fixture(params=["memory", "local", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)])
def plane(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A plane URL for the scripts, and the environment that reaches it."""
    env = _clean_env(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    if request.param == "memory":
        return ":memory:", env
    if request.param == "local":
        return (tmp_path / "plane").as_uri(), env
    server: Seaweed = request.getfixturevalue("seaweed")
    env["AWS_ACCESS_KEY_ID"] = FAKE_CREDS["aws_access_key_id"]
    env["AWS_SECRET_ACCESS_KEY"] = FAKE_CREDS["aws_secret_access_key"]
    url = f"s3://{TEST_BUCKET}/t/{ULID()}?endpoint_url={server.endpoint}&region=us-east-1"
    return url, env


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_upstream_script_prints_the_same_over_lakeshore(
    script: str, upstream: dict[str, str], plane: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, env = plane
    ours = _run(sys.executable, script, url, tmp_path, env)
    assert ours == upstream[script]


def test_the_scripts_cover_the_upstream_names() -> None:
    """Every upstream name that works here is used by some script (the refused ones are
    covered by tests/unit/test_dreamlake.py)."""
    import dreamlake.lakeshore as dls

    text = "".join((ROOT / "tests" / "upstream_scripts" / s).read_text() for s in SCRIPTS)
    working = {
        "Dispatch", "DispatchError", "Job", "Queue", "RunConfig", "SyncQueue", "Topic",
        "lifecycle", "run", "run_worker", "scope", "thunk", "udf",
    }  # fmt: skip
    assert working <= set(dls.__all__)
    missing = sorted(n for n in working if n not in text)
    assert not missing
    for verb in ("submit", "claim", "ack", "nack", "working", "call", "count", "post", "topic",
                 "remote", "local", "listen", "stream", "cancel", "result"):  # fmt: skip
        assert f".{verb}(" in text, verb
