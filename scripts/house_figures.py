"""Size figures of the package, for tracking its shape over time.

    .venv/bin/python scripts/house_figures.py [REPO_DIR]

Prints, as JSON: lines of Python under ``mage_rl/``, the ten largest modules and how many
modules pass 500 lines (a size is tracked here, not enforced: modules split by concept), leaf keys of a training config,
flags of every ``mage`` sub-command, imports of ``mage_rl`` modules made inside function
bodies, the import cycles among ``mage_rl`` modules when those count (strongly connected
groups of more than one module), the imports that point up a layer of
:mod:`mage_rl.layers` (and the package pairs they join), the files git tracks under ``docs/``, ``docs/results`` and ``studies/`` (with their bytes), and
every tracked file and byte. Reads the source only (the
AST); nothing is imported from ``REPO_DIR`` except the config and the parser, which are
read from the installed package.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, module: str) -> tuple[set[str], set[str]]:
    """(module-level, function-level) imports of ``mage_rl`` modules."""
    top: set[str] = set()
    inner: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # annotations only: never imported at run time
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module.split(".")[: len(module.split(".")) - child.level + 1]
                    base = ".".join([*package[:-1], base] if base else package[:-1])
                # "from mage_rl import runtime" imports the submodule; the package
                # itself counts only when a name comes from it.
                names = [f"{base}.{a.name}" for a in child.names]
                names += [f"{base}#" + a.name for a in child.names]
            for name in names:
                if name.startswith("mage_rl"):
                    (inner if in_function else top).add(name)
            visit(child, nested)

    visit(tree, False)
    return top, inner


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def figures(repo: Path) -> dict[str, object]:
    package = repo / "mage_rl"
    files = sorted(package.rglob("*.py"))
    modules = {_module_name(repo, f): f for f in files}
    lines = sum(len(f.read_text().splitlines()) for f in files)
    graph: dict[str, set[str]] = {}
    inner_count = 0

    def resolve(names: set[str]) -> set[str]:
        out = set()
        for name in names:
            base, sep, attr = name.partition("#")
            if not sep:
                out.add(name)
            elif f"{base}.{attr}" not in modules:
                out.add(base)  # a name defined in the module ``base``
        return {n for n in out if n in modules}

    for name, path in modules.items():
        top, inner = (resolve(s) for s in _imports(ast.parse(path.read_text()), name))
        inner_count += len(inner - top)
        graph[name] = {i for i in top | inner if i != name}
    tracked = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, text=True, check=True
    )
    paths = [Path(p) for p in tracked.stdout.split("\0") if p]
    docs = [p for p in paths if p.parts[0] == "docs"]
    studies = [p for p in paths if p.parts[0] == "studies"]
    present = [p for p in paths if (repo / p).is_file()]
    from mage_rl.layers import upward

    sizes = sorted(((len(f.read_text().splitlines()), n) for n, f in modules.items()), reverse=True)
    return {
        "lines_in_mage_rl": lines,
        "modules": len(files),
        "largest_modules": {name: n for n, name in sizes[:10]},
        "modules_over_500_lines": sum(n > 500 for n, _ in sizes),
        "function_level_imports_of_mage_rl_modules": inner_count,
        "import_cycles": [len(c) for c in _cycles(graph)],
        "upward_imports": len(upward(graph)),
        "upward_package_pairs": len(
            {(a.split(".")[:2][-1], b.split(".")[:2][-1]) for a, b in upward(graph)}
        ),
        "files_under_docs": len(docs),
        "files_under_docs_results": sum("results" in p.parts for p in docs),
        "files_under_studies": len(studies),
        "bytes_under_docs_results": sum(
            (repo / p).stat().st_size for p in present if p.parts[:2] == ("docs", "results")
        ),
        "bytes_under_studies": sum(
            (repo / p).stat().st_size for p in present if p.parts[0] == "studies"
        ),
        "tracked_files": len(paths),
        "tracked_bytes": sum((repo / p).stat().st_size for p in present),
    }


def config_and_cli() -> dict[str, int]:
    from mage_rl.cli import build_parser
    from mage_rl.config import TrainConfig

    def leaves(data: object) -> int:
        if isinstance(data, dict) and data:
            return sum(leaves(v) for v in data.values())
        return 1

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = 0
    for command in sub.choices.values():
        stack = [command]
        while stack:
            p = stack.pop()
            for action in p._actions:
                if isinstance(action, argparse._SubParsersAction):
                    stack += list(action.choices.values())
                elif action.option_strings and action.dest != "help":
                    flags += 1
    dumped = TrainConfig.model_validate({"policy": {"model": "tiny"}}).model_dump()
    return {"train_config_leaf_keys": leaves(dumped), "cli_flags": flags}


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    print(json.dumps({**figures(root), **config_and_cli()}, indent=2))
