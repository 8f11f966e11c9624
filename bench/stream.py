"""Streaming: frames per second and frames per PUT, against the store's own PUT rate.

    bash scripts/bench stream        # or: .venv/bin/python -m bench.stream [--frames N]

A generator body yields N small values; a worker runs it while a reader (another thread)
follows ``q.stream`` live. Reported per store (memory, a local directory, SeaweedFS started
here on loopback):

* frames/s end to end (submit → the reader has seen the last frame);
* frames per PUT (segments written for N frames);
* the baseline measured in the same run: raw ``store.put`` of the same number of segments of
  the same size, as frames/s if every PUT carried that many frames — the ratio says how close
  the journal comes to what the store itself can take.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lakeshore as dls
from lakeshore.store import CREATE, LocalStore, MemoryStore, Store


def count_to(n: int) -> Iterator[int]:
    yield from range(n)


def measure(store: Store, frames: int) -> dict[str, Any]:
    q = dls.Dispatch(store.url, store=store)
    gen = q.udf(count_to)
    t0 = time.perf_counter()
    inv = gen.submit(frames)
    seen: list[int] = []
    reader = threading.Thread(target=lambda: seen.extend(f.value for f in q.stream(inv)))
    reader.start()
    dls.run_worker(q, once=True)
    reader.join()
    elapsed = time.perf_counter() - t0
    assert seen == list(range(frames)), "the reader must see every frame in order"
    segs = list(store.list(q.plane.ops("default").keys.journal_prefix(inv, 1)))
    size = sum(s.size for s in segs) // max(1, len(segs))
    # Baseline: the same number of PUTs of the same size, straight to the store.
    blob = b"x" * size
    b0 = time.perf_counter()
    for i in range(len(segs)):
        store.put(f"bench-baseline/{inv}/{i:06d}", blob, CREATE)
    raw_puts_s = len(segs) / (time.perf_counter() - b0)
    per_put = frames / len(segs)
    fps = frames / elapsed
    return {
        "store": store.url.split("/")[0] or store.url,
        "frames": frames,
        "frames_per_s": fps,
        "segments": len(segs),
        "frames_per_put": per_put,
        "baseline_frames_per_s": raw_puts_s * per_put,
        "ratio": fps / (raw_puts_s * per_put),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=10_000)
    args = parser.parse_args()
    rows = [measure(MemoryStore(), args.frames)]
    rows.append(measure(LocalStore(tempfile.mkdtemp(prefix="lakeshore-bench-")), args.frames))
    from bench.seaweed_env import seaweed_store

    with seaweed_store() as s3:
        if s3 is not None:
            rows.append(measure(s3, args.frames))
    print(
        f"{'store':<10} {'frames':>7} {'frames/s':>10} {'segments':>9} {'fr/PUT':>7} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['store']:<10} {r['frames']:>7} {r['frames_per_s']:>10.0f} {r['segments']:>9} "
            f"{r['frames_per_put']:>7.0f} {r['ratio']:>6.2f}"
        )
    print("(ratio = frames/s ÷ raw PUT rate of the same segments × frames per PUT, same run)")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "stream.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
