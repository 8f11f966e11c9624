"""Names 0.4.0 had that 0.5 renamed: the old ones still answer, with a DeprecationWarning."""

from __future__ import annotations

import pytest

import lakeshore as dls
from lakeshore.store import CREATE, OVERWRITE, if_match


def test_put_mode_kind_is_its_name() -> None:
    for mode, name in ((OVERWRITE, "overwrite"), (CREATE, "create"), (if_match("e"), "if_match")):
        with pytest.warns(DeprecationWarning, match=r"PutMode\.name"):
            assert mode.kind == name


def test_frame_kind_is_always_value() -> None:
    with pytest.warns(DeprecationWarning, match="every frame handed out is a value"):
        assert dls.Frame(0, 1, 1).kind == "value"


def test_a_work_queue_names_its_plane_plane() -> None:
    q = dls.Dispatch(":memory:")
    with pytest.warns(DeprecationWarning, match=r"WorkQueue\(dispatch=\.\.\.\) is deprecated"):
        wq = dls.WorkQueue("work", dispatch=q)
    assert wq.plane is q
    with pytest.warns(DeprecationWarning, match=r"WorkQueue\.dispatch is deprecated"):
        assert wq.dispatch is q
    with pytest.warns(DeprecationWarning, match=r"AsyncWorkQueue\(dispatch=\.\.\.\) is"):
        aq = dls.AsyncWorkQueue("work", dispatch=q)
    assert aq.sync.plane is q
    with pytest.raises(dls.InvalidArgument, match="both plane= and dispatch="):
        dls.WorkQueue("work", q, dispatch=q)
