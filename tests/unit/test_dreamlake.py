"""``dreamlake.lakeshore``: upstream's names that have no meaning here are refused with a
one-line reason or accepted and inert; lakeshore's own names stay reachable (issue 19)."""

from __future__ import annotations

import pytest

import dreamlake.lakeshore as dls
import lakeshore
from dreamlake.lakeshore.context import KeyError_
from dreamlake.lakeshore.dispatch import DispatchError
from dreamlake.lakeshore.transport import TransportError
from dreamlake.lakeshore.worker import WorkerError


@pytest.mark.parametrize(
    "call",
    [
        lambda: dls.HttpDispatch("http://127.0.0.1:9"),
        lambda: dls.Storage("s"),
        lambda: dls.TemporaryCredentials(),
        lambda: dls.DreamRc(),
        lambda: dls.Provider("SSH"),
        lambda: dls.load_config(),
        lambda: dls.resolve(None),
        lambda: dls.host_key({}),
        lambda: dls.placement_subset({}),
        lambda: dls.RunConfig(runner="process").host_key(),
        lambda: dls.RunContext(),
        lambda: dls.run.publish("x"),
    ],
)
def test_control_plane_names_are_refused_with_one_line_reasons(call: object) -> None:
    with pytest.raises(NotImplementedError) as e:
        call()  # type: ignore[operator]
    text = str(e.value)
    assert "\n" not in text and len(text) > 40


def test_a_run_config_is_kept_and_has_no_effect() -> None:
    cfg = dls.RunConfig(runner="process", host_setup=["pip install torch"])
    assert cfg.to_dict() == {"runner": "process", "host_setup": ["pip install torch"]}
    f = dls.udf(queue="gpu", config=cfg)(lambda x: x)
    assert f.config is cfg and f.local(3) == 3


def test_queue_orders_and_envelopes_lakeshore_has_not_are_refused() -> None:
    dp = dls.Dispatch(":memory:")
    with pytest.raises(DispatchError, match="filo"):
        dls.SyncQueue("q", dispatch=dp, kind="filo")
    q = dls.SyncQueue("q", dispatch=dp)
    with pytest.raises(DispatchError, match="envelope"):
        q.submit(envelope=b"\x00")
    with pytest.raises(TypeError, match="object"):
        q.submit(object())
    with pytest.raises(DispatchError, match="not running under worker"):
        q.post("01M8TS9CRD8771D9G3ETP3VSS4", "v")
    with pytest.raises(TransportError):
        dls.udf(queue="q", transport="ref")(lambda: 1).submit(_dispatch=dp)
    with pytest.raises(TransportError):
        dls.udf(queue="q", transport="pickle")(lambda: 1).submit(_dispatch=dp)
    with pytest.raises(TransportError):
        dls.run_worker(q, allow_pickled=True)


def test_lakeshore_names_stay_reachable_and_upstream_errors_have_their_homes() -> None:
    for name in lakeshore.__all__:
        assert hasattr(dls, name), name
    assert dls.Failed is lakeshore.Failed and dls.WorkQueue is lakeshore.WorkQueue
    assert dls.Job is lakeshore.Job
    assert issubclass(DispatchError, RuntimeError) and issubclass(WorkerError, RuntimeError)
    assert issubclass(KeyError_, ValueError)
    with pytest.raises(AttributeError):
        dls.no_such_name  # noqa: B018
    assert set(dls.UPSTREAM) <= set(dls.__all__)


def test_run_worker_takes_a_lakeshore_plane_too() -> None:
    q = dls.Dispatch(":memory:")
    f = q.udf(lambda x: x + 1)
    inv = f.submit(1)
    assert dls.run_worker(q, once=True) == 1
    assert q.result(inv) == 2


def test_a_topic_without_a_name_gets_a_valid_one_and_states_are_upstreams() -> None:
    q = dls.SyncQueue("q", dispatch=dls.Dispatch(":memory:"))
    t = q.topic()
    assert t.name.startswith("topic-") and t.post(1) == 0
    inv = q.submit("x")
    assert q.cancel(inv) and q.count("cancelled") == 1
    assert q.count("killed") == 0 and q.count("bogus") == 0  # not upstream's names


def test_a_stop_that_is_true_at_once_runs_nothing() -> None:
    dp = dls.Dispatch(":memory:")
    q = dls.SyncQueue("fq", dispatch=dp)
    f = dls.udf(queue="fq")(abs)
    inv = f.submit(-1, _dispatch=dp)
    assert dls.run_worker(q, stop=lambda: True) == 0
    assert dp.status(inv) == "queued"


def test_files_live_in_the_working_directory_as_upstreams_run_root(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    monkeypatch.chdir(tmp_path)  # type: ignore[arg-type]
    plain = dls.run.write("loose/a.txt")
    assert plain == Path(str(tmp_path)) / "loose" / "a.txt" and plain.parent.is_dir()
    with pytest.raises(dls.InvalidArgument):
        dls.run.read("loose/missing.txt")
    dp = dls.Dispatch(":memory:")
    with dls.scope("scenes/7"):
        dls.run.write("in.txt").write_text("input!")
    assert (Path(str(tmp_path)) / "scenes" / "7" / "in.txt").read_text() == "input!"
    assert dp.data_root.url == Path(str(tmp_path)).as_uri()
    dp.close()
