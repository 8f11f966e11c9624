"""Submit one long invocation and print its id, and nothing else.

A shell keeps the id in a variable:

    inv=$(python examples/progress/submit.py --steps 50 --pause 0.2)

Any later process follows its progress by that id alone (``watch.py``).
"""

from __future__ import annotations

import argparse

import long_task

import lakeshore as dls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="steps the body takes (default 50)")
    parser.add_argument("--pause", type=float, default=0.2, help="seconds per step (default 0.2)")
    parser.add_argument("--url", help="store URL (default: $LAKESHORE_URL, else ~/.lakeshore)")
    args = parser.parse_args(argv)
    q = dls.Dispatch(args.url, ns=long_task.NS)
    print(q.udf(long_task.crunch).submit(args.steps, args.pause), flush=True)


if __name__ == "__main__":
    main()
