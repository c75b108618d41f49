"""Imports point down (docs/development.md, "Package map"): services → libs, simulations → sdk.

The platform (services/, libs/, the CLI) loads a simulation by name through the registry
(entry points), never by import, so a user's own package runs on it exactly like a built-in one.
A service never imports another service (each runs as its own process and talks over NATS), and
`populace.core`, the protocol, imports no other part of Populace.

Pure: every file is parsed with `ast`, nothing is imported. Lazy imports inside functions count
too, and so does `importlib.import_module("…")` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _top_level_packages(parent: Path) -> set[str]:
    """The importable package names a folder of projects (simulations/, examples/…) provides."""
    names = set()
    for init in parent.rglob("__init__.py"):
        if ".venv" in init.parts:
            continue
        package = init.parent
        if not (package.parent / "__init__.py").exists():  # the top of a package, not a subpackage
            names.add(package.name)
    return names


SIMULATION_PACKAGES = _top_level_packages(ROOT / "simulations") | _top_level_packages(ROOT / "examples")
SERVICES = {p.name for p in (ROOT / "services").glob("*/populace/*") if (p / "__init__.py").exists()}
LIBS = {p.name for p in (ROOT / "libs").glob("*/populace/*") if (p / "__init__.py").exists()}

# (importing file relative to the root, imported module prefix): why the rule bends there.
# Keep this short: every entry is a debt, not a licence.
GATEWAY_BENCH = ("the gateway and vLLM benches measure the gateway's own dispatcher, routers and HTTP client in "
                 "process (the figure is the gateway's cost without NATS); the replicas they start come from "
                 "populace.replicas")
LLM_BENCH = ("the real-model bench's direct path sends each call as the gateway would (its request builder, seed and "
             "answer check), so that it measures the replicas on the very requests a round sends")
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("libs/bench/populace/bench/llm.py", "populace.gateway"): LLM_BENCH,
    ("libs/bench/populace/bench/gateway.py", "populace.gateway"): GATEWAY_BENCH,
    ("libs/bench/populace/bench/vllm.py", "populace.gateway"): GATEWAY_BENCH,
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in `path`, including lazy ones and import_module("literal")."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            if node.module == "populace":  # `from populace import gateway` names the package in the alias
                found.extend((node.lineno, f"populace.{alias.name}") for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
              and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


def _sources(*folders: str) -> list[Path]:
    files = []
    for folder in folders:
        files.extend(p for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts)
    return sorted(files)


def _part(module: str) -> str | None:
    """`populace.gateway.routing` -> `gateway`; None for anything outside the populace namespace."""
    head, _, rest = module.partition(".")
    return rest.split(".")[0] if head == "populace" and rest else None


def _violations(files: list[Path], forbidden) -> list[str]:
    out = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for line, module in _imports(path):
            why = forbidden(path, module)
            if why and not any(rel == f and (module == m or module.startswith(m + "."))
                               for f, m in EXCEPTIONS):
                out.append(f"{rel}:{line} imports {module}: {why}")
    return out


def _is_simulation(module: str) -> bool:
    return module.split(".")[0] in SIMULATION_PACKAGES


def test_the_rules_see_the_packages_they_guard():
    # a rule over an empty set passes for nothing: the layout it reads must be the real one
    assert {"populace_ratio_game", "dictator_game"} <= SIMULATION_PACKAGES
    assert {"gateway", "orchestrator", "agent_host", "recorder"} <= SERVICES
    assert {"core", "sdk", "client", "replicas"} <= LIBS
    assert any(m == "populace.core.contracts" for _, m in _imports(ROOT / "libs/sdk/populace/sdk/registry.py"))


def test_the_platform_imports_no_simulation():
    files = _sources("services", "libs", "src/populace/cli")

    def forbidden(path: Path, module: str) -> str | None:
        if _is_simulation(module):
            return "the platform loads simulations by name (populace.sdk.registry), never by import"
        return None

    assert _violations(files, forbidden) == []


def test_no_service_imports_another_service():
    problems = []
    for service in sorted(SERVICES):
        def forbidden(path: Path, module: str, me=service) -> str | None:
            part = _part(module)
            if part in SERVICES and part != me:
                return f"service {me} must talk to {part} over NATS, not import it"
            return None

        files = [p for p in _sources("services") if f"populace/{service}/" in p.as_posix()]
        assert files, service
        problems += _violations(files, forbidden)
    assert problems == []


def test_core_imports_nothing_above_it():
    def forbidden(path: Path, module: str) -> str | None:
        part = _part(module)
        if part is not None and part != "core":
            return "populace.core is the protocol: it imports no other part of Populace"
        return "populace.core imports no simulation" if _is_simulation(module) else None

    assert _violations(_sources("libs/core"), forbidden) == []


def test_libs_import_no_service():
    def forbidden(path: Path, module: str) -> str | None:
        part = _part(module)
        if part in SERVICES:
            return "libs are below services: a lib never imports one"
        return None

    assert _violations(_sources("libs"), forbidden) == []


def test_the_store_imports_nothing_above_it():
    # the store is below the recorder, the analysis and the client: it needs the protocol and the
    # population's rules, never the statistics, the SDK or a service (docs/architecture.md)
    def forbidden(path: Path, module: str) -> str | None:
        part = _part(module)
        if part is not None and part not in {"store", "core", "population"}:
            return "populace.store is below the recorder and the analysis: it imports only core and population"
        if module.split(".")[0] in {"scipy", "plotly"}:
            return "populace.store keeps the recorder's install free of the analysis' scipy and plotly"
        return None

    assert _sources("libs/store")
    assert _violations(_sources("libs/store"), forbidden) == []


def test_the_recorder_does_not_import_the_analysis():
    # its live reads load populace.analysis where installed (read_server.analysis, by a built name
    # this rule cannot see); nothing else in the service names it
    def forbidden(path: Path, module: str) -> str | None:
        return "the recorder depends on populace.store, not on the analysis" if _part(module) == "analysis" else None

    assert _violations([p for p in _sources("services") if "populace/recorder/" in p.as_posix()], forbidden) == []


def test_exceptions_are_still_needed():
    # an exception whose import is gone must be removed, so the list stays the true debt
    for rel, module in EXCEPTIONS:
        modules = [m for _, m in _imports(ROOT / rel)]
        assert any(m == module or m.startswith(module + ".") for m in modules), (rel, module)


def _facades() -> dict[str, Path]:
    """Packages whose `__init__` only gathers the names its own modules define (one module per
    family: populace.core.contracts, populace.core.bus, populace.analysis.queries): dotted name ->
    folder."""
    found = {}
    for init in (ROOT / "libs").glob("*/populace/**/__init__.py"):
        parts = init.parent.parts
        package = ".".join(parts[len(parts) - 1 - parts[::-1].index("populace"):])
        body = ast.parse(init.read_text(encoding="utf-8")).body
        own = [n for n in body if isinstance(n, ast.ImportFrom) and n.module != "__future__"]
        rest = [n for n in body if not isinstance(n, ast.ImportFrom)
                and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))  # the docstring
                and not (isinstance(n, ast.Assign) and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__all__"])]
        if own and not rest and all(n.level == 0 and (n.module or "").startswith(package + ".") for n in own):
            found[package] = init.parent
    return found


def test_a_facades_modules_import_each_other_not_the_facade():
    # `from populace.core.contracts import X` inside contracts/ would take X from the package while it
    # is being built: it works or not by the order of the facade's imports. Siblings are named
    # directly (`from populace.core.contracts.run_config import X`); a sibling module itself may be
    # imported through the package (`from populace.analysis.report import figures`).
    facades = _facades()
    assert {"populace.core.contracts", "populace.core.bus", "populace.analysis.queries"} <= set(facades)
    problems = []
    for package, folder in sorted(facades.items()):
        modules = {p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")}
        for path in sorted(folder.glob("*.py")):
            if path.name == "__init__.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == package:
                    names = [a.name for a in node.names if a.name not in modules]
                    if names:
                        problems.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno} takes {names} from "
                                        f"{package}, which re-exports them: import the module that defines them")
                elif isinstance(node, ast.Import) and any(a.name == package for a in node.names):
                    problems.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno} imports {package} itself")
    assert problems == []


# --- populace.core in layers: protocol (contracts, subjects …), settings, the bus, then the stores
# (runconfigs, checkpoints, objects …), each importing only what is below it, at the top of the file.
# A function-level import of another core module hides a loop until the function runs; one is
# allowed only to keep a start light (an optional heavy dependency), saying so with this marker.
LAZY_MARKER = "# lazy import:"
CORE = ROOT / "libs/core/populace/core"


def _core_modules(root: Path = CORE) -> dict[str, Path]:
    """Every module of the package at `root` by dotted name (`populace.core.bus.provisioning`)."""
    base = root.parent.parent  # the folder holding `populace/`
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(base).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` an import statement in module `here` loads (a name imported from a
    package that is a module of its own counts as that module)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the package `here` is in (or is)
            package = here.split(".") if is_package else here.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package) + (f".{base}" if base else "")
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    found = set()
    for name in names:
        while name and name not in modules:  # `import populace.core.bus.x` of a name: its module
            name = name.rpartition(".")[0]
        if name and name != here:
            found.add(name)
    return found


def _core_imports(modules: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, int, str, bool]]]:
    """(module -> the core modules it imports when it is imported, [(file, line, module, marked)] of
    every import of a core module inside a function). `if TYPE_CHECKING:` blocks import nothing."""
    graph: dict[str, set[str]] = {}
    lazy = []
    for name, path in modules.items():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        graph[name] = set()

        def visit(node: ast.AST, in_function: bool, name=name, path=path, lines=lines) -> None:
            if isinstance(node, ast.If) and _is_type_checking(node):
                for child in node.orelse:
                    visit(child, in_function)
                return
            if isinstance(node, ast.Import | ast.ImportFrom):
                targets = _targets(node, name, path.name == "__init__.py", modules)
                if in_function:
                    marked = any(LAZY_MARKER in lines[i] for i in (node.lineno - 2, node.lineno - 1) if i >= 0)
                    lazy.extend((path.as_posix().removeprefix(f"{ROOT.as_posix()}/"), node.lineno, t, marked) for t in sorted(targets))
                else:
                    graph[name] |= targets
            inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            for child in ast.iter_child_nodes(node):
                visit(child, inner)

        visit(ast.parse(source, filename=str(path)), False)
    return graph, lazy


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    import graphlib

    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return err.args[1]
    return None


def test_the_core_graph_sees_a_loop_and_an_unmarked_lazy_import(tmp_path):
    # the rule over a made-up package: a loop through a package's `__init__`, and a lazy import
    pkg = tmp_path / "populace" / "core"
    (pkg / "bus").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bus" / "__init__.py").write_text("from populace.core.bus.states import read\n")
    (pkg / "bus" / "states.py").write_text("from populace.core import configs\n\ndef read():\n    pass\n")
    (pkg / "configs.py").write_text("from populace.core.contracts import X\nfrom populace.core import bus\n")
    (pkg / "contracts.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from populace.core import configs\n"
                                      "def f():\n    from populace.core import bus\n"
                                      "def g():\n    # lazy import: why\n    from populace.core import configs\n")
    graph, lazy = _core_imports(_core_modules(pkg))
    assert set(_cycle(graph)) == {"populace.core.bus", "populace.core.bus.states", "populace.core.configs"}
    assert graph["populace.core.contracts"] == set()  # TYPE_CHECKING and function bodies: not at import
    assert [(line, module, marked) for _, line, module, marked in lazy] == [
        (5, "populace.core.bus", False), (8, "populace.core.configs", True)]


def test_the_core_imports_form_no_loop():
    graph, _ = _core_imports(_core_modules())
    assert {"populace.core.bus", "populace.core.runconfigs", "populace.core.settings"} <= set(graph)
    assert "populace.core.checkpoints" in graph["populace.core.runconfigs"]  # module-level imports are seen
    assert _cycle(graph) is None, "populace.core's modules import each other in a loop"


def test_the_core_hides_no_loop_in_a_function():
    _, lazy = _core_imports(_core_modules())
    unmarked = [f"{file}:{line} imports {module} inside a function" for file, line, module, marked in lazy
                if not marked]
    assert unmarked == [], (f"import it at the top (move what loops to the layer it belongs to), or, to keep a "
                            f"start light, say why with `{LAZY_MARKER} …` on the line above")
