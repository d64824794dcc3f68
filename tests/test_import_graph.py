"""The package's layering, checked on the source: imports only go down, and csp/ has no circle.

cli -> commands -> analysis -> csp -> heuristics | executor -> schedule -> instances -> costmodel
-> (stop, threads, jit, highs) -> errors. Function-local imports count too: a lazy import that goes back up is
still a circle (imports for type hints only, under ``if TYPE_CHECKING:``, do not). ``kvsched/__init__.py`` (the public API, loaded lazily) is the one exception.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "kvsched"

#: Layer of each top-level part of the package: a module may import its own layer or lower ones.
LAYERS = {
    "cli": 9,
    "commands": 8,
    "analysis": 7,
    "csp": 6,
    "heuristics": 5,
    "executor": 5,
    "schedule": 4,
    "instances": 3,
    "costmodel": 2,
    "stop": 1,
    "threads": 1,
    "jit": 1,
    "lazy": 1,
    "highs": 1,
    "errors": 0,
}
#: Parts of one layer that must not import each other.
SIBLINGS = {("heuristics", "executor"), ("executor", "heuristics")}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    # Imports under ``if TYPE_CHECKING:`` are for type hints only and never run.
    typing_only = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for sub in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("kvsched"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            if mod.startswith("kvsched"):
                found.add(mod)
                found.update(f"{mod}.{a.name}" for a in node.names)
    return found


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


MODULES = _modules()


def _resolve(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def test_every_part_has_a_layer():
    parts = {_part(m) for m in MODULES} - {None}
    assert parts <= set(LAYERS), f"no layer for {sorted(parts - set(LAYERS))}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "kvsched"))
def test_imports_only_go_down(module):
    src = _part(module)
    bad = []
    for target in _imports(module, MODULES[module]):
        dst = _part(target)
        if dst is None or dst == src:
            continue
        if dst in LAYERS and (LAYERS[dst] > LAYERS[src] or (src, dst) in SIBLINGS):
            bad.append(target)
    assert not bad, f"{module} imports up the layers: {sorted(bad)}"


def _graph(prefix: str) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        if not module.startswith(prefix):
            continue
        edges = set()
        for target in _imports(module, path):
            resolved = _resolve(target)
            if (
                resolved
                and resolved.startswith(prefix)
                and resolved != module
                and not module.startswith(resolved + ".")
            ):
                edges.add(resolved)
        graph[module] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("part", ["csp", "schedule", "heuristics", "costmodel", "executor", "analysis"])
def test_no_import_circle(part):
    # A package's __init__ re-exporting its modules is not a circle: edges into __init__ are skipped.
    graph = _graph(f"kvsched.{part}")
    inits = {m for m in graph if MODULES[m].name == "__init__.py"}
    graph = {m: {t for t in e if t not in inits} for m, e in graph.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_csp_file_over_800_lines():
    long = {p.name: n for p in (ROOT / "csp").rglob("*.py") if (n := len(p.read_text().splitlines())) > 800}
    assert not long, long


def test_the_cli_parser_does_not_import_the_solvers():
    # Every command pays for what its parser imports before its clock can do anything useful.
    import subprocess
    import sys

    code = (
        "import sys; from kvsched.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('kvsched.csp', 'kvsched.analysis', 'numba', 'ortools', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    from kvsched.analysis.regret import AGAINST
    from kvsched.commands.analysis import AGAINST as SPELLED

    assert SPELLED == AGAINST
