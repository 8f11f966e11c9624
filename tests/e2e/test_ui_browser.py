"""The dashboard in a real browser: headless Chromium (Debian's) driven by Playwright, against
`lakeshore ui`'s server on 127.0.0.1, over a store that a worker in this process serves.

Each test takes a screenshot of the page it drove. ``LAKESHORE_UI_SHOTS=docs/img`` puts
them where ``docs/ui.md`` shows them (that is how those pictures are made); otherwise they
go to the test's temporary folder, so every run still takes them.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import lakeshore as dls
from lakeshore.ui import Board, UiServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

WAIT_MS = 20_000  # a change must show within this (the page polls every second or so)
GATES: dict[str, threading.Event] = {}  # the generator's steps, opened by the test
MARKUP = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold</b>'


class Dash:
    """A store, a worker thread on demand, the dashboard's server and a browser page."""

    def __init__(self, browser: Any, shots: Path, allow_actions: bool) -> None:
        self.q = dls.Dispatch(":memory:", retry_backoff_s=0.01)
        self.board = Board(self.q.store, interval_s=0.5, live_s=0.25, discover_s=1.0)
        self.server = UiServer(self.board, self.q.url, port=0, allow_actions=allow_actions)
        self.server.start()
        self.context = browser.new_context(viewport={"width": 1280, "height": 820})
        self.page = self.context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.shots = shots
        self.stops: list[tuple[threading.Event, threading.Thread]] = []
        self.names = itertools.count(1)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/"

    def worker(self, queues: list[str]) -> None:
        stop = threading.Event()
        t = threading.Thread(
            target=dls.run_worker,
            args=(self.q,),
            kwargs={
                "queues": queues,
                "stop": stop,
                "max_poll_s": 0.05,
                "isolation": "thread",
                "worker_id": f"worker-{next(self.names)}",
            },
            daemon=True,
        )
        t.start()
        self.stops.append((stop, t))

    def shot(self, name: str) -> Path:
        path = self.shots / f"ui-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 10_000, "the screenshot is blank"
        return path

    def stop_workers(self) -> None:
        for stop, _ in self.stops:
            stop.set()
        for gate in GATES.values():
            gate.set()
        for _, t in self.stops:
            t.join(timeout=30)
            assert not t.is_alive(), "a worker did not stop"
        self.stops.clear()

    def close(self) -> None:
        self.stop_workers()
        self.context.close()
        self.server.close()
        self.q.store.close()


