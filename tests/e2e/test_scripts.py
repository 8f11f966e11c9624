"""Scripts that start a worker with process isolation: spawn re-imports the script in each
body process, so what the script does at import runs there again. A script without a
``__main__`` guard, or one read from stdin, must get one clear line on what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lakeshore as dls

_SCRIPT = """\
import lakeshore as dls
q = dls.Dispatch({url!r})


@q.udf
def square(x):
    return x * x

{body}
"""
_WORK = """\
inv = square.submit(3, _timeout_s=30)   # a timeout: the body runs in a child process
print("ran", dls.run_worker(q, once=True))
print(q.result(inv, timeout=30))
"""


def _run(
    tmp_path: Path, body: str, stdin: bool = False
) -> tuple[subprocess.CompletedProcess[str], str]:
    url = f"file://{tmp_path}/store"
    script = _SCRIPT.format(url=url, body=body)
    path = tmp_path / "job_script.py"
    path.write_text(script)
    argv = [sys.executable, "-"] if stdin else [sys.executable, str(path)]
    out = subprocess.run(
        argv,
        input=script if stdin else None,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out, url


def _tickets(url: str) -> list[str]:
    """The ids of the live invocations of the script's queue."""
    q = dls.Dispatch(url)
    return [o.key.rsplit("/", 1)[1] for o in q.store.list("lakeshore/default/default/_tickets/")]


def test_an_unguarded_script_is_told_to_guard_itself(tmp_path: Path) -> None:
    out, url = _run(tmp_path, _WORK)
    assert out.returncode == 1
    told = [ln for ln in out.stderr.splitlines() if "ran again in a worker's body process" in ln]
    assert len(told) == 1 and 'if __name__ == "__main__":' in told[0], out.stderr
    assert 'isolation="thread"' in told[0]
    assert "bootstrapping phase" not in out.stderr  # multiprocessing's own confusion
    assert out.stderr.rstrip().splitlines()[-1].startswith("lakeshore.errors.HookFailed: ")
    live = _tickets(url)
    assert len(live) == 1, "the body process must not submit the script's work again"
    assert dls.Dispatch(url).status(live[0]) == "queued"  # released, to run elsewhere


def test_a_script_read_from_stdin_is_told_to_become_a_file(tmp_path: Path) -> None:
    out, _ = _run(tmp_path, _WORK, stdin=True)
    assert out.returncode == 1
    last = out.stderr.rstrip().splitlines()[-1]
    assert last.startswith("lakeshore.errors.HookFailed: ") and "stdin" in last, out.stderr
    assert "save the script as a file" in last and 'isolation="thread"' in last
    assert "FileNotFoundError" not in out.stderr


def test_a_guarded_script_with_a_module_level_plane_runs(tmp_path: Path) -> None:
    guarded = 'if __name__ == "__main__":\n' + "".join(f"    {ln}\n" for ln in _WORK.splitlines())
    out, url = _run(tmp_path, guarded)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["ran 1", "9"]
    assert _tickets(url) == []
