"""The import rule of docs/design-notes.md, checked on the source (every import, lazy ones too).

scenarios → simulator, backends, analysis; backends → the simulator's pure modules, never its
SimPy engines or scenarios; analysis → the simulator's pure modules; the simulator imports
neither torch nor the other packages; the protocol core imports neither SimPy nor torch;
no cycles between modules, not even through imports inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simulator", "backends", "scenarios", "analysis")
ENGINES = {"ddlsim.simulator.ps", "ddlsim.simulator.gossip", "ddlsim.simulator.run",
           "ddlsim.simulator.events", "ddlsim.simulator.resources"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = ["ddlsim", *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names), wherever the import statement is."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            for a in node.names:  # "from . import x" may name a module
                out.add(f"{mod}.{a.name}")
    return out


def _graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path) if m in modules and m != name}
    return graph


GRAPH = _graph()


def _external(module: str) -> set[str]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if _module_name(p) == module]
    return {m.split(".")[0] for m in _imports(files[0])}


def test_the_graph_sees_every_package() -> None:
    for pkg in PACKAGES:
        assert any(m.startswith(f"ddlsim.{pkg}.") for m in GRAPH), pkg
    assert "ddlsim.simulator.protocols.ps" in GRAPH["ddlsim.simulator.ps"]  # a real edge is seen


def test_no_import_cycles() -> None:
    # Tarjan's strongly connected components: every component must be a single module
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []


def test_layers() -> None:
    bad = []
    for mod, deps in GRAPH.items():
        for d in deps:
            if mod.startswith("ddlsim.simulator.") and not d.startswith("ddlsim.simulator"):
                bad.append((mod, d))
            if mod.startswith(("ddlsim.backends.", "ddlsim.analysis.")) and (
                    d.startswith("ddlsim.scenarios") or d in ENGINES):
                bad.append((mod, d))
            if mod.startswith("ddlsim.analysis.") and d.startswith("ddlsim.backends"):
                bad.append((mod, d))
    assert bad == []


def test_the_simulator_never_imports_torch_and_the_core_never_simpy() -> None:
    for mod in GRAPH:
        if mod.startswith("ddlsim.simulator"):
            assert "torch" not in _external(mod), mod
        if mod.startswith("ddlsim.simulator.protocols") or mod in ("ddlsim.simulator.trace",
                                                                   "ddlsim.simulator.compute"):
            assert not {"simpy", "torch"} & _external(mod), mod
