"""Every example in examples/ runs, at least in a smoke form."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_data_pipeline_example(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/data_pipeline.py"), "--url", f"file://{tmp_path}"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    assert "pipeline done" in out.stdout
    assert out.stdout.count("published report/") == 5  # four station pages and the index
    data = tmp_path / "data/pipeline-example/survey/2026-11-30"
    assert sorted(p.name for p in (data / "report").iterdir()) == [
        "airfield.md",
        "harbour.md",
        "index.md",
        "marsh.md",
        "ridge.md",
    ]
    assert len(list((data / "clean").iterdir())) == 4
