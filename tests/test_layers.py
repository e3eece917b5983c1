"""The layers of docs/architecture.md, held against the code's imports.

A module may import from its own layer and the layers below it, never above; no two
packages import each other, even through others; and budget/ imports only the standard
library and gevent. The map must place every module, so a new package is put somewhere on
purpose. Imports are read from the source (type-only ones included), nothing is run.
"""

from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bottom first. The first prefix that matches a module places it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("budget", ("budget",)),
    ("kernel", ("homeserver.core", "homeserver.config", "homeserver.logs", "homeserver.metrics")),
    ("storage", ("homeserver.storage",)),
    ("federation transport", ("homeserver.federation",)),
    ("accounts", ("homeserver.accounts",)),
    ("rooms", ("homeserver.rooms",)),
    (
        "directory, media, sync, e2ee",
        (
            "homeserver.directory",
            "homeserver.media",
            "homeserver.sync",
            "homeserver.e2ee",
            "homeserver.admin",
            "homeserver.appservice",
        ),
    ),
    ("http", ("homeserver.http",)),
    ("composition root", ("homeserver.runtime",)),
    ("api", ("homeserver.api",)),
    ("processes", ("homeserver.processes", "app")),
]
BUDGET_MAY_IMPORT = ("gevent",)


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module, or the module a name was imported from
    line: int


def layer_of(module: str) -> int | None:
    if module == "homeserver":  # the package's own __init__: its version, nothing more
        return 1
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def package_of(module: str) -> str:
    """`homeserver.rooms.service` -> `homeserver.rooms`; top-level modules stand alone."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "homeserver" and len(parts) > 1 else module


def module_name(root: str, path: str) -> str:
    name = os.path.relpath(path, root)[: -len(".py")].replace(os.sep, ".")
    return name.removesuffix(".__init__")


def read_imports(root: str) -> tuple[set[str], list[Import]]:
    """Every module under `root` (homeserver/, budget/ and app.py), and what each imports."""
    paths = [os.path.join(root, "app.py")] if os.path.exists(os.path.join(root, "app.py")) else []
    for top in ("homeserver", "budget"):
        for folder, _, files in os.walk(os.path.join(root, top)):
            paths += [os.path.join(folder, f) for f in files if f.endswith(".py")]
    modules = {module_name(root, p) for p in paths}
    imports: list[Import] = []
    for path in paths:
        me = module_name(root, path)
        is_package = path.endswith("__init__.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            for target in _targets(node, me, is_package, modules):
                imports.append(Import(me, target, node.lineno))
    return modules, imports


def _targets(node: ast.AST, me: str, is_package: bool, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = me.split(".") if is_package else me.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    # `from homeserver.http import server` imports the module homeserver.http.server.
    submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in modules]
    return submodules or [module]


def upward_imports(imports: list[Import]) -> list[str]:
    found = []
    for imp in imports:
        source, target = layer_of(imp.source), layer_of(imp.target)
        if source is not None and target is not None and target > source:
            found.append(
                f"{imp.source}:{imp.line} ({LAYERS[source][0]}) imports {imp.target} "
                f"({LAYERS[target][0]})"
            )
    return found


def package_cycles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected groups of more than one package in the package import graph."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        a, b = package_of(imp.source), package_of(imp.target)
        if a != b and layer_of(b) is not None:
            graph.setdefault(a, set()).add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def budget_escapes(imports: list[Import]) -> list[str]:
    allowed = set(sys.stdlib_module_names) | set(BUDGET_MAY_IMPORT) | {"budget", "__future__"}
    return [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in imports
        if imp.source.split(".")[0] == "budget" and imp.target.split(".")[0] not in allowed
    ]


def unplaced(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if layer_of(m) is None)


# --- the checks, on this repository -------------------------------------------------------


def test_no_module_imports_a_layer_above_its_own():
    _, imports = read_imports(REPO)
    assert upward_imports(imports) == []


def test_no_cycle_between_packages():
    _, imports = read_imports(REPO)
    assert package_cycles(imports) == []


def test_budget_imports_only_the_standard_library_and_gevent():
    _, imports = read_imports(REPO)
    assert budget_escapes(imports) == []


def test_every_module_has_a_layer():
    modules, _ = read_imports(REPO)
    assert unplaced(modules) == []


# --- the checks can fail: each on a small tree with one wrong import ------------------------


def _tree(tmp_path, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_a_store_importing_a_service_is_caught(tmp_path):
    root = _tree(
        tmp_path,
        {
            "homeserver/__init__.py": "",
            "homeserver/storage/__init__.py": "",
            "homeserver/storage/rooms.py": "from homeserver.rooms.service import RoomService\n",
            "homeserver/rooms/__init__.py": "",
            "homeserver/rooms/service.py": "from ..storage import rooms\n",
        },
    )
    _, imports = read_imports(root)
    assert upward_imports(imports) == [
        "homeserver.storage.rooms:1 (storage) imports homeserver.rooms.service (rooms)"
    ]
    assert package_cycles(imports) == [["homeserver.rooms", "homeserver.storage"]]


def test_budget_importing_the_homeserver_or_flask_is_caught(tmp_path):
    root = _tree(
        tmp_path,
        {
            "budget/__init__.py": "import gevent\nimport flask\n",
            "budget/inflight.py": "from homeserver.core.errors import MatrixError\n",
        },
    )
    _, imports = read_imports(root)
    assert sorted(budget_escapes(imports)) == [
        "budget.inflight:1 imports homeserver.core.errors",
        "budget:2 imports flask",
    ]


def test_a_package_outside_the_map_is_caught(tmp_path):
    root = _tree(
        tmp_path,
        {
            "homeserver/__init__.py": "",
            "homeserver/sender/__init__.py": "",
            "homeserver/sender/queue.py": "",
            "homeserver/core/clock.py": "",
        },
    )
    modules, _ = read_imports(root)
    assert unplaced(modules) == ["homeserver.sender", "homeserver.sender.queue"]
