"""No import circles among kvsim's and real's modules, counting every import in the source
(type-only ones under ``TYPE_CHECKING`` and imports inside functions too): a circle makes
the import order matter and the two modules one unit in all but name. A shared types
module, or moving the one name both need, breaks one."""

from __future__ import annotations

import ast
from pathlib import Path

from support import ROOT

#: circles still in the tree, each to be broken by the files' owners; the test fails when
#: a new one appears, and when one listed here is gone (then drop it from this list)
KNOWN: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.glob("kvsim/**/*.py")) + sorted(ROOT.glob("real/*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path: Path, module: str, known: dict[str, Path]) -> set[str]:
    """The known modules ``module`` imports (``from a import b`` counts ``a.b`` when it is
    a module), its own package's ``__init__`` aside."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                keep = len(module.split(".")) - node.level + (path.name == "__init__.py")
                base = ".".join(module.split(".")[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                found.add(name)
    return found


def import_circles() -> set[frozenset[str]]:
    """The strongly connected groups of two or more modules (Tarjan's algorithm)."""
    known = _modules()
    graph = {m: _imports(p, m, known) for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = {stack.pop()}
            while v not in group:
                group.add(stack.pop())
            if len(group) > 1:
                circles.add(frozenset(group))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_no_new_import_circle_and_the_known_ones_still_listed() -> None:
    circles = import_circles()
    new = [sorted(c) for c in circles - KNOWN]
    assert not new, f"new import circle(s): {new}"
    gone = [sorted(c) for c in KNOWN - circles]
    assert not gone, f"broken, drop from KNOWN: {gone}"


def test_the_check_sees_a_circle(tmp_path: Path, monkeypatch) -> None:
    import test_import_cycles as me

    pkg = tmp_path / "kvsim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from kvsim.b import x\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import kvsim.a\n"
    )
    monkeypatch.setattr(me, "ROOT", tmp_path)
    assert me.import_circles() == {frozenset({"kvsim.a", "kvsim.b"})}
