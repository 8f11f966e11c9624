"""Typed submits (docs/queue.md#typed-submits): tests/typing/check_submit.py holds right calls
and wrong ones marked with each checker's ignore; mypy and pyright check it with unused
ignores as errors, so a wrong call that a checker stops refusing fails here, as does a
right call it starts refusing. Both run as processes of their own (a few seconds each)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ROOT / "tests" / "typing" / "check_submit.py"


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.xdist_group("typing")
def test_mypy_checks_submits_against_the_body() -> None:
    done = _run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--warn-unused-ignores",
            "--no-incremental",
            "--config-file",
            "/dev/null",
            str(CHECKED),
        ]
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.xdist_group("typing")
def test_pyright_checks_submits_against_the_body(tmp_path: Path) -> None:
    exe = shutil.which("basedpyright", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("basedpyright is not installed (the test extra installs it)")
    config = tmp_path / "pyrightconfig.json"
    # only `# pyright: ignore[...]` comments count, each one must be needed; the rest of
    # basedpyright's own stricter rules are off (this checks lakeshore's types, not style)
    config.write_text(
        '{"typeCheckingMode": "standard", "enableTypeIgnoreComments": false,'
        ' "reportUnnecessaryTypeIgnoreComment": "error", "pythonVersion": "3.11",'
        f' "extraPaths": ["{ROOT}"]}}'
    )
    done = _run([exe, "--project", str(config), "--pythonpath", sys.executable, str(CHECKED)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 errors" in done.stdout, done.stdout


def test_the_options_view_takes_every_submit_option() -> None:
    """A submit option added later must be added to ``f.options(...)`` (and to a view's
    own ``options``) too, or typed code could not pass it."""
    import inspect

    from lakeshore.submit import OPTIONS
    from lakeshore.udf import Udf
    from lakeshore.udf_options import WithOptions

    for method in (Udf.options, WithOptions.options):
        taken = set(inspect.signature(method).parameters) - {"self"}
        assert taken == OPTIONS | {"result_timeout"}, method
