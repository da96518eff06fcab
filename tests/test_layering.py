"""The import direction of the code (docs/architecture.md, "Layers"), read from the source with ast:
no import cycles inside edgellama/service/, and the HTTP front end reaches the service only through its
narrow interface (service/api.py), never the server, the scheduler or the LLM."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICE = ROOT / "edgellama" / "service"
HTTP_FORBIDDEN = ("edgellama.service.server", "edgellama.service.scheduler", "edgellama.llm")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    """name is a module or package of the source tree."""
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """Every edgellama module path imports, wherever the import statement is: at module level, inside a
    function, or under `if TYPE_CHECKING:` (a type-only import is a dependency all the same)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:  # `from pkg import submodule` depends on the submodule
                sub = f"{mod}.{a.name}"
                out.add(sub if _is_module(sub) else mod)
    return {m for m in out if m == "edgellama" or m.startswith("edgellama.")}


def _service_graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(SERVICE.rglob("*.py"))}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected component of more than one
    module, and each module that imports itself (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                found.append(_cycle_path(graph, set(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_path(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A concrete cycle inside one strongly connected component, for the failure message."""
    start = min(comp)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in comp)
        back = [w for w in nxt if w in seen]
        if back:
            return path[path.index(back[0]):] + [back[0]]
        path.append(nxt[0])
        seen.add(nxt[0])


def test_graph_reads_every_kind_of_import() -> None:
    """The reader sees module-level, function-level and TYPE_CHECKING imports, absolute and relative."""
    graph = _service_graph()
    assert "edgellama.service.protocol" in graph["edgellama.service.http.fields"]
    assert "edgellama.service.http.fields" in graph["edgellama.service.http.connection"]
    assert "edgellama.service.scheduler" in graph["edgellama.service.server"]
    toy = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert sorted(map(tuple, _cycles(toy))) == [("a", "b", "c", "a"), ("d", "d")]


def test_no_import_cycles_in_service() -> None:
    """Counting type-only and function-level imports: a cycle hidden behind TYPE_CHECKING or a late import
    is still two modules that cannot be understood (or changed) one without the other."""
    cycles = _cycles(_service_graph())
    assert not cycles, "import cycles in edgellama/service/: " + "; ".join(" -> ".join(c) for c in cycles)


def test_http_reaches_the_service_only_through_its_interface() -> None:
    """edgellama/service/http/ and everything it imports inside edgellama/service/ never import the server,
    the scheduler or the LLM: the routes see the service through service/api.py."""
    graph = _service_graph()
    todo = [m for m in graph if m.startswith("edgellama.service.http")]
    reached: set[str] = set()
    while todo:
        m = todo.pop()
        if m in reached:
            continue
        reached.add(m)
        todo += [w for w in graph[m] if w in graph and w not in HTTP_FORBIDDEN]
    bad = sorted(f"{m} imports {w}" for m in reached for w in graph[m]
                 if any(w == f or w.startswith(f + ".") for f in HTTP_FORBIDDEN))
    assert not bad, "the HTTP front end reaches past service/api.py: " + "; ".join(bad)


def test_no_import_cycle_anywhere_in_the_package() -> None:
    """Issue 32's cycles (completion <-> llm, scheduler <-> slot_request, serial_port <-> serial_text, the
    HTTP loop through server.py) and any new one: every module of edgellama/, imports of the package root
    aside (edgellama/__init__.py re-exports the API and imports submodules lazily)."""
    graph = {_module_name(p): _imports(p) - {"edgellama"} for p in sorted((ROOT / "edgellama").rglob("*.py"))}
    assert {"edgellama.completion", "edgellama.llm", "edgellama.generation"} <= set(graph)
    assert _cycles(graph) == []


def test_the_service_imports_nothing_of_the_commands() -> None:
    """The service loads models from load_options.LoadOptions, never from a command's flags: no module of
    edgellama/service/ imports edgellama/cli/ (docs/architecture.md, the layers)."""
    bad = sorted(f"{m} imports {w}" for m, deps in _service_graph().items() for w in deps
                 if w == "edgellama.cli" or w.startswith("edgellama.cli."))
    assert not bad, "; ".join(bad)
