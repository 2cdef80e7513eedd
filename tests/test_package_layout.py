"""No module imports another package's private names (its ``_x`` modules or ``_y`` names)."""

from __future__ import annotations

import ast
from pathlib import Path

import fastrollout

ROOT = Path(fastrollout.__file__).parent
# The native module is private to the wheel, not to one package.
SHARED = {"fastrollout._core"}


def _package_of(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1])


def _owner(module: str, name: str) -> str | None:
    """The package that owns ``module``'s private part (or ``name``), None if all public."""
    parts = module.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_"):
            return ".".join(parts[:i])
    if name.startswith("_") and not name.startswith("__"):
        is_package = (ROOT.parent.joinpath(*parts) / "__init__.py").exists()
        return module if is_package else ".".join(parts[:-1])
    return None


def test_no_private_names_imported_across_packages():
    crossing = []
    for path in sorted(ROOT.rglob("*.py")):
        here = _package_of(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "fastrollout"
            ):
                continue
            module = node.module or ""
            for alias in node.names:
                if module in SHARED or f"{module}.{alias.name}" in SHARED:
                    continue
                owner = _owner(module, alias.name)
                if owner is not None and not (here == owner or here.startswith(owner + ".")):
                    crossing.append(f"{path.relative_to(ROOT)}:{node.lineno} {module}.{alias.name}")
    assert not crossing, crossing
