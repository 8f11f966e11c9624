"""The package's layering, read from the source (no import): each module imports only its
own layer and those below, the import graph has no cycle, and nothing reaches into another
module's private names. The layers are the ones docs/architecture.md draws."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "lakeshore"

# Lowest first; a module may import its own layer and the ones below it. A folder ("store/")
# is a layer's as a whole: every module in it, and any module added to it later.
LAYERS: list[tuple[str, set[str]]] = [
    ("errors", {"errors"}),
    ("foundations and the stores", {"codec", "keys", "scope", "text", "offload", "store/"}),
    ("pure records and transitions", {"model/"}),
    ("providers (tools that launch workers)", {"providers/"}),
    ("the protocol on the store", {"protocol/", "streams/", "doctor"}),
    ("running bodies and the plane", {"files/", "running/", "run", "plane", "tracing"}),
    (
        "submitting, waiting and scaling",
        {"submit", "batch", "asubmit", "results", "scaler", "firing"},
    ),
    ("worker and declared functions", {"worker", "udf", "udf_options"}),
    ("the facade", {"dispatch", "work_queue", "__init__", "demo"}),
    ("the dashboard", {"ui/"}),
    ("the command line", {"cli/", "__main__"}),
]


def _layer_of(mod: str) -> int | None:
    """The layer of module ``mod`` (dotted, below ``lakeshore``), or None."""
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            folder = m.removesuffix("/")
            if mod == m or (m.endswith("/") and (mod == folder or mod.startswith(folder + "."))):
                return i
    return None


# third-party clients, each owned by one module
OWNERS = {
    "boto3": {"store.s3"},
    "botocore": {"store.s3"},
    "obstore": {"store.s3_obstore"},
    "fsspec": {"files.context"},
    "opentelemetry": {"tracing"},
}

# private names of other objects the code may touch: the interpreter's and fsspec's
PRIVATE_OK = {"os._exit", "self._fs._strip_protocol"}
# running/zygote.py registers its server where the stdlib's fork server client looks (only
# against the stdlib it was written for: it checks forkserver.main's signature first)
PRIVATE_OK |= {"forkserver._forkserver", "server._forkserver_pid", "server._lock"}
PRIVATE_OK |= {"server._forkserver_address", "server._forkserver_alive_fd"}
# and gives multiprocessing a short temporary folder when TMPDIR is too long for a socket
# (the folder multiprocessing.util.get_temp_dir keeps there, read before it makes its own)
PRIVATE_OK |= {"current._config"}


def _name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"] or ["__init__"]
    return ".".join(parts)


def _modules() -> dict[str, ast.Module]:
    return {_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PKG.rglob("*.py"))}


def _imports(mod: str, tree: ast.Module) -> set[str]:
    """Every module of the package ``mod`` imports, at any depth (function-level and
    ``TYPE_CHECKING`` imports count: a type is a dependency too)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                continue  # the package uses absolute imports only (checked below)
            if node.module == "lakeshore" or node.module.startswith("lakeshore."):
                base = node.module.removeprefix("lakeshore").lstrip(".")
                for alias in node.names:
                    sub = f"{base}.{alias.name}" if base else alias.name
                    found.add(sub if sub in LAYER else (base or "__init__"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "lakeshore":
                    found.add("__init__")
                elif alias.name.startswith("lakeshore."):
                    found.add(alias.name.removeprefix("lakeshore."))
        elif _dynamic_import(node):
            name = node.args[0].value  # type: ignore[attr-defined]
            found.add(name.removeprefix("lakeshore").lstrip(".") or "__init__")
    found.discard(mod)
    return found


def _dynamic_import(node: ast.AST) -> bool:
    """``importlib.import_module("lakeshore...")`` or ``__import__("lakeshore...")``."""
    return (
        isinstance(node, ast.Call)
        and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__")
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and (node.args[0].value == "lakeshore" or node.args[0].value.startswith("lakeshore."))
    )


def _third_party(tree: ast.Module) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


MODULES = _modules()
LAYER = {m: i for m in MODULES if (i := _layer_of(m)) is not None}


def test_every_module_has_a_layer() -> None:
    assert set(MODULES) == set(LAYER), (
        "add the module (or its folder) to a layer here and in the docs"
    )


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_go_down_or_across(mod: str) -> None:
    up = sorted(
        f"{dep} ({LAYERS[LAYER[dep]][0]})"
        for dep in _imports(mod, MODULES[mod])
        if LAYER[dep] > LAYER[mod]
    )
    assert not up, f"{mod} ({LAYERS[LAYER[mod]][0]}) imports from a layer above it: {up}"


def test_the_import_graph_has_no_cycle() -> None:
    graph = {m: _imports(m, t) for m, t in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_clients_are_imported_by_their_one_module() -> None:
    wrong = {
        (mod, lib)
        for mod, tree in MODULES.items()
        for lib in _third_party(tree) & set(OWNERS)
        if mod not in OWNERS[lib]
    }
    assert not wrong


def test_no_relative_imports_and_no_private_names_of_other_modules() -> None:
    bad: list[str] = []
    for mod, tree in MODULES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    bad.append(f"{mod}: relative import")
                elif (node.module or "").startswith("lakeshore"):
                    bad += [
                        f"{mod}: imports {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")
                    ]
            elif (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) in ("getattr", "setattr", "hasattr")
                and len(node.args) >= 2
                and ast.unparse(node.args[0]) not in ("self", "cls")
                and isinstance(node.args[1], ast.Constant)
                and str(node.args[1].value).startswith("_")
                and not str(node.args[1].value).startswith("__")
            ):
                bad.append(f"{mod}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                text = ast.unparse(node)
                owner = node.value
                if node.attr.startswith("__") or (
                    isinstance(owner, ast.Name) and owner.id in ("self", "cls")
                ):
                    continue
                if text not in PRIVATE_OK:
                    bad.append(f"{mod}:{node.lineno}: {text}")
    assert not bad, bad


# docs/protocol.md, "Key layout": the one module that creates or rewrites each key. All of
# them are of the layer "the protocol on the store" (protocol/, streams/, and the doctor's
# probes of its own _doctor/ keys); only the stores below carry their writes out.
WRITERS = {"protocol.steps", "protocol.admission", "protocol.queue_record", "protocol.census"}
WRITERS |= {"protocol.idempotency", "protocol.scaler_lease", "protocol.schedules"}
WRITERS |= {"streams.journal", "streams.topic", "doctor"}  # doctor: its _doctor/ keys
DELETERS = {"protocol.steps", "protocol.tidy", "protocol.admission", "protocol.gc"}
DELETERS |= {"protocol.schedules"}
DELETERS |= {"streams.topic", "doctor"}


def _store_calls(tree: ast.Module) -> set[str]:
    """The store verbs a module calls that change what is stored."""
    verbs: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("put", "delete", "delete_many")
        ):
            receiver = ast.unparse(node.func.value)
            if receiver.split(".")[-1] in ("store", "_store", "s", "inner"):
                verbs.add(node.func.attr)
    return verbs


def test_only_the_owners_of_keys_write_to_the_store() -> None:
    wrong = []
    for mod, tree in MODULES.items():
        if mod == "store" or mod.startswith("store."):
            continue
        for verb in _store_calls(tree):
            allowed = WRITERS if verb == "put" else DELETERS
            if mod not in allowed:
                wrong.append(f"{mod} calls store.{verb}")
    assert not wrong, wrong
    assert {m for m, t in MODULES.items() if "put" in _store_calls(t)} == WRITERS
    protocol = next(i for i, (name, _) in enumerate(LAYERS) if name == "the protocol on the store")
    assert {LAYER[m] for m in WRITERS | DELETERS} == {protocol}
