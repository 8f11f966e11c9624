"""A provider whose fleet lives in the test (:class:`Fleet`), and the scaler tests build on it."""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from typing import Any

import lakeshore as dls
from lakeshore.errors import ProviderError
from lakeshore.providers import Launched, Provider, WorkerSpec

UNUSED_URL = "file:///not-used-by-a-test-provider"


class Fleet(Provider):
    """A provider whose 'tool' is a dict: launches are recorded and listed as ``state``."""

    kind = "local"

    def __init__(self, state: str = "running") -> None:
        self.state = state
        self.workers: dict[str, Launched] = {}
        self.specs: list[WorkerSpec] = []
        self.cancelled: list[str] = []
        self.fail_list = False
        self._lock = threading.Lock()

    def launch(self, spec: WorkerSpec, n: int, timeout: float = 60.0) -> list[str]:
        with self._lock:
            ids = [f"w{len(self.workers) + i}" for i in range(n)]
            for i in ids:
                self.workers[i] = Launched(i, spec.tag, self.state)
            self.specs.append(spec)
            return ids

    def list(self, tags: Collection[str]) -> list[Launched]:
        if self.fail_list:
            raise ProviderError("fleet list", "the tool is down", "try later")
        with self._lock:
            return [w for w in self.workers.values() if w.tag in tags]

    def cancel(self, ids: Sequence[str]) -> None:
        with self._lock:
            for i in ids:
                self.workers.pop(i, None)
            self.cancelled += ids

    def finish_all(self) -> None:
        with self._lock:
            self.workers.clear()


def scaler_for(q: Any, fleet: Provider, **kw: Any) -> dls.Scaler:
    """A scaler of the queue ``hpc`` on ``q`` with ``fleet`` as its provider."""
    kw.setdefault("url", UNUSED_URL)
    kw.setdefault("interval_s", 1.0)
    return dls.Scaler(q, ["hpc"], fleet, **kw)
