"""The package's boundaries: one subpackage per layer of the design, each importing only the layers below it,
the method free of modules and frameworks, and the kernels reached only through their dispatcher."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "surgeon"
KERNELS = PACKAGE.parent / "surgeon_kernels"
# Bottom to top: a module may import its own layer and those before it. The base modules (errors, settings,
# file helpers) sit below every layer; the facade `surgeon/__init__.py` and `__main__` above them all.
LAYERS = ("base", "method", "models", "scale", "pruning", "recovery", "export", "app", "integrations")
BASE = ("errors", "fields", "config", "methods", "io")
# What the method's mathematics must not know: modules, Hugging Face, the process group.
NOT_IN_METHOD = ("torch.nn", "torch.distributed", "transformers", "tqdm")
MAX_LINES = 450


def modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "data" not in path.relative_to(PACKAGE).parts[:1])


def layer_of(module: str) -> str | None:
    """The layer of a dotted `surgeon...` module name (None: the facade)."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in ("__init__", "__main__"):
        return None
    return "base" if parts[0] in BASE else parts[0]


def name_of(path: Path) -> str:
    return ".".join(("surgeon", *path.relative_to(PACKAGE).with_suffix("").parts))


def imports(path: Path) -> list[str]:
    """Every module `path` imports, functions' imports included; `from surgeon.x import y` gives surgeon.x.y when
    y is a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names
                      if (PACKAGE.parent / (node.module + "." + alias.name).replace(".", "/")).with_suffix(".py")
                      .exists()]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def test_every_module_sits_in_a_layer():
    assert {path.parent.name for path in modules() if path.parent != PACKAGE} == set(LAYERS[1:])
    assert sorted(path.stem for path in PACKAGE.glob("*.py")) == sorted((*BASE, "__init__", "__main__"))


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path in modules():
        here = layer_of(name_of(path))
        if here is None:
            continue
        for module in imports(path):
            there = layer_of(module) if module.startswith("surgeon.") else None
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                upward.append(f"{name_of(path)} -> {module}")
    assert upward == []


def test_the_method_knows_no_modules_frameworks_or_ranks():
    leaks = {name_of(path): found for path in (PACKAGE / "method").glob("*.py")
             if (found := [m for m in imports(path) if m.startswith(NOT_IN_METHOD)])}
    assert leaks == {}


def test_no_module_is_longer_than_the_limit():
    assert {name_of(path): n for path in modules() if (n := len(path.read_text().splitlines())) > MAX_LINES} == {}


def test_the_check_sees_upward_and_function_level_imports(tmp_path):
    """The checks above read what they claim to: an import inside a function, and `from package import module`."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from surgeon.app import cli\n    import torch.nn\n")
    assert imports(source) == ["surgeon.app", "surgeon.app.cli", "torch.nn"]
    assert layer_of("surgeon.app.cli") == "app" and layer_of("surgeon.config") == "base"
    assert layer_of("surgeon") is None


def method_branches(path: Path) -> list[str]:
    """The comparisons in `path` that decide by a method's name: `x.method` or a method's name compared."""
    from surgeon.methods import METHODS

    def by_name(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "method") or \
            (isinstance(node, ast.Constant) and node.value in METHODS)

    return [f"{path.name}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Compare) and any(by_name(side) for side in (node.left, *node.comparators))]


def test_what_a_method_does_is_read_from_the_method_table_not_its_name():
    """Only the table (`surgeon.methods`) and the settings that look a method up in it (`surgeon.config`) compare
    methods' names; everything else reads the method's entry."""
    offending = {name_of(path): found for path in modules()
                 if name_of(path) not in ("surgeon.config", "surgeon.methods") and (found := method_branches(path))}
    assert offending == {}


def test_the_method_check_sees_a_branch_on_a_name(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("if config.method in ('wanda',):\n    pass\nif kept == 'reap':\n    pass\nok = spec.needs_a\n")
    assert method_branches(source) == ["probe.py:1", "probe.py:3"]


# What a measurement reads like: a time, a speed ratio, a commit hash (`surgeon_kernels/measured.json` holds those
# the library takes, RESULTS the rest)
MEASUREMENT = re.compile(r"\d(?:\.\d+)? ?(?:ms|µs)\b|\d\.\d+ s\b|\d(?:\.\d+)?× (?:faster|slower)|\b(?=[0-9a-f]*[a-f])"
                         r"(?=[0-9a-f]*\d)[0-9a-f]{7}\b")


def test_library_code_carries_no_measurements():
    found = {name_of(path): hits for path in [*modules(), *KERNELS.rglob("*.py")]
             if (hits := MEASUREMENT.findall(path.read_text()))}
    assert found == {}
    assert MEASUREMENT.findall("1.82 vs 1.62 ms, 2× faster, at 6f3412a, 4.29 s") == ["1.62 ms", "2× faster", "6f3412a",
                                                                                  "4.29 s"]


def test_every_measured_choice_names_evidence_that_exists():
    """measured.json's result files are in the repository and its kernels' GPU runs are commits of its history."""
    import subprocess

    from surgeon_kernels.ops import MEASURED, RUN_ON_CUDA

    root = PACKAGE.parent
    files = [*MEASURED["h100_shot"]["sources"], MEASURED["h100_parts"]["curvature_parts_source"],
             MEASURED["h100_parts"]["sweep_source"], MEASURED["plan_headroom"]["source"]]
    assert [path for path in files if not (root / path).is_file()] == []
    for commit in set(RUN_ON_CUDA.values()):
        assert subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root).returncode == 0, commit


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
    offending = {name_of(path): found for path in modules()
                 if (found := [m for m in kernel_imports(path) if m != "surgeon_kernels.ops"])}
    assert offending == {}
    assert kernel_imports(PACKAGE / "method" / "updates.py") == ["surgeon_kernels.ops"]  # sees `from x import ops`


@pytest.mark.slow
def test_the_configuration_stops_at_the_shot_loop():
    """Below `prune` the whole `PruneConfig` reaches the shot loop, the settings check and the module that makes
    each phase its own settings, and no further: at most half the files, visits and returns of the layout before
    the phases had their own settings (6 files, 13 visits, 7 returns, by `tests._config_path`)."""
    from tests._config_path import config_path

    path = config_path()
    assert set(path["walk"]) <= {"surgeon/pruning/shots.py", "surgeon/pruning/phases.py", "surgeon/scale/settings.py"}
    assert path["visits"] <= 6 and path["returns"] <= 3, path["walk"]
