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
