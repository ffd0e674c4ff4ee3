"""The package's module graph: no import cycles, and no function-level import without a reason.

Edges are every import a module makes, at module level or inside a function (only
``if TYPE_CHECKING:`` blocks, which never run, are left out): a late import hides a
dependency, it does not remove it, so it may defer a heavy or optional dependency but
not close a cycle. An import of a package's submodule is an edge to that submodule
only: Python runs the package's ``__init__`` first, and a package that imports its own
submodules is not a cycle between modules.

A function-level import of a ``mage_rl`` module must earn its place: the module it
imports loads, at module level (itself or through what it imports), a third-party
package the importing module does not (``torch`` behind ``mage --help``, ``fastapi``
behind the trainer). Otherwise the import belongs at the top of the file, where a reader
sees the dependency.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from mage_rl.layers import upward

PACKAGE = Path(__file__).parents[1] / "mage_rl"


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            elif not (isinstance(child, ast.If) and _is_type_checking(child)):
                visit(child)

    visit(tree)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the ``mage_rl`` modules it imports, anywhere in its code."""
    modules = _modules(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]  # fmt: skip
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules, or ``None``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_import_points_down() -> None:
    found = sorted(upward(import_graph()))
    assert not found, "these imports point up a layer: " + "; ".join(
        f"{a} -> {b}" for a, b in found
    )


def test_the_layer_check_catches_a_planted_upward_import(tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "mage_rl"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    rps = copy / "envs" / "rps.py"
    rps.write_text(rps.read_text() + "\n\ndef _late():\n    from mage_rl.rl import trainer\n")
    found = upward(import_graph(copy))
    assert found == {("mage_rl.envs.rps", "mage_rl.rl.trainer")}


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# Packages whose names load on first use (a module-level ``__getattr__``): what importing
# a name from them costs is not visible statically, so such imports may stay late.
LAZY_PACKAGES = {"mage_rl", "mage_rl.policy", "mage_rl.serve"}


def _resolve(node: ast.Import | ast.ImportFrom, name: str, path: Path, modules: dict) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def _third_party_at_top() -> tuple[dict[str, set[str]], dict[str, set[str]], list[tuple]]:
    """(module-level mage_rl edges, module-level third-party packages, function-level
    imports as (module, line, targets)) of every module."""
    modules = _modules()
    edges: dict[str, set[str]] = {}
    packages: dict[str, set[str]] = {}
    late: list[tuple[str, int, list[str]]] = []
    for name, path in modules.items():
        edges[name], packages[name] = set(), set()
        # Importing a module runs its packages' __init__ first.
        parts = name.split(".")
        edges[name].update(".".join(parts[:i]) for i in range(1, len(parts)))

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    targets = _resolve(child, name, path, modules)  # noqa: B023
                    if in_function:
                        late.append((name, child.lineno, targets))  # noqa: B023
                        continue
                    for target in targets:
                        if target in modules:
                            edges[name].add(target)  # noqa: B023
                        elif (root := target.split(".")[0]) and root not in sys.stdlib_module_names:
                            packages[name].add(root)  # noqa: B023
                elif not (isinstance(child, ast.If) and _is_type_checking(child)):
                    nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                    visit(child, in_function or nested)

        visit(ast.parse(path.read_text()), False)
    return edges, packages, late


def _loaded(module: str, edges: dict[str, set[str]], packages: dict[str, set[str]]) -> set[str]:
    """Third-party packages that importing ``module`` loads at module level."""
    seen, todo = {module}, [module]
    while todo:
        for nxt in edges[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return set().union(*(packages[m] for m in seen)) - {"__future__"}


def test_function_level_imports_defer_a_dependency() -> None:
    edges, packages, late = _third_party_at_top()
    idle = []
    for name, line, targets in late:
        own = [t for t in targets if t in edges and t not in LAZY_PACKAGES]
        if not own or len(own) < len(targets):
            continue  # a third-party or lazily resolved import
        mine = _loaded(name, edges, packages)
        if not set().union(*(_loaded(t, edges, packages) for t in own)) - mine:
            idle.append(f"{name}:{line} {', '.join(own)}")
    assert not idle, "move these imports to the top of their file: " + "; ".join(idle)
