"""The import rule of docs/design.md ("Layers"), checked on the source (every import, lazy ones too).

An allow-list: each top-level layer names the layers it may import, and nothing else passes.
scenarios → simulator (engines included), backends, analysis; backends → the simulator's pure
modules only (never its SimPy engines, never scenarios or analysis); analysis → the simulator's
pure modules only; the simulator → nothing above it. The pure modules are a list of their own,
and each of them imports only pure modules and neither SimPy, numba nor torch. No module
imports another module's ``_private`` names; the simulator imports neither torch nor the other
packages; the protocol core imports neither SimPy nor torch; no cycles between modules, not
even through imports inside functions. Inside scenarios the same holds between its parts (the
language, orchestration, advise, the command line, the evidence generators), and the command
line leaves torch, matplotlib, numba and SimPy to the functions that need them.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simulator", "backends", "scenarios", "analysis")

# The simulator's modules without time: no SimPy event loop, no compiled kernel (docs/design.md)
PURE = {f"ddlsim.simulator.{m}" for m in (
    "trace", "dataorder", "topology", "mixing", "compute", "catalog", "seeds", "files", "stats",
    "results_folder", "network_profile", "compression_bytes",
    "protocols", "protocols.catalog", "protocols.ps", "protocols.gossip", "protocols.gossip_rules",
    "protocols.cadence", "protocols.header", "protocols.local")} | {"ddlsim.simulator"}

# layer → {a layer it may import: None (any of its modules) or the only modules it may import};
# a module may always import the modules of its own layer
ALLOWED: dict[str, dict[str, set[str] | None]] = {
    "ddlsim": {"ddlsim.scenarios": None},  # the package root and ``python -m ddlsim``
    "ddlsim.scenarios": {"ddlsim.simulator": None, "ddlsim.backends": None, "ddlsim.analysis": None},
    "ddlsim.backends": {"ddlsim.simulator": PURE},
    "ddlsim.analysis": {"ddlsim.simulator": PURE},
    "ddlsim.simulator": {},
}

# the parts of scenarios/ (docs/design.md): part → its modules (a name with "/" is a package)
# and the other parts it may import
SCENARIO_PARTS: dict[str, tuple[str, ...]] = {
    "language": ("schema", "load", "hardware", "libraries", "bundled", "messages"),
    "orchestration": ("runner", "executors", "validate", "live_worker"),
    "advise": ("advise/",),
    "command line": ("cli/",),
    "evidence": ("published", "reproduce", "demodoc", "docgen"),
}
SCENARIO_ALLOWED: dict[str, set[str]] = {
    "language": set(),
    "orchestration": {"language"},
    "advise": {"language", "orchestration"},
    "command line": {"language", "orchestration", "advise"},
    "evidence": {"language", "orchestration", "command line"},
}
HEAVY = ("torch", "matplotlib", "numba", "simpy")  # what the command line starts without


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = ["ddlsim", *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return [n for n in ast.walk(tree) if id(n) not in skip]


def imports_of(source: str, name: str, is_package: bool) -> set[str]:
    """Every module the source of module ``name`` imports (absolute names), wherever the statement is."""
    package = name if is_package else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = _absolute(node, package)
            out.add(mod)
            for a in node.names:  # "from . import x" may name a module
                out.add(f"{mod}.{a.name}")
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """What the source of module ``name`` takes that is private to another module of ``modules``:
    ``from m import _x`` and ``m._x`` on a name an import bound to module ``m`` (as ``m._x``),
    and a private module (``_figure``) used from outside its own package (as the module's name).
    A module's own private names, and a private module's public names inside its package, are fine."""
    package = name if is_package else name.rsplit(".", 1)[0]
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name → the ddlsim module it is bound to
    out: set[str] = set()

    def hidden_module(mod: str) -> bool:  # a private module seen from outside its package
        parent, _, last = mod.rpartition(".")
        return mod in modules and _private(last) and parent != package

    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    bound[a.asname or a.name] = a.name
                    if hidden_module(a.name):
                        out.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            mod = _absolute(node, package)
            if hidden_module(mod):
                out.add(mod)
            for a in node.names:
                sub = f"{mod}.{a.name}"
                if sub in modules:  # "from package import module"
                    bound[a.asname or a.name] = sub
                    if hidden_module(sub):
                        out.add(sub)
                elif _private(a.name) and mod in modules and mod != name:
                    out.add(sub)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr)
                and bound.get(node.value.id, name) != name):
            out.add(f"{bound[node.value.id]}.{node.attr}")
    return out


def _files() -> dict[str, Path]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    files += [ROOT / "__init__.py", ROOT / "__main__.py"]
    return {_module_name(p): p for p in files}


MODULES = _files()


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    return imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")


def _graph() -> dict[str, set[str]]:
    return {name: {m for m in _imports(name) if m in MODULES and m != name} for name in MODULES}


GRAPH = _graph()


def _external(module: str) -> set[str]:
    return {m.split(".")[0] for m in _imports(module)}


def _layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in PACKAGES else "ddlsim"


def _allowed(importer: str, imported: str) -> bool:
    own, target = _layer(importer), _layer(imported)
    if target == own:
        return True
    if target not in ALLOWED[own]:
        return False
    only = ALLOWED[own][target]
    return only is None or imported in only


def test_the_graph_sees_every_package() -> None:
    for pkg in PACKAGES:
        assert any(m.startswith(f"ddlsim.{pkg}.") for m in GRAPH), pkg
    assert "ddlsim.simulator.protocols.ps" in GRAPH["ddlsim.simulator.ps"]  # a real edge is seen
    assert "ddlsim.scenarios.cli" in GRAPH["ddlsim.__main__"]
    assert PURE <= set(MODULES), sorted(PURE - set(MODULES))  # the list names modules that exist


def test_the_parser_sees_lazy_relative_and_aliased_imports() -> None:
    src = ("import os\n"
           "from . import trace as t\n"
           "from ..backends.replay import ReplayBackend\n"
           "def f():\n    from ..analysis.table import label\n    import numpy.linalg\n"
           "from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from ..scenarios import load\n")
    got = imports_of(src, "ddlsim.simulator.run", is_package=False)
    assert {"os", "ddlsim.simulator", "ddlsim.simulator.trace", "ddlsim.backends.replay",
            "ddlsim.backends.replay.ReplayBackend", "numpy.linalg", "ddlsim.analysis.table"} <= got
    assert not any(m.startswith("ddlsim.scenarios") for m in got)  # type-only imports are not edges
    assert imports_of("from .cli import main\n", "ddlsim.scenarios", is_package=True) >= {
        "ddlsim.scenarios.cli"}


def test_the_private_name_check_sees_each_form() -> None:
    mods = {"ddlsim.a", "ddlsim.a.b", "ddlsim.a._p", "ddlsim.c"}
    src = ("from .b import _x, y, __version__\n"
           "from . import b as bb\n"
           "import ddlsim.c as cc\n"
           "from ._p import helper\n"
           "def f():\n    return bb._z + cc._w + bb.y + cc.__name__\n")
    assert private_uses(src, "ddlsim.a.m", False, mods) == {"ddlsim.a.b._x", "ddlsim.a.b._z", "ddlsim.c._w"}
    # its own privates, and a private module's names inside its package, are fine
    assert private_uses("from .m import _own\n", "ddlsim.a.m", False, mods | {"ddlsim.a.m"}) == set()
    assert private_uses("from ._p import _h\n", "ddlsim.a.m", False, mods) == {"ddlsim.a._p._h"}
    # a private module from outside its package, in each spelling
    for src in ("from ..a._p import helper\n", "from ..a import _p\n", "import ddlsim.a._p\n"):
        assert private_uses(src, "ddlsim.c.m", False, mods) == {"ddlsim.a._p"}, src


def test_the_pure_list_is_the_one_docs_design_states() -> None:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    para = text.split("The **pure modules** are", 1)[1].split(";", 1)[0]
    named = {m.strip("/").replace("/", ".") for m in re.findall(r"`([a-z_/]+)`", para)}
    listed = {m.removeprefix("ddlsim.simulator.").split(".")[0] for m in PURE if m != "ddlsim.simulator"}
    assert named == listed


def test_the_allow_list_itself() -> None:
    assert _allowed("ddlsim.scenarios.cli", "ddlsim.simulator.run")
    assert _allowed("ddlsim.backends.replay", "ddlsim.simulator.trace")
    assert _allowed("ddlsim.backends.replay", "ddlsim.backends.optim")
    assert not _allowed("ddlsim.backends.replay", "ddlsim.simulator.ps")  # an engine
    assert not _allowed("ddlsim.backends.replay", "ddlsim.scenarios.load")
    assert not _allowed("ddlsim.backends.replay", "ddlsim.analysis.table")
    assert not _allowed("ddlsim.analysis.table", "ddlsim.backends.replay")
    assert not _allowed("ddlsim.simulator.trace", "ddlsim.backends.replay")
    assert not _allowed("ddlsim.simulator.run", "ddlsim.scenarios.load")


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


def test_layers_import_only_what_the_allow_list_names() -> None:
    bad = sorted((mod, d) for mod, deps in GRAPH.items() for d in deps if not _allowed(mod, d))
    assert bad == []


def test_the_pure_modules_are_pure() -> None:
    for mod in sorted(PURE):
        assert GRAPH[mod] <= PURE, (mod, sorted(GRAPH[mod] - PURE))
        assert not {"simpy", "numba", "torch"} & _external(mod), mod


def test_no_module_imports_another_modules_private_names() -> None:
    names = set(MODULES)
    bad = {}
    for mod, path in MODULES.items():
        uses = private_uses(path.read_text(encoding="utf-8"), mod, path.name == "__init__.py", names)
        if uses:
            bad[mod] = sorted(uses)
    assert bad == {}


def test_the_simulator_never_imports_torch_and_the_core_never_simpy() -> None:
    for mod in GRAPH:
        if mod.startswith("ddlsim.simulator"):
            assert "torch" not in _external(mod), mod
        if mod.startswith("ddlsim.simulator.protocols") or mod in ("ddlsim.simulator.trace",
                                                                   "ddlsim.simulator.compute"):
            assert not {"simpy", "torch"} & _external(mod), mod


def _scenario_part(module: str) -> str | None:
    """The part of scenarios/ a module belongs to (None: outside scenarios, or the package itself)."""
    parts = module.split(".")
    if parts[:2] != ["ddlsim", "scenarios"] or len(parts) < 3:
        return None
    for part, names in SCENARIO_PARTS.items():
        if parts[2] in names or f"{parts[2]}/" in names:
            return part
    raise AssertionError(f"{module}: in no part of scenarios/ (SCENARIO_PARTS, docs/design.md)")


def test_every_scenarios_module_is_in_one_part() -> None:
    mods = [m for m in MODULES if m.startswith("ddlsim.scenarios.")]
    assert {_scenario_part(m) for m in mods} == set(SCENARIO_PARTS)  # and none raises
    named = [n for names in SCENARIO_PARTS.values() for n in names]
    assert len(named) == len(set(named))
    for n in named:  # the table names modules and packages that exist
        assert (ROOT / "scenarios" / (n if n.endswith("/") else f"{n}.py")).exists(), n
    assert _scenario_part("ddlsim.scenarios.cli.entry") == "command line"
    assert _scenario_part("ddlsim.scenarios.advise.search") == "advise"
    assert _scenario_part("ddlsim.scenarios") is None and _scenario_part("ddlsim.simulator.run") is None


def test_the_scenario_parts_are_the_ones_docs_design_states() -> None:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    table = text.split("| part of `scenarios/` |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    parts, allowed = {}, {}
    for row in table:
        part, modules, may = (c.strip() for c in row.strip("|").split("|"))
        parts[part] = tuple(re.findall(r"`([a-z_/]+)`", modules))
        allowed[part] = set() if may == "—" else {m.strip() for m in may.split(",")}
    assert parts == SCENARIO_PARTS
    assert allowed == SCENARIO_ALLOWED


def test_scenario_parts_import_only_what_the_allow_list_names() -> None:
    bad = []
    for mod, deps in GRAPH.items():
        own = _scenario_part(mod)
        if own is None:
            continue
        for d in deps:
            target = _scenario_part(d)
            if target is not None and target != own and target not in SCENARIO_ALLOWED[own]:
                bad.append((mod, d))
    assert sorted(bad) == []


def _function_imports(module: str) -> set[str]:
    """The modules a module imports inside its functions (absolute names, without the names imported)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: set[str] = set()
    for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    out.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom):
                    out.add(_absolute(node, package))
    return out


def _loads(code: str) -> list[str]:
    """Which of :data:`HEAVY` a fresh interpreter has loaded after running ``code``."""
    probe = f"{code}\nimport sys\nprint('loaded:', *(h for h in {HEAVY!r} if h in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[-1].split()[1:]


def test_the_command_line_starts_without_torch_matplotlib_numba_or_simpy() -> None:
    # truth: sys.modules of a fresh interpreter that built the whole parser and ran two commands
    assert _loads("from ddlsim.scenarios.cli import entry\nentry.build_parser()\n"
                  "assert entry.main(['scenarios']) == 0 and entry.main(['hardware']) == 0") == []


def test_the_command_line_imports_inside_functions_only_what_loads_a_heavy_library() -> None:
    # every other import is at the top of its module (docs/design.md); a lazy one is justified
    # only by a fresh interpreter loading torch, matplotlib, numba or SimPy when it is imported
    lazy = {m for mod in MODULES if mod.startswith("ddlsim.scenarios.cli") for m in _function_imports(mod)}
    assert lazy and all(m.startswith("ddlsim.") for m in lazy), sorted(lazy)
    light = [m for m in sorted(lazy) if not _loads(f"import {m}")]
    assert light == []
