"""The README's main demo: `lakeshore demo` runs producer, workers and reader as processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    out = subprocess.run(
        [sys.executable, "-m", "lakeshore", "demo", url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    table = out.stdout.split("reads every result by id:")[1]
    rows = [line.split() for line in table.splitlines() if line.startswith("  01")]
    assert len(rows) == 11
    states = [r[2] for r in rows]
    assert states.count("succeeded") == 10 and states.count("killed") == 1
    flaky = next(r for r in rows if r[1] == "flaky_square")
    assert (flaky[3], flaky[-1]) == ("2", "144")  # failed once, retried, succeeded
    pis = [float(r[-1]) for r in rows if r[1] == "estimate_pi" and r[2] == "succeeded"]
    assert len(pis) == 8 and all(3.0 < p < 3.3 for p in pis)
    assert "worker exit codes [0, 0]" in out.stdout
    # both workers announced their work: the batch really was shared out
    assert "[worker-1] drained" in out.stdout and "[worker-2] drained" in out.stdout


def test_setup_venv_installs_once_until_what_it_was_made_from_changes(tmp_path: Path) -> None:
    """scripts/demo and scripts/test call setup_venv on every run: the editable install is
    redone only when pyproject.toml, the extras or the Python changed (a fake venv's python
    logs its calls)."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    fake = tmp_path / ".venv" / "bin" / "python"
    fake.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/../calls"\necho "Python 3.11.7"\n')
    fake.chmod(0o755)
    (tmp_path / "pyproject.toml").write_text("[project]\n")

    def installs(extras: str = ".[test]") -> list[str]:
        script = f"set -e; source {root / 'scripts' / 'venv.sh'}; setup_venv '{extras}'"
        subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True, timeout=30)
        calls = (tmp_path / ".venv" / "calls").read_text().splitlines()
        return [c for c in calls if c.startswith("-m pip")]

    first = installs()
    assert len(first) == 1 and first[0].endswith("-e .[test]"), "the first run installs"
    assert len(installs()) == 1, "a second run finds it installed"
    (tmp_path / "pyproject.toml").write_text("[project]\ndependencies = ['x']\n")
    assert len(installs()) == 2, "a changed pyproject.toml is installed again"
    assert len(installs(".")) == 3, "other extras are an install of their own"
    assert len(installs(".")) == 3
