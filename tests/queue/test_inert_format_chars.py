"""Every Unicode format character is shown escaped, not only a list of them (issue 31,
finding 10a): U+061C (ARABIC LETTER MARK, a bidi control) reached the terminal raw from
``status``, ``ls``, ``show``, ``result`` and ``logs``."""

from __future__ import annotations

import dataclasses
import json
import sys
import unicodedata

import pytest

import lakeshore as dls
from lakeshore import codec
from lakeshore.cli import main
from lakeshore.keys import worker_key
from lakeshore.text import inert, inert_json

# none of them was on the old list: a bidi mark, a zero-width space, a byte order mark, a
# soft hyphen, an invisible tag letter (hidden text), and a bidi isolate that was
FORMAT = "\u061c\u200b\ufeff\u00ad\U000e0041\u2066"
RAW = tuple(FORMAT)
HOSTILE = f"ok{FORMAT}ok"


def every(category: str) -> str:
    return "".join(
        chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == category
    )


@pytest.mark.parametrize("category", ["Cc", "Cf", "Zl", "Zp", "Cs"])
def test_every_character_of_an_unsafe_category_is_escaped(category: str) -> None:
    chars = every(category)
    shown = inert(chars)
    assert not any(c in shown for c in chars), category
    lines = inert(chars, multiline=True)
    assert not any(c in lines for c in chars if c not in "\n\t"), category
    as_json = inert_json(json.dumps(chars, ensure_ascii=False))
    assert not any(c in as_json for c in chars if c >= " "), category
    if category != "Cs":  # JSON reads a high and a low surrogate escape as one pair
        assert json.loads(as_json) == chars


def test_text_of_every_script_is_kept() -> None:
    text = "déjà vu, 中文, العربية, עברית, हिन्दी, 🙂 \u00a0x\ty"
    assert inert(text, multiline=True) == text
    assert inert(text) == text.replace("\t", "\\x09")
    assert inert_json(json.dumps(text, ensure_ascii=False)) == json.dumps(text, ensure_ascii=False)


def shout(text: str) -> str:
    print(text)
    return text


def boom(text: str) -> None:
    raise ValueError(text)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code in (0, 1), (code, out, err)
    return out + err


def _assert_escaped(text: str) -> None:
    for c in RAW:
        assert c not in text, (hex(ord(c)), text)
    assert "ok\\u061c\\u200b\\ufeff\\xad\\U000e0041\\u2066ok" in text, text


def test_status_ls_show_result_and_logs_escape_format_characters(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = dls.Dispatch(url)
    loud = q.udf(shout).submit(HOSTILE, _key=HOSTILE)
    bad = q.udf(boom).submit(HOSTILE, _max_attempts=1)
    dls.run_worker(
        q,
        isolation="thread",
        idle_exit=0.3,
        max_poll_s=0.02,
        allow=["tests.queue.test_inert_format_chars:*"],
    )
    assert q.status(loud) == "succeeded" and q.status(bad) == "failed"
    ops = q.plane.ops("default")
    rec, _ = ops.read(loud)
    # anyone who can write the record chooses its function name
    q.store.put(ops.keys.record(loud), dataclasses.replace(rec, fn=HOSTILE).to_bytes())
    life = {"seen_at": q.store.now(), "worker": HOSTILE, "status": "running", "running": 0}
    q.store.put(worker_key("default", "evil"), codec.encode({**life, "done": 0}))

    _assert_escaped(_run(capsys, "status"))
    _assert_escaped(_run(capsys, "ls"))
    _assert_escaped(_run(capsys, "show", loud))  # function and key
    _assert_escaped(_run(capsys, "show", bad))  # error and traceback
    _assert_escaped(_run(capsys, "result", loud))
    _assert_escaped(_run(capsys, "result", bad))
    _assert_escaped(_run(capsys, "logs", loud))
    for command in (["status"], ["ls"], ["show", loud]):  # JSON: escaped as \uXXXX
        out = _run(capsys, *command, "--json")
        assert not any(c in out for c in RAW), command
