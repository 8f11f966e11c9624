"""Text from the store, made safe to show: on a terminal, in a log line, in JSON.

Anything read from the store may be hostile, and a worker's log or a command's output is
read on a terminal: a control character there is an instruction (move the cursor, rewrite
the title, hide what follows), a newline fakes a line of its own, and an invisible Unicode
format character reorders, hides or joins what is shown. Every place that shows such text
passes it through here.

What is escaped is decided by Unicode category, not by a list, so that no format character
is missed: controls (``Cc``: C0, DEL, C1; 0x9b alone is a CSI on some terminals), format
characters (``Cf``: bidi marks, embeddings, overrides and isolates such as U+061C and
U+2066, zero-width characters, U+FEFF, the invisible tag characters), the line and
paragraph separators (``Zl``, ``Zp``) and lone surrogates (``Cs``, which no terminal can be
sent). Letters, marks, symbols and spaces of every script are kept.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["inert", "inert_json"]

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
# printable ASCII is always safe: only runs of anything else are looked at, by category
_SUSPECT = re.compile("[^\x20-\x7e]+")
_SUSPECT_MULTILINE = re.compile("[^\x20-\x7e\n\t]+")
_NONE: frozenset[str] = frozenset()
_KEPT_LINES = frozenset("\n\t")
# json.dumps escapes C0 inside strings; outside them C0 is only its indent's newlines
_KEPT_JSON = frozenset(map(chr, range(0x20)))


def _unsafe(c: str) -> bool:
    return unicodedata.category(c) in _UNSAFE_CATEGORIES


def _escape(c: str) -> str:
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _inert_run(run: str, kept: frozenset[str]) -> str:
    if run.isprintable():  # letters, symbols, marks: the usual case, at C speed
        return run
    return "".join(_escape(c) if c not in kept and _unsafe(c) else c for c in run)


def inert(text: object, multiline: bool = False) -> str:
    """``text`` safe to print on a terminal: controls and Unicode format characters shown as
    ``\\x1b``-, ``\\u061c``- or ``\\U000e0041``-style escapes. ``multiline`` keeps newlines
    and tabs (log output); a carriage return is always escaped, since it lets a line
    overwrite what came before it."""
    if multiline:
        return _SUSPECT_MULTILINE.sub(lambda m: _inert_run(m.group(), _KEPT_LINES), str(text))
    return _SUSPECT.sub(lambda m: _inert_run(m.group(), _NONE), str(text))


def _json_run(run: str) -> str:
    if run.isprintable():
        return run
    out = []
    for c in run:
        if c in _KEPT_JSON or not _unsafe(c):
            out.append(c)
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:  # JSON spells a code point beyond the BMP as its UTF-16 surrogate pair
            n = ord(c) - 0x10000
            out.append(f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}")
    return "".join(out)


def inert_json(text: str) -> str:
    """JSON text (which escapes C0 itself) with the remaining terminal controls and format
    characters escaped as ``\\uXXXX``, which decode to the same string. Such characters can
    only occur inside JSON strings, where an escape means the same code point."""
    return _SUSPECT.sub(lambda m: _json_run(m.group()), text)
