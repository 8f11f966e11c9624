"""The documentation's Python examples run: every ```python block of docs/**/*.md and README.md.

The blocks of one Markdown file run in order, in one shared namespace, like the cells of a
notebook: a later block may use what an earlier one defined. Each file gets a fresh
temporary working directory, ``$HOME``, ``$LAKESHORE_URL`` (``file://<tmp>/plane``) and
``$LAKESHORE_CACHE``, so no example touches ``~/.lakeshore`` or another file's state. A block
that raises fails its test, and the blocks after it in the same file are skipped.

Two markers, an HTML comment on the line right before the opening fence, change what happens
to a block (docs/testing.md documents them):

* ``<!-- not-run: <reason> -->``: the block is not run (it needs AWS, a cluster, Docker…);
  the reason is required.
* ``<!-- file: <name> -->``: the block is a file of a multi-process example. It is written
  to ``<name>`` in the working directory before the next block runs, not executed.
* ``<!-- process: <name> -->``: the block is a program the page tells the reader to run by
  itself (a ```python or ```bash block): it is written to ``<name>`` and run as its own
  process in the working directory, with the page's environment, and must exit 0.

Blocks run as the script's ``__main__``: ``if __name__ == "__main__":`` guards run, and a
worker that starts a child process (process isolation) re-imports the running block the way
``spawn`` re-imports a script.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import lakeshore.dispatch

ROOT = Path(__file__).resolve().parents[2]

_MARKER = re.compile(r"<!--\s*(not-run|file|process)\s*:(.*?)-->")
_SHELLS = ("bash", "sh")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_SNIPPET = re.compile(r"""^\s*--8<--\s+["']([^"']+)["']\s*$""")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    source: str
    not_run: str | None = None  # the reason, when marked not-run
    file: str | None = None  # the file name, when marked file
    process: str | None = None  # the file name, when marked process

    @property
    def runs(self) -> bool:
        plain = self.lang == "python" and self.not_run is None and self.file is None
        return plain or self.process is not None


def parse_blocks(text: str, path: str = "<text>") -> list[Block]:
    """Every fenced block of ``text``, with the marker on the line before it, if any.

    Raises:
        ValueError: a marker without a reason or file name, a marker that is not right
            before a python fence, or a fence that never closes.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: tuple[int, str, str] | None = None  # line, kind, argument
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.fullmatch(line.strip())
        if marker:
            kind, arg = marker.group(1), marker.group(2).strip()
            if not arg:
                raise ValueError(f"{path}:{i + 1}: `{kind}:` needs a reason or a file name")
            pending = (i + 1, kind, arg)
            i += 1
            continue
        fence = _FENCE.match(line)
        if not fence:
            if pending is not None and line.strip():
                raise ValueError(f"{path}:{pending[0]}: the marker is not right before a fence")
            i += 1
            continue
        indent, mark = fence.group("indent"), fence.group("fence")
        lang = fence.group("info").strip().split(" ")[0].lower() if fence.group("info") else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(mark[0] * len(mark)) and not close.strip(mark[0]):
                break
            body.append(lines[j])
            j += 1
        else:
            raise ValueError(f"{path}:{i + 1}: the fence never closes")
        source = textwrap.dedent("\n".join(body)) if indent else "\n".join(body)
        not_run = file = process = None
        if pending is not None:
            langs = ("python", *_SHELLS) if pending[1] == "process" else ("python",)
            if pending[0] != i or lang not in langs:
                raise ValueError(
                    f"{path}:{pending[0]}: a marker must be on the line right before a "
                    f"```{' or ```'.join(langs)} fence"
                )
            if pending[1] == "not-run":
                not_run = pending[2]
            elif pending[1] == "file":
                file = pending[2]
            else:
                process = pending[2]
            pending = None
        blocks.append(Block(path, i + 1, lang, source + "\n", not_run, file, process))
        i = j + 1
    if pending is not None:
        raise ValueError(f"{path}:{pending[0]}: the marker is not right before a fence")
    return blocks


def expand_snippets(source: str, root: Path = ROOT) -> str:
    """Inline ``--8<-- "path"`` lines (pymdownx.snippets, paths relative to the repo root)."""
    out = []
    for line in source.splitlines():
        m = _SNIPPET.match(line)
        out.append((root / m.group(1)).read_text().rstrip("\n") if m else line)
    return "\n".join(out) + "\n"


def doc_files() -> list[Path]:
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]


def all_blocks() -> list[Block]:
    return [
        b
        for f in doc_files()
        for b in parse_blocks(f.read_text(), str(f.relative_to(ROOT)))
        if b.lang == "python" or b.process is not None
    ]


