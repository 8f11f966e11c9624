"""A small data pipeline: files stay in storage, only keys ride the queue.

A survey of weather stations lands as raw CSV files. For each station a worker cleans the
readings and computes statistics; a second stage renders one report page per station,
yielding each page as soon as it exists, so a reader can follow the report being built.

    python examples/data_pipeline.py                      # temp file:// plane, 2 worker processes
    python examples/data_pipeline.py --url s3://bucket/x  # any plane URL (needs the s3 extra)

Everything runs under the scope ``survey/<date>``: the producer writes ``raw/<station>.csv``,
the workers write ``clean/…``, ``stats/…`` and ``report/…`` beside it, and every stage names
its inputs and outputs by key only.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import lakeshore as dls

NS = "pipeline-example"
STATIONS = ["harbour", "ridge", "marsh", "airfield"]


def clean_station(station: str) -> dict[str, str]:
    """Drop broken readings of one station; write the clean series and its statistics."""
    with open(dls.run.read(f"raw/{station}.csv"), newline="") as f:
        rows = [r for r in csv.DictReader(f) if _valid(r["celsius"])]
    paths = dls.run.write({"clean": f"clean/{station}.csv", "stats": f"stats/{station}.json"})
    with open(paths["clean"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["hour", "celsius"])
        w.writeheader()
        w.writerows(rows)
    temps = [float(r["celsius"]) for r in rows]
    stats = {
        "station": station,
        "readings": len(temps),
        "mean": round(sum(temps) / len(temps), 2),
        "min": min(temps),
        "max": max(temps),
    }
    Path(paths["stats"]).write_text(json.dumps(stats))
    return {"clean": f"clean/{station}.csv", "stats": f"stats/{station}.json"}


def render_report(stats_keys: list[str]) -> Iterator[str]:
    """One Markdown page per station, each published as it is yielded; then an index."""
    pages = []
    for key in stats_keys:
        s = json.loads(Path(dls.run.read(key)).read_text())
        page = f"report/{s['station']}.md"
        Path(dls.run.write(page)).write_text(
            f"# {s['station']}\n\n{s['readings']} readings, mean {s['mean']} °C "
            f"(min {s['min']}, max {s['max']})\n"
        )
        pages.append(page)
        yield page
    index = "report/index.md"
    Path(dls.run.write(index)).write_text("".join(f"- [{p}]({p})\n" for p in pages))
    yield index


def _valid(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _raw_csv(station: str, seed: int) -> str:
    rng = random.Random(seed)
    lines = ["hour,celsius"]
    for hour in range(24):
        temp = 8 + 6 * math.sin((hour - 9) / 24 * 2 * math.pi) + rng.gauss(0, 0.8)
        lines.append(f"{hour},{'ERR' if rng.random() < 0.1 else f'{temp:.1f}'}")
    return "\n".join(lines) + "\n"


def produce(url: str, workers: int) -> None:
    q = dls.Dispatch(url, ns=NS)
    clean, report = q.udf(clean_station), q.udf(render_report)
    procs = [
        subprocess.Popen([sys.executable, __file__, "worker", "--url", url]) for _ in range(workers)
    ]
    try:
        with q.scope("survey/2026-11-30"):
            for i, station in enumerate(STATIONS):
                Path(dls.run.write(f"raw/{station}.csv")).write_text(_raw_csv(station, i))
            # the raw files upload here, before the first invocation exists
            ids = [clean.submit(s) for s in STATIONS]
            print(f"submitted {len(ids)} cleaning invocations")
            outputs = [q.result(i, timeout=120) for i in ids]
            for out in outputs:
                s = json.loads(Path(dls.run.read(out["stats"])).read_text())
                print(f"  {s['station']:<9} {s['readings']:>2} readings, mean {s['mean']:>5} °C")
            inv = report.submit([o["stats"] for o in outputs])
            for frame in q.stream(inv, timeout=120):
                first_line = Path(dls.run.read(frame.value)).read_text().splitlines()[0]
                print(f"  published {frame.value}: {first_line}")
        print("pipeline done: every file stayed in storage; only keys rode the queue")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="producer", choices=["producer", "worker"])
    parser.add_argument("--url", help="plane URL (default: a fresh temporary file:// plane)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.role == "worker":
        q = dls.Dispatch(args.url, ns=NS)
        q.udf(clean_station), q.udf(render_report)
        dls.run_worker(q, max_poll_s=0.2)
        return
    if args.url:
        produce(args.url, args.workers)
        return
    with tempfile.TemporaryDirectory(prefix="lakeshore-pipeline-") as tmp:
        produce(f"file://{tmp}/plane", args.workers)


if __name__ == "__main__":
    main()
