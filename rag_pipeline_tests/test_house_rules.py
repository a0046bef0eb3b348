"""The rules of the house, read from the source tree: SQL runs only in the store, no import circle and no import
that climbs back up a layer, a package root of entry modules and capability packages, tests that share helpers
through conftest only, and a README whose paths exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "rag_pipeline"

# The capability packages from the bottom up: a module may import its own package and those before it, never one
# after it. The order is the pipeline's: sources → parsing → text → store → embedding → retrieval → stages → …
LAYERS = ("config", "extras", "domain", "workers", "endpoints", "sources", "parsing", "text", "store", "embedding",
          "retrieval", "stages", "lifecycle", "defs", "definitions", "cli")
ENTRY_MODULES = {"__init__.py", "cli.py", "config.py", "definitions.py", "extras.py", "py.typed"}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every import of a package module by a package module, function-local ones included: a circle broken by an
    import inside a function is still a circle. `from package import submodule` is an import of the submodule."""
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def test_sql_is_executed_only_under_rag_pipeline_store():
    # The README's reviewer check: grep -rlE "\.(execute|executemany|copy)\(" rag_pipeline
    executes = re.compile(r"\.(execute|executemany|copy)\(")
    offenders = sorted(
        str(path.relative_to(REPO)) for path in PACKAGE.rglob("*.py")
        if executes.search(path.read_text()) and PACKAGE / "store" not in path.parents
    )
    assert offenders == []


def test_the_package_has_no_import_circle():
    assert _cycles(_imports(_modules())) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_climbs_back_up_a_layer():
    modules = _modules()
    climbing = sorted(
        f"{source} imports {target}" for source, targets in _imports(modules).items() for target in targets
        if _layer(source) != "__init__" and LAYERS.index(_layer(target)) > LAYERS.index(_layer(source))
    )
    assert climbing == []


def test_the_package_root_holds_entry_modules_and_capability_packages():
    root = {path.name for path in PACKAGE.iterdir() if path.name != "__pycache__"}
    packages = {name for name in root if (PACKAGE / name / "__init__.py").exists()}
    assert root - packages == ENTRY_MODULES
    assert packages <= set(LAYERS) and {p + ".py" for p in set(LAYERS) - packages} <= ENTRY_MODULES


def test_no_test_imports_another_test_modules_names():
    offenders = sorted(
        f"{path.name}: {line.strip()}" for path in (REPO / "rag_pipeline_tests").glob("*.py")
        for line in path.read_text().splitlines()
        if re.match(r"\s*from rag_pipeline_tests\.test_\w+ import", line)
        or re.match(r"\s*from rag_pipeline_tests\.\w+ import .*\b_\w+", line)
    )
    assert offenders == []


def test_every_path_the_readme_and_docs_name_exists():
    """A file, a folder or a module named in the README or docs/ names one that exists."""
    named = re.compile(r"(?<![\w/.-])((?:rag_pipeline|rag_pipeline_tests|sql|bench|scripts|torture_set|docs|golden)"
                       r"/[\w./-]*[\w/])")
    missing = set()
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for path in named.findall(page.read_text()):
            if "*" not in path and not (REPO / path).exists():
                missing.add(f"{page.relative_to(REPO)}: {path}")
    assert sorted(missing) == []