@dataclass
class Notebook:
    """The state shared by the blocks of one Markdown file."""

    blocks: list[Block]
    home: Path
    module: types.ModuleType = field(init=False)
    done: int = 0  # blocks[:done] have run (or been written)
    failed_at: int | None = None  # line of the block that raised
    default_plane: lakeshore.dispatch.Dispatch | None = None
    # modules the blocks imported from the page's folder (tasks.py…), kept between its blocks
    imported: dict[str, types.ModuleType] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.module = types.ModuleType("__main__")
        self.module.__dict__["__builtins__"] = __builtins__
        for sub in ("work", "home", "cache"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)

    @property
    def cwd(self) -> Path:
        return self.home / "work"

    def run_through(self, block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
        """Run (or write) every block up to and including ``block``, in order."""
        monkeypatch.chdir(self.cwd)
        monkeypatch.setenv("HOME", str(self.home / "home"))
        monkeypatch.setenv("LAKESHORE_URL", f"file://{self.home}/plane")
        monkeypatch.setenv("LAKESHORE_CACHE", str(self.home / "cache"))
        monkeypatch.delenv("LAKESHORE_DATA", raising=False)
        monkeypatch.syspath_prepend(str(self.cwd))
        while self.done <= self.blocks.index(block):
            current = self.blocks[self.done]
            self.done += 1
            if current.file is not None:
                (self.cwd / current.file).write_text(expand_snippets(current.source))
            elif current.process is not None:
                try:
                    self._run_process(current)
                except BaseException:
                    self.failed_at = current.line
                    raise
            elif current.runs:
                try:
                    self._exec(current)
                except BaseException:
                    self.failed_at = current.line
                    raise

    def _run_process(self, block: Block) -> None:
        """Run the block as the reader would: its own process, from the page's folder."""
        assert block.process is not None
        (self.cwd / block.process).write_text(expand_snippets(block.source))
        shell = block.lang in _SHELLS
        argv = ["bash", "-e", block.process] if shell else [sys.executable, block.process]
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.pop("PYTHONPATH", None)  # as a reader's shell: only what the page sets
        done = subprocess.run(
            argv, cwd=self.cwd, env=env, capture_output=True, text=True, timeout=100
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{block.path}:{block.line}: `{' '.join(argv[:-1])} {block.process}` exited "
                f"{done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n"
                f"{done.stderr[-3000:]}"
            )

    def _exec(self, block: Block) -> None:
        source = expand_snippets(block.source)
        # Line numbers of tracebacks are the Markdown file's own.
        code = compile("\n" * block.line + source, str(ROOT / block.path), "exec")
        # `spawn` children re-import the main script: give them this block as one.
        script = self.cwd / f"_doc_block_{block.line}.py"
        script.write_text(source)
        self.module.__file__ = str(script)
        real_main, real_default = sys.modules["__main__"], lakeshore.dispatch._default
        sys.modules["__main__"] = self.module
        sys.modules.update(self.imported)  # as in one notebook: what a cell imported stays
        lakeshore.dispatch._default = self.default_plane  # `@dls.udf` binds per file
        try:
            exec(code, self.module.__dict__)
        finally:
            self.default_plane = lakeshore.dispatch._default
            sys.modules["__main__"], lakeshore.dispatch._default = real_main, real_default
            # Modules the block imported from its folder (tasks.py…) stay its page's own:
            # another page may have a module of the same name.
            for name, mod in list(sys.modules.items()):
                if str(getattr(mod, "__file__", None) or "").startswith(str(self.home)):
                    self.imported[name] = sys.modules.pop(name)


_BLOCKS = all_blocks()


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Notebook]]:
    books: dict[str, Notebook] = {}
    yield books
    for book in books.values():  # blocks may leave threads of their planes' stores behind
        if book.default_plane is not None:
            book.default_plane.store.close()


