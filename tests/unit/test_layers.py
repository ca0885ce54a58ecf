"""The architecture holds: dependencies point one way, down the layer table of DESIGN.md §7.

Every import in the package (also the ones inside functions) is parsed. A module may import
only modules of its own layer or of a layer above it; the module graph has no cycle; the
readers (``analysis``) never import the engine and never upload. A new module must be given
a layer here, so the table stays the map of the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "flor"

# DESIGN.md §7, top to bottom: each row may import the rows above it.
LAYERS: list[tuple[str, ...]] = [
    ("flor._version", "flor.errors", "flor.findings"),
    ("flor._fmt", "flor._files", "flor.malloc"),
    ("flor.source",),
    ("flor.redact",),
    ("flor.placement",),
    ("flor.settings",),
    ("flor.plan", "flor.policy", "flor.verify"),
    ("flor.logs",),
    ("flor.store",),
    ("flor.state", "flor.leaves", "flor.watch"),
    ("flor.runinfo", "flor.hparams"),
    ("flor.export",),
    ("flor.engine",),
    ("flor.runtime",),
    ("flor.api", "flor.hooks", "flor"),
    ("flor.integrations",),
    ("flor.analysis",),
    ("flor.launch",),
    ("flor.cli", "flor.__main__"),
]

# The one sanctioned exception: flor.dataframe is the API's door to the readers. analysis
# never imports the API or the engine back (FORBIDDEN), so this edge closes no cycle.
ALLOWED = {("flor.api", "flor.analysis")}

# Layers that must not import one another even though the table would allow it.
FORBIDDEN = {
    "flor.analysis": ("flor.engine", "flor.runtime", "flor.api", "flor.launch", "flor.cli", "flor.store.s3",
                      "flor.store.sync", "flor.state"),
    # exporters read the store and write to trackers: never the engine's state or the store's uploads
    "flor.export": ("flor.state", "flor.watch", "flor.store.s3", "flor.store.sync"),
}

# Pure layers: no torch, so settings and plans load in a launcher without it.
NO_TORCH = ("flor._version", "flor.errors", "flor.findings", "flor._fmt", "flor.malloc", "flor.source", "flor.redact", "flor.settings",
            "flor.plan", "flor.policy")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    best, index = "", -1
    for i, row in enumerate(LAYERS):
        for prefix in row:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, index = prefix, i
    return index


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> set[str]:
    """The flor modules ``module`` imports, anywhere in its body."""
    path = MODULES[module]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            # `from . import hparams` imports the submodule flor.hparams
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # flor.store.blobs.BlobStore -> flor.store.blobs
                name = name.rpartition(".")[0]
            if name.startswith("flor") and name != module:
                found.add(name)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_has_a_layer() -> None:
    missing = [m for m in MODULES if _layer(m) < 0]
    assert missing == [], f"give these modules a row in LAYERS (and DESIGN.md §7): {missing}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_up_the_table(module: str) -> None:
    mine = _layer(module)
    upward = sorted(t for t in GRAPH[module] if _layer(t) > mine and (module, t) not in ALLOWED)
    assert upward == [], f"{module} (layer {mine}) imports lower layers: {upward}"
    for prefix, banned in FORBIDDEN.items():
        if module == prefix or module.startswith(prefix + "."):
            bad = sorted(t for t in GRAPH[module] if any(t == b or t.startswith(b + ".") for b in banned))
            assert bad == [], f"{module} must not import {bad}"


def test_no_import_cycles() -> None:
    # Package __init__ modules import their children to re-export them; a child that imports
    # a sibling through the package is an edge to the sibling, not a cycle through __init__.
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if MODULES[nxt].name == "__init__.py" and node.startswith(nxt + "."):
                continue  # a child importing its own package's namespace
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m, [])
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if any(m == p or m.startswith(p + ".") for p in NO_TORCH)))
def test_pure_layers_import_no_torch(module: str) -> None:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert "torch" not in names


def test_the_checker_sees_a_violation() -> None:
    # guard against a checker that passes everything: the engine really does import the store
    assert any(t.startswith("flor.store") for t in GRAPH["flor.engine.record"])
    assert _layer("flor.engine.record") > _layer("flor.store.blobs")


def private_imports(module: str) -> list[str]:
    """Private names (``_name``) ``module`` takes from another flor module: ``from .x import _y``
    or ``as _z`` (``from .x import y as _y`` keeps a public name private: that is fine)."""
    path = MODULES[module]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and _resolve(module, path, node).startswith("flor"):
            found += [f"{_resolve(module, path, node)}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")
                      and f"{_resolve(module, path, node)}.{a.name}" not in MODULES]  # a private module is fine
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_another_modules_private_names(module: str) -> None:
    assert private_imports(module) == [], f"{module} imports private names: make them public in their module"


def test_the_private_import_check_sees_one(tmp_path: Path) -> None:
    MODULES["flor.fake_private"] = fake = tmp_path / "fake_private.py"
    try:
        fake.write_text("from .leaves import _zone, qualname\nfrom .leaves import _zone as _z\n")
        assert private_imports("flor.fake_private") == ["flor.leaves._zone", "flor.leaves._zone"]
    finally:
        del MODULES["flor.fake_private"]
