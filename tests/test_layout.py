"""harness/ by pipeline stage: few top-level modules, and no import circle between its parts.

A part is a package directly under harness/ (experiment, execute, store, ...) or a top-level
module (cli, registry, errors, ...). An import inside a function counts as much as one at the
top: it is still a dependency, only a later one."""
from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"
MAX_TOP_MODULES = 8


def part(module: str) -> str:
    """harness.execute.worker -> execute; harness.cli -> cli; harness -> harness."""
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else "harness"


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(HARNESS.rglob("*.py")):
        bits = p.relative_to(HARNESS.parent).with_suffix("").parts
        out[".".join(bits[:-1] if bits[-1] == "__init__" else bits)] = p
    return out


def imported(module: str, path: Path, known: dict) -> set[str]:
    """The harness modules `module` imports, anywhere in its body."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".")[: len(module.split(".")) - node.level + is_pkg]
                base = ".".join(pkg + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                     for a in node.names]
        for n in names:
            while n not in known and "." in n:
                n = n.rsplit(".", 1)[0]
            if n in known and n != module and n.startswith("harness"):
                out.add(n)
    return out


def part_graph() -> dict[tuple[str, str], list[str]]:
    known = modules()
    edges: dict[tuple[str, str], list[str]] = {}
    for m, p in known.items():
        for d in imported(m, p, known):
            a, b = part(m), part(d)
            if a != b and "harness" not in (a, b):
                edges.setdefault((a, b), []).append(f"{m} -> {d}")
    return edges


def cycles(edges) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    found, seen = [], set()

    def walk(node, path):
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cyc = path[path.index(nxt):]
                key = frozenset(cyc)
                if key not in seen:
                    seen.add(key)
                    found.append(cyc + [nxt])
            elif len(path) < 12:
                walk(nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, [start])
    return found


def test_at_most_eight_modules_directly_in_harness():
    top = sorted(p.name for p in HARNESS.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules directly in harness/: {top}"


def test_no_import_circle_between_the_parts_of_harness():
    edges = part_graph()
    found = cycles(edges)
    lines = []
    for cyc in found:
        lines.append(" -> ".join(cyc))
        for a, b in zip(cyc, cyc[1:]):
            lines.append(f"    {a} -> {b}: {', '.join(edges[(a, b)][:3])}")
    assert not found, "import circles:\n" + "\n".join(lines)


def tangles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan): every import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
            visit(v)
    return out


def test_no_import_circle_between_the_modules_of_harness():
    """Inside a part too: a plugin (an executor, a profiler) joins a registry without the base
    importing it back, and the CLI entry of a process is not the module its passes live in."""
    known = modules()
    graph = {m: imported(m, p, known) for m, p in known.items()}
    found = tangles(graph)
    assert not found, "import circles between modules:\n" + "\n".join(
        " <-> ".join(g) for g in found)


def test_the_checker_finds_a_circle():
    assert tangles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert tangles({"a": {"b"}, "b": {"c"}}) == []
    assert cycles({("a", "b"): [], ("b", "c"): [], ("c", "a"): []}) == [["a", "b", "c", "a"]]
    assert cycles({("a", "b"): [], ("b", "c"): []}) == []
    assert part("harness.execute.worker") == "execute" and part("harness.cli") == "cli"


# bottom first: a part imports only parts before it (docs/design.md, "Where things are")
LAYERS = ["errors", "values", "op_checks", "tuning", "registry", "op_card", "experiment", "store",
          "profilers", "machine", "analysis", "execute", "present", "cli", "__main__"]


def test_every_import_points_down_the_layers():
    rank = {p: i for i, p in enumerate(LAYERS)}
    edges = part_graph()
    unknown = sorted({p for e in edges for p in e} - set(rank))
    assert not unknown, f"parts missing from LAYERS (place them in tests/test_layout.py): {unknown}"
    up = [f"{a} -> {b}: {', '.join(v[:3])}" for (a, b), v in sorted(edges.items())
          if rank[a] <= rank[b]]
    assert not up, "imports pointing up the layers:\n" + "\n".join(up)


def test_the_old_flat_names_still_import_as_the_moved_modules():
    """User code written before the stage packages (a `new-op` test: `from harness.correctness
    import check_impl`) keeps working: the old name is the moved module itself."""
    import importlib

    import harness

    for old, new in harness.MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
        assert importlib.import_module(new).__spec__.name == new
    from harness.correctness import check_impl
    from harness.executors.gpus import GpuExecutor

    assert check_impl.__module__ == "harness.execute.correctness"
    assert GpuExecutor.__module__ == "harness.execute.executors.gpus"
