"""The package's layers and its import graph, read from the source with `ast`.

Every module of `graph_durable` belongs to one layer (the longest prefix in `LAYERS`
that names it); a module may import modules of its own layer and of the layers below,
never above, and no two modules may import each other, directly or around a circle.
`tests/test_layering.py` checks it; `docs/architecture.md` carries the listing this
module prints:

    python -m tests.layers            # print the listing
    python -m tests.layers --write    # rewrite it in docs/architecture.md

What counts as an import: every `import` and `from ... import` statement anywhere in a
module, function-level ones included (they run when called), relative ones resolved.
`from package import name` is an import of `package.name` when that is a module, else of
`package`. Not counted: imports under `if TYPE_CHECKING:` (they never run), names loaded
by `importlib.import_module` (the package root's lazy `__getattr__`), and the implicit
import of a module's parent packages.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "graph_durable"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("cli, demo, testing", ("graph_durable", "graph_durable.cli", "graph_durable.demo",
                            "graph_durable.testing")),
    ("operators", ("graph_durable.operators", "graph_durable.audit",
                   "graph_durable.notebook")),
    ("nodes", ("graph_durable.nodes",)),
    ("checkpointers", ("graph_durable.checkpointers",)),
    ("core model", ("graph_durable._display", "graph_durable._extras", "graph_durable._sha256",
                    "graph_durable.canonical",
                    "graph_durable._langgraph", "graph_durable.durability",
                    "graph_durable.errors", "graph_durable.faults", "graph_durable.flow",
                    "graph_durable.leases", "graph_durable.ledger", "graph_durable.policy",
                    "graph_durable.secrets", "graph_durable.telemetry")),
]
"""Top to bottom. The package root (`graph_durable/__init__.py`, lazy re-exports of the
public names) is named alone in the top layer: `graph_durable.x` for any other `x` is
placed by its own prefix. `graph_durable.audit` and `graph_durable.notebook` are
deprecated re-exports of their `graph_durable.operators` modules."""

BEGIN = "<!-- import graph: begin (python -m tests.layers --write) -->"
END = "<!-- import graph: end -->"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package under `root`, by dotted name (a package by its own)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, but those under `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for other in node.orelse:
                yield from _statements(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _statements(node)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module `name` (at `path`) imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _statements(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """`{module: modules it imports}` over the package under `root`."""
    found = modules(root)
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def layer_of(module: str) -> int | None:
    """The index in `LAYERS` (0 = top) of `module`'s layer, or `None` if none names it."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact_only = prefix == PACKAGE
            if module == prefix or (not exact_only and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    return None if best is None else best[0]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def problems(root: Path = ROOT) -> list[str]:
    """Every module no layer names, every import that runs up, every circle."""
    edges = graph(root)
    found = [f"{module}: in no layer (add it to tests/layers.py LAYERS)"
             for module in sorted(edges) if layer_of(module) is None]
    for module in sorted(edges):
        mine = layer_of(module)
        for target in sorted(edges[module]):
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs < mine:
                found.append(f"{module} ({LAYERS[mine][0]}) imports {target} "
                             f"({LAYERS[theirs][0]}): an import that runs up")
    for group in circles(edges):
        ties = [f"{a} -> {b}" for a in group for b in sorted(edges[a]) if b in group]
        found.append(f"circle of {len(group)} modules: {', '.join(ties)}")
    return found


def _short(module: str) -> str:
    return module.removeprefix(PACKAGE + ".") if module != PACKAGE else "(package root)"


def listing(root: Path = ROOT) -> str:
    """The import graph by layer, as Markdown: each module and what it imports."""
    edges = graph(root)
    lines = []
    for index, (title, _) in enumerate(LAYERS):
        members = sorted(m for m in edges if layer_of(m) == index)
        lines += [f"**{title}**", "", "```text"]
        for module in members:
            targets = ", ".join(_short(t) for t in sorted(edges[module]))
            lines.append(_short(module) + (f" -> {targets}" if targets else ""))
        lines += ["```", ""]
    return "\n".join(lines).rstrip() + "\n"


def _write(page: Path) -> None:
    text = page.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    page.write_text(f"{head}{BEGIN}\n\n{listing()}\n{END}{tail}")


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        _write(ROOT / "docs" / "architecture.md")
    else:
        print(listing(), end="")
        for problem in problems():
            print("PROBLEM:", problem, file=sys.stderr)
