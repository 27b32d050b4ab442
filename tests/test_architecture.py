"""The package layout's rules, checked from the source: no import cycle between packages, and
data flowing one way (request → scheduler → batch → runner → model → speculative step → output).

Imports inside functions count too: a lazy import is still a dependency. Imports under
`if TYPE_CHECKING:` do not: they exist for annotations only and never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "blockspec"


def unit_of(module: str) -> str | None:
    """`blockspec.engine.runner` → "engine"; `blockspec.sampling` → "sampling"."""
    parts = module.split(".")
    if parts[0] != "blockspec" or len(parts) < 2:
        return None
    return parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        src = unit_of(module_name(path))
        if src is None:
            continue
        deps = {unit_of(m) for m in imported_modules(path)} - {None, src}
        graph.setdefault(src, set()).update(deps)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_between_packages():
    assert find_cycle(package_graph()) is None, f"import cycle: {' → '.join(find_cycle(package_graph()))}"


def test_cycle_finder_finds_a_cycle():
    """Negative control: the check above can fail."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# Lower rooms never reach up the data flow.
FORBIDDEN = {
    "kv": {"attention", "models", "layers", "engine", "speculative", "batch", "server"},
    "attention": {"models", "layers", "engine", "speculative", "batch", "server"},
    "layers": {"attention", "models", "engine", "speculative", "batch", "server"},
    "models": {"engine", "speculative", "batch", "server"},
    "batch": {"engine", "speculative", "models", "server"},
    "speculative": {"engine", "server", "cli", "bench"},
    "parallel": {"engine", "speculative", "batch", "server", "cli", "bench"},
    "engine": {"server", "cli", "bench"},
    "sampling": {"engine", "speculative", "models", "attention", "kv", "server"},
}


@pytest.mark.parametrize("unit", sorted(FORBIDDEN))
def test_data_flows_one_way(unit):
    graph = package_graph()
    assert unit in graph, f"no package or module named {unit}"
    bad = graph[unit] & FORBIDDEN[unit]
    assert not bad, f"blockspec.{unit} imports {sorted(bad)}, which sit downstream of it"
