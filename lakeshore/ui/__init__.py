"""``lakeshore ui``: a web dashboard over one store (see ``docs/ui.md``).

Standard library only: :class:`Board` reads the store (one poller, cached views, a budget
of reads a minute) and :class:`UiServer` serves the page and its JSON API.
"""

from __future__ import annotations

from lakeshore.ui.board import Board
from lakeshore.ui.server import UiServer

__all__ = ["Board", "UiServer"]
