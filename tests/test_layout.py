"""The package's boundaries: the algorithm reaches kernels only through the dispatcher."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "surgeon"


def kernel_imports(path: Path) -> list[str]:
    """Modules of `surgeon_kernels` that `path` imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("surgeon_kernels"):
            if node.module == "surgeon_kernels":
                found += [f"surgeon_kernels.{alias.name}" for alias in node.names]
            else:
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("surgeon_kernels")]
    return found


def test_surgeon_reaches_kernels_only_through_ops():
    offending = {path.name: imports for path in sorted(PACKAGE.glob("*.py"))
                 if (imports := [m for m in kernel_imports(path) if m != "surgeon_kernels.ops"])}
    assert offending == {}
    assert kernel_imports(PACKAGE / "updates.py") == ["surgeon_kernels.ops"]  # the check sees `from x import ops`
