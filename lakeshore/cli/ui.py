"""``lakeshore ui``: the web dashboard of one store (``docs/ui.md``)."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from typing import Any

from lakeshore.cli.common import default_url, finite, plane, store_url
from lakeshore.errors import InvalidArgument

__all__ = ["register"]


def _cmd_ui(args: argparse.Namespace) -> int:
    from lakeshore.ui import Board, UiServer
    from lakeshore.ui.server import is_loopback

    if args.interval <= 0:
        raise InvalidArgument("ui", "--interval must be > 0", "e.g. --interval 5")
    args.url = args.url or default_url()
    # `lakeshore --ns NS ui` hands over one name; `ui --ns` (repeatable) gives a list
    namespaces = ([args.ns] if isinstance(args.ns, str) else args.ns) or None
    args.ns = (namespaces or ["default"])[0]
    q = plane(args)  # a mistyped directory is refused, not shown as an empty store
    token = args.token or os.environ.get("LAKESHORE_UI_TOKEN") or None
    if args.no_token:
        if token or not is_loopback(args.host):
            raise InvalidArgument(
                "ui",
                "--no-token goes with neither --token nor a --host other than loopback",
                "drop --no-token: a dashboard others can reach needs a token",
            )
    elif token is None:
        # even on loopback: on a shared machine (a cluster's login node) every user can
        # reach 127.0.0.1, so the printed URL carries a token, as Jupyter's does
        token = secrets.token_urlsafe(24)
    board = Board(q.store, namespaces, interval_s=args.interval)
    server = UiServer(
        board, q.url, host=args.host, port=args.port, token=token, allow_actions=args.allow_actions
    )
    mode = "cancel and retry allowed" if args.allow_actions else "read-only"
    print(f"lakeshore ui: {server.url}  ({mode}; Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("lakeshore ui: stopped", file=sys.stderr)
    finally:
        server.close()
        q.store.close()
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "ui",
        help="a web dashboard of the store: queues, invocations, streams (read-only by default)",
        description="Serve a dashboard of one store on 127.0.0.1. One poller reads the store "
        "for every open tab; the overview never lists finished history. Read-only unless "
        "--allow-actions. Every request carries a token (made up and printed in the URL "
        "unless --token gives one); --no-token drops it on loopback.",
    )
    p.add_argument(
        "--url", type=store_url, help="store URL; default: $LAKESHORE_URL, else the default store"
    )
    p.add_argument(
        "--ns",
        action="append",
        metavar="NS",
        help="a namespace to show (repeatable; default: every namespace in the store)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8321, help="port (default 8321; 0: any free)")
    p.add_argument(
        "--token",
        help="the token every request must carry (default $LAKESHORE_UI_TOKEN, else a new "
        "one, printed in the URL)",
    )
    p.add_argument(
        "--no-token",
        action="store_true",
        help="no token, on loopback only: for a machine no one else logs in to",
    )
    p.add_argument(
        "--allow-actions",
        action="store_true",
        help="let the page cancel and retry invocations (a POST with a CSRF token each)",
    )
    p.add_argument(
        "--interval",
        type=finite,
        default=5.0,
        help="seconds between the poller's rounds of the overview (default 5)",
    )
    p.set_defaults(func=_cmd_ui)
