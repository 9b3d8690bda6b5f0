"""The layering of docs/architecture.md, checked on the source: no module imports a layer
above its own, and the two modes (cache-mode replay and the timed engine) never import each
other; both sit on the same manager and policies."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import ROOT

#: package or top-level module -> layer; a module may import only its own layer or lower ones
LAYERS: dict[str, int] = {
    # 0: vocabulary: core values and errors, specs, options, reporting
    "core": 0,
    "specs": 0,
    "options": 0,
    "report": 0,
    # 1: workloads and rules
    "traces": 1,
    "workloads": 1,
    "policies": 1,
    # 2: the CPU tier and the GPU block pool, and the bridges to vLLM
    "manager": 2,
    "integrations": 2,
    "tiering": 2,
    # 3: the two modes, siblings
    "cachemode": 3,
    "engine": 3,
    # 4: jobs for users: the Python API, sweeps, figures, and the real backend
    "api": 4,
    "sweeps": 4,
    "accuracy": 4,
    "plots": 4,
    "real": 4,
    # 5: the command line and the package's public face
    "cli": 5,
    "__main__": 5,
    "kvsim": 5,
}
SIBLINGS = {("cachemode", "engine"), ("engine", "cachemode")}


def _unit(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "real":
        return "real"
    return parts[1] if len(parts) > 1 else "kvsim"


def _imports(path: Path, module: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[
                    : len(module.split(".")) - node.level + (path.name == "__init__.py")
                ]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {n for n in found if n.split(".")[0] in ("kvsim", "real")}


def _modules() -> list[tuple[Path, str]]:
    paths = sorted(ROOT.glob("kvsim/**/*.py")) + sorted(ROOT.glob("real/*.py"))
    out = []
    for p in paths:
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((p, ".".join(parts)))
    return out


def test_every_unit_has_a_layer() -> None:
    units = {_unit(m) for _, m in _modules()}
    assert units <= set(LAYERS), (
        f"give these a layer in LAYERS and docs/architecture.md: {units - set(LAYERS)}"
    )


@pytest.mark.parametrize(
    ("path", "module"), _modules(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_no_module_imports_a_layer_above_it(path: Path, module: str) -> None:
    mine = _unit(module)
    for target in _imports(path, module):
        theirs = _unit(target)
        assert LAYERS[theirs] <= LAYERS[mine], (
            f"{module} (layer {LAYERS[mine]}) imports {target} (layer {LAYERS[theirs]})"
        )
        assert (mine, theirs) not in SIBLINGS, f"{module} imports its sibling mode {target}"


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from kvsim.api import replay\nimport kvsim.cli\n")
    assert _imports(bad, "kvsim.manager.offload") == {"kvsim.api", "kvsim.cli"}