@pytest.fixture
def dash(chromium: Any, tmp_path: Path) -> Iterator[Callable[..., Dash]]:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    made: list[Dash] = []
    shots = Path(os.environ.get("LAKESHORE_UI_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)

    def make(allow_actions: bool = False) -> Dash:
        d = Dash(chromium, shots, allow_actions)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()
    GATES.clear()


def _text(page: Any, selector: str) -> str:
    return str(page.locator(selector).inner_text())


def test_overview_counts_follow_submits_and_a_draining_worker(dash: Callable[..., Dash]) -> None:
    from playwright.sync_api import expect

    d = dash()
    add = d.q.udf(_add, queue="default")
    d.q.configure("default", max_depth=100, provider={"kind": "local", "max_workers": 2})
    d.page.goto(d.base)
    row = d.page.locator("tr[data-queue=default]")
    expect(row).to_contain_text("max_depth=100, on_full=reject")  # the queue record's settings
    expect(row).to_contain_text("kind=local, max_workers=2")  # and its provider
    expect(d.page.locator("tr[data-queue=default] td.queued")).to_have_text("0")
    ids = [add.submit(i) for i in range(5)]
    expect(d.page.locator("tr[data-queue=default] td.queued")).to_have_text("5")
    d.worker(["default"])
    expect(d.page.locator("tr[data-queue=default] td.queued")).to_have_text("0")
    expect(d.page.locator("tr[data-queue=default] td.running")).to_have_text("0")
    assert [d.q.result(i, timeout=30) for i in ids] == [1, 2, 3, 4, 5]
    expect(d.page.locator("h3", has_text="workers alive: 1")).to_be_visible()
    # the chart drew the finished invocations as bars
    expect(d.page.locator("tr[data-queue=default] svg.chart rect.done").first).to_be_attached()
    d.stop_workers()
    add.submit(9)  # one waiting, for the picture
    expect(d.page.locator("tr[data-queue=default] td.queued")).to_have_text("1")
    d.worker(["other"])  # and one worker alive beside the stopped one
    expect(d.page.locator("h3", has_text="workers alive: 1 (2 seen")).to_be_visible()
    d.shot("overview")


def test_a_failed_invocation_shows_its_traceback(dash: Callable[..., Dash]) -> None:
    from playwright.sync_api import expect

    d = dash()
    boom = d.q.udf(_boom, queue="default", max_attempts=1)
    ok = d.q.udf(_add, queue="default")
    ok.submit(1)
    inv = boom.submit("the disk is full")
    d.worker(["default"])
    with pytest.raises(dls.Failed):
        d.q.result(inv, timeout=30)
    d.page.goto(f"{d.base}#/q/default/default")
    expect(d.page.locator(f"a:text-is('{inv}')")).to_be_visible()
    d.page.select_option("select[name=state]", "failed")
    d.page.click("button[type=submit]")
    expect(d.page.locator("table.invocations tbody tr")).to_have_count(1)
    d.shot("queue")
    d.page.click(f"a:text-is('{inv}')")
    expect(d.page.locator("code.etype")).to_have_text("RuntimeError")
    expect(d.page.locator("pre.traceback")).to_contain_text("raise RuntimeError(why)")
    expect(d.page.locator("pre.traceback")).to_contain_text("the disk is full")
    expect(d.page.locator("table.history tbody tr")).to_have_count(1)
    expect(d.page.locator("table.history")).to_contain_text("failed")
    d.shot("failed")


def test_a_delayed_invocation_shows_when_it_is_scheduled(dash: Callable[..., Dash]) -> None:
    from playwright.sync_api import expect

    d = dash()
    inv = d.q.udf(_add, queue="default").submit(1, _delay_s=2 * 3600)
    d.page.goto(f"{d.base}#/q/default/default")
    row = d.page.locator("table.invocations tbody tr", has_text=inv)
    expect(row.locator(".scheduled")).to_have_text(" scheduled in 2 h")
    d.page.click(f"a:text-is('{inv}')")
    expect(d.page.locator("p.scheduled")).to_contain_text("(in 2 h)")
    expect(d.page.locator("p.scheduled")).to_contain_text("scheduled: not before 20")


def test_a_generators_frames_appear_live(dash: Callable[..., Dash]) -> None:
    from playwright.sync_api import expect

    d = dash()
    GATES.update(one=threading.Event(), two=threading.Event())
    stepper = d.q.udf(_stepper, queue="stream")
    inv = stepper.submit()
    d.worker(["stream"])
    d.page.goto(f"{d.base}#/i/default/{inv}")
    frames = d.page.locator("ol.frames li")
    expect(frames).to_have_count(1)
    expect(frames.nth(0)).to_have_text("'step 0'")
    expect(d.page.locator("h2 .state")).to_have_text("running")
    GATES["one"].set()
    expect(frames).to_have_count(2)
    expect(frames.nth(1)).to_have_text("'step 1'")
    expect(d.page.locator("pre.logs")).to_contain_text("working on step 1")
    d.shot("stream")
    GATES["two"].set()
    expect(frames).to_have_count(3)
    expect(d.page.locator("h2 .state")).to_have_text("succeeded")
    # the page's cursor resumes: a reload starting after seq 1 asks only for what follows
    d.page.goto(f"{d.base}#/i/default/{inv}?after=1")
    d.page.reload()
    expect(frames).to_have_count(1)
    expect(frames.nth(0)).to_have_text("'step 2'")


def _cancel_from_page(d: Dash, inv: str) -> str:
    from playwright.sync_api import expect

    d.page.goto(f"{d.base}#/i/default/{inv}")
    expect(d.page.locator("h2 .state")).to_have_text("queued")
    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    d.page.on("dialog", answer)
    d.page.click("button#cancel")
    expect(d.page.locator("#notice")).not_to_be_empty()
    assert asked == [f"cancel {inv}?"], asked  # the page asked first
    return _text(d.page, "#notice")


def test_cancel_from_the_page_when_actions_are_allowed(dash: Callable[..., Dash]) -> None:
    from playwright.sync_api import expect

    d = dash(allow_actions=True)
    inv = d.q.udf(_add, queue="default").submit(1)
    assert _cancel_from_page(d, inv) == "cancel: cancelled"
    expect(d.page.locator("h2 .state")).to_have_text("killed")
    assert d.q.status(inv) == "killed"
    d.shot("cancelled")


def test_cancel_is_refused_when_actions_are_off(dash: Callable[..., Dash]) -> None:
    d = dash(allow_actions=False)
    inv = d.q.udf(_add, queue="default").submit(1)
    notice = _cancel_from_page(d, inv)
    assert notice.startswith("cancel refused: ui: actions are off"), notice
    assert d.q.status(inv) == "queued"
    # and not only the page: the server refuses the POST itself, even with the CSRF token
    page_call = urllib.request.Request(d.base + "api/session", headers={"X-Lakeshore-UI": "1"})
    with urllib.request.urlopen(page_call) as answer:
        session = json.loads(answer.read())
    request = urllib.request.Request(
        d.base + "api/cancel",
        data=json.dumps({"ns": "default", "id": inv}).encode(),
        headers={
            "Content-Type": "application/json",
            "X-CSRF-Token": session["csrf"],
            "X-Lakeshore-UI": "1",
        },
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    refused.value.close()
    assert refused.value.code == 403
    assert d.q.status(inv) == "queued"


def test_markup_in_a_payload_is_shown_as_text(dash: Callable[..., Dash]) -> None:
    from playwright.sync_api import expect

    d = dash()
    boom = d.q.udf(_boom, queue="default", max_attempts=1)
    inv = boom.submit(MARKUP)
    d.worker(["default"])
    with pytest.raises(dls.Failed):
        d.q.result(inv, timeout=30)
    d.page.goto(f"{d.base}#/i/default/{inv}")
    expect(d.page.locator("pre.shown.args")).to_contain_text(MARKUP)
    expect(d.page.locator("pre.message")).to_contain_text(MARKUP)
    expect(d.page.locator("pre.traceback")).to_contain_text(MARKUP)
    # inert: no element came of it, no script ran
    assert d.page.evaluate("window.__pwned") is None
    assert d.page.locator("main img").count() == 0
    assert d.page.locator("main b").count() == 0
    assert d.page.locator("script").count() == 1  # the page's own
    d.shot("markup")


def _add(x: int) -> int:
    return x + 1


def _boom(why: str) -> None:
    raise RuntimeError(why)


def _stepper() -> Iterator[str]:
    yield "step 0"
    GATES["one"].wait(60)
    print("working on step 1", flush=True)
    yield "step 1"
    GATES["two"].wait(60)
    yield "step 2"


def test_a_record_with_times_no_date_can_hold_still_shows(dash: Callable[..., Dash]) -> None:
    from playwright.sync_api import expect

    from lakeshore.model.record import Turn
    from tests.tiers import record_key

    d = dash()
    inv = d.q.udf(_add, queue="default").submit(1)
    d.q.cancel(inv)  # the record now exists: rewrite it as anyone with write access could
    ops = d.q.plane.ops("default")
    rec, _ = ops.read(inv)
    odd = rec.next_write(deadline_at=1e300, history=(Turn(1, "w", 1e300, None, None),))
    d.q.store.put(record_key(ops, inv), odd.to_bytes())
    d.page.goto(f"{d.base}#/i/default/{inv}")
    expect(d.page.locator("table.record")).to_contain_text("1e+300")
    expect(d.page.locator("table.history")).to_contain_text("1e+300")
    expect(d.page.locator("#notice")).to_be_hidden()
