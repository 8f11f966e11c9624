"""The benchmarks are not run by the suite, but they import its helpers (tests/tiers.py,
tests/seaweed.py): every one of them must still import, or a helper's move breaks
`bash scripts/bench` without a failing test."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__"))
def test_every_benchmark_module_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")
