"""What the dashboard shows, and the cost of looking: one reader of the store for every tab.

:class:`Board` joins the two halves: the overview, refreshed by one poller thread
(``lakeshore.ui.overview``), and the pages read on demand within a budget of store
requests a minute (``lakeshore.ui.pages``). The server calls nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lakeshore.errors import InvalidArgument
from lakeshore.keys import check_name
from lakeshore.store.base import Store
from lakeshore.ui.following import MAX_SEGMENT_READ
from lakeshore.ui.overview import Overview
from lakeshore.ui.pages import BUSY, Pages

__all__ = ["BUSY", "Board"]


class Board:
    """The dashboard's reader of one store.

    Args:
        store: the store (the board only reads it).
        namespaces: the namespaces to show; None: every one found in the store.
        interval_s: seconds between two rounds of the overview, and the age at which a
            queue's page is read again.
        live_s: the age at which a live invocation's page is read again.
        discover_s: seconds between two readings of the names and queue records.
        max_requests_per_min: store requests the pages may make a minute (the overview's
            cost is bounded by its own rules, see ``docs/ui.md``).
        max_segment_bytes: the largest journal or log segment a page fetches (a larger
            one is named on the page, not read).

    Raises:
        InvalidArgument: a bad namespace name, interval, budget or segment size.
    """

    def __init__(
        self,
        store: Store,
        namespaces: list[str] | None = None,
        *,
        interval_s: float = 5.0,
        live_s: float = 1.0,
        discover_s: float = 60.0,
        max_requests_per_min: int = 3000,
        max_segment_bytes: int = MAX_SEGMENT_READ,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (
            interval_s > 0
            and live_s > 0
            and discover_s > 0
            and max_requests_per_min > 0
            and max_segment_bytes > 0
        ):
            raise InvalidArgument(
                "ui",
                "the intervals, the budget and the segment size must be positive",
                "e.g. --interval 5",
            )
        fixed = [check_name(n, "namespace") for n in namespaces] if namespaces else None
        self.store = store
        self.interval_s, self.live_s = interval_s, live_s
        self.overview_poller = Overview(store, fixed, interval_s, discover_s, monotonic)
        self.pages = Pages(
            store,
            fixed,
            interval_s=interval_s,
            live_s=live_s,
            max_requests_per_min=max_requests_per_min,
            max_segment_bytes=max_segment_bytes,
            monotonic=monotonic,
        )

    def start(self) -> None:
        """Start the overview's poller (a round at once, then every ``interval_s``)."""
        self.overview_poller.start()

    def close(self) -> None:
        self.overview_poller.close()

    def poll(self) -> None:
        """One round of the overview, now (the poller's; tests call it directly)."""
        self.overview_poller.poll()

    def watched(self) -> bool:
        return self.overview_poller.watched()

    def overview(self) -> dict[str, Any]:
        """The last round's overview (reads nothing)."""
        return self.overview_poller.copy()

    def queue_page(self, ns: str, queue: str, **filters: Any) -> dict[str, Any]:
        """See :meth:`lakeshore.ui.pages.Pages.queue`."""
        return self.pages.queue(ns, queue, **filters)

    def invocation(self, ns: str, inv: str) -> dict[str, Any]:
        """See :meth:`lakeshore.ui.pages.Pages.invocation`."""
        return self.pages.invocation(ns, inv)

    def frames(self, ns: str, inv: str, after: int) -> dict[str, Any]:
        """See :meth:`lakeshore.ui.pages.Pages.frames`."""
        return self.pages.frames(ns, inv, after)

    def download(self, ns: str, inv: str, what: str) -> tuple[bytes, str] | None:
        """See :meth:`lakeshore.ui.pages.Pages.download`."""
        return self.pages.download(ns, inv, what)

    def download_size(self, ns: str, inv: str, what: str) -> tuple[int, str] | None:
        """See :meth:`lakeshore.ui.pages.Pages.download_size`."""
        return self.pages.download_size(ns, inv, what)

    def forget(self, ns: str, inv: str) -> None:
        """An action changed ``inv``: its page and what the overview knew of it go."""
        self.pages.forget(ns, inv)
        self.overview_poller.forget(ns, inv)
