"""Running lakeshore's command line from tests: in this process (``run``, output captured by
pytest) or as a child process (``lakeshore_cmd``, ``worker_cmd``, ``env_for``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from lakeshore.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``lakeshore *argv`` in this process: its exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def lakeshore_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "lakeshore", *args]


def worker_cmd(*args: str) -> list[str]:
    """``lakeshore worker``, allowed to run the plain functions of tests/jobs.py (a worker
    runs only declared bodies: these are not decorated)."""
    return lakeshore_cmd("worker", "--allow", "tests.jobs:*", *args)


def env_for(url: str, **extra: str) -> dict[str, str]:
    """The environment of a child process on the store at ``url``, able to import ``tests``."""
    return {
        **os.environ,
        "LAKESHORE_URL": url,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        **extra,
    }