@pytest.mark.timeout(120)  # a block that waits for a worker it never started hangs
@pytest.mark.parametrize(
    "block", [b for b in _BLOCKS if b.runs], ids=lambda b: f"{b.path}:{b.line}"
)
def test_doc_block_runs(
    block: Block,
    notebooks: dict[str, Notebook],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    book = notebooks.get(block.path)
    if book is None:
        mine = [b for b in _BLOCKS if b.path == block.path]
        name = re.sub(r"\W", "_", block.path)
        book = notebooks[block.path] = Notebook(mine, tmp_path_factory.mktemp(name))
    if book.failed_at is not None:
        pytest.skip(f"the block at {block.path}:{book.failed_at} failed; this one builds on it")
    book.run_through(block, monkeypatch)


# The collector itself: markers, fences and failures must be noticed, not silently skipped.

_SAMPLE = """\
# A page

```python
x = 1
```

<!-- not-run: needs AWS -->
```python
import boto3
```

<!-- file: tasks.py -->
```python
def f(): ...
```

- a list item:

    ```python
    if x:
        y = 2
    ```

````markdown
```python
not code of this page
```
````

```bash
echo hi
```

<!-- process: run.sh -->
```bash
echo run
```
"""


def test_parse_blocks_reads_markers_fences_and_indentation() -> None:
    blocks = parse_blocks(_SAMPLE)
    assert [(b.line, b.lang) for b in blocks] == [
        (3, "python"),
        (8, "python"),
        (13, "python"),
        (19, "python"),
        (24, "markdown"),
        (30, "bash"),
        (35, "bash"),
    ]
    assert [b.runs for b in blocks] == [True, False, False, True, False, False, True]
    assert blocks[6].process == "run.sh"
    assert blocks[1].not_run == "needs AWS"
    assert blocks[2].file == "tasks.py"
    assert blocks[3].source == "if x:\n    y = 2\n"
    assert "not code of this page" in blocks[4].source


@pytest.mark.parametrize(
    "text",
    [
        "<!-- not-run: -->\n```python\nx = 1\n```\n",  # no reason
        "<!-- not-run: needs AWS -->\n\n```python\nx = 1\n```\n",  # not right before it
        "<!-- not-run: needs AWS -->\n```bash\nls\n```\n",  # not a python block
        "<!-- file: a.py -->\nsome text\n",  # no block at all
        "```python\nx = 1\n",  # never closed
        "<!-- process: a.txt -->\n```text\nhi\n```\n",  # not a program
    ],
    ids=["no-reason", "blank-line-between", "not-python", "no-block", "unclosed", "not-code"],
)
def test_parse_blocks_refuses_bad_markers(text: str) -> None:
    with pytest.raises(ValueError):
        parse_blocks(text)


def test_a_block_that_raises_fails_and_blocks_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "```python\nn = 41\n```\n\n```python\nraise ValueError(n + 1)\n```\n\n```python\n```\n"
    blocks = parse_blocks(text, "sample.md")
    book = Notebook(blocks, tmp_path)
    book.run_through(blocks[0], monkeypatch)
    assert book.module.n == 41
    with pytest.raises(ValueError, match="42"):
        book.run_through(blocks[1], monkeypatch)
    assert book.failed_at == 5


def test_blocks_share_a_namespace_and_see_written_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        "<!-- file: helper_mod.py -->\n```python\nVALUE = 7\n```\n\n"
        "```python\nimport helper_mod\nimport os\nseen = (helper_mod.VALUE, __name__)\n"
        "url = os.environ['LAKESHORE_URL']\n```\n"
    )
    blocks = parse_blocks(text, "sample.md")
    book = Notebook(blocks, tmp_path)
    book.run_through(blocks[1], monkeypatch)
    assert "helper_mod" not in sys.modules  # a page's modules do not leak into the next
    assert book.module.seen == (7, "__main__")
    assert book.module.url == f"file://{tmp_path}/plane"


def test_process_blocks_run_as_their_own_programs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        "<!-- process: write.py -->\n```python\nimport os\nopen('out.txt', 'w').write("
        "os.environ['LAKESHORE_URL'])\nx = 1\n```\n\n"
        "<!-- process: check.sh -->\n```bash\ntest -s out.txt\nlakeshore --version\n```\n\n"
        "<!-- process: fails.py -->\n```python\nprint(x)\n```\n"
    )
    blocks = parse_blocks(text, "sample.md")
    book = Notebook(blocks, tmp_path)
    book.run_through(blocks[1], monkeypatch)  # the shell finds the file and the command
    assert (book.cwd / "out.txt").read_text() == f"file://{tmp_path}/plane"
    assert not hasattr(book.module, "x"), "a process block does not run in the page's namespace"
    with pytest.raises(AssertionError, match=r"(?s)exited 1.*NameError: name 'x'"):
        book.run_through(blocks[2], monkeypatch)  # so what it did not define is not there
    assert book.failed_at == blocks[2].line


def test_the_docs_have_runnable_examples() -> None:
    runnable = {b.path for b in _BLOCKS if b.runs}
    assert {"README.md", "docs/queue.md", "docs/quickstart.md"} <= runnable
    not_run = [b for b in _BLOCKS if b.not_run is not None]
    assert all(len(b.not_run or "") >= 8 for b in not_run), "say why a block cannot run"


def test_install_lines_name_what_installs_and_every_extra_is_explained() -> None:
    """The package is not on PyPI: an install step that names it bare fails for a new user.
    The quickstart's table explains each extra pyproject.toml defines."""
    import tomllib

    bare = re.compile(r"pip install (-U )?['\"]?lakeshore-queue['\"]?\s*($|#)")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    wrong = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in pages
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if bare.search(line)
    ]
    assert not wrong, f"install steps that cannot work until a release: {wrong}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    missing = [name for name in extras if f"| `{name}` |" not in quickstart]
    assert not missing, f"extras the quickstart does not explain: {missing}"


def test_prose_does_not_copy_the_suite_s_size() -> None:
    """How many tests there are goes stale with every change: the run prints it."""
    count = re.compile(r"\b\d{3,}\+? tests\b|\ba little over \d+ tests\b")
    for page in (ROOT / "README.md", ROOT / "docs" / "testing.md"):
        text, inside = [], False
        for line in page.read_text().splitlines():
            if _FENCE.match(line):
                inside = not inside
            elif not inside:
                text.append(line)
        found = count.findall("\n".join(text))
        assert not found, f"{page.relative_to(ROOT)} copies a test count: {found}"


def test_the_readme_stays_a_front_page() -> None:
    """What it is, the two commands, one example and links: the rest lives in docs/."""
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) < 1000
    assert "bash scripts/demo" in text and "bash scripts/test" in text
    assert sum(1 for line in text.splitlines() if line.startswith("```python")) == 1
