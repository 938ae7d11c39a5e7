"""The package's layout: each part imports only the parts below it, and each says what it is.

The parts, lowest first. A part may import the parts before it in `LAYERS`, never one
after it, so the import graph has no cycle and a part can be read (and tested) with
only the parts below it in mind.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

import strategykit

PACKAGE = pathlib.Path(strategykit.__file__).parent
LAYERS = ["launcher", "background", "cluster", "pinning", "made", "metrics", "batches", "xla",
          "upstream", "strategy", "data", "batchnorm", "callbacks", "equivalence", "cli"]


def _parts():
    return sorted(path.name for path in PACKAGE.iterdir()
                  if (path / "__init__.py").is_file())


def _imported_parts(path: pathlib.Path) -> set[str]:
    """The parts of strategykit that the module at `path` imports, its own included."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            pieces = name.split(".")
            if pieces[0] == "strategykit" and len(pieces) > 1 and pieces[1] in LAYERS:
                parts.add(pieces[1])
    return parts


def test_every_part_is_a_layer_and_the_top_level_holds_only_the_api():
    assert _parts() == sorted(LAYERS)
    assert sorted(path.name for path in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]


@pytest.mark.parametrize("part", LAYERS)
def test_a_part_imports_only_the_parts_below_it(part):
    allowed = set(LAYERS[:LAYERS.index(part) + 1])
    for module in sorted((PACKAGE / part).rglob("*.py")):
        upward = _imported_parts(module) - allowed
        assert not upward, f"{module.relative_to(PACKAGE)} imports {sorted(upward)}, " \
            f"above {part!r} in {LAYERS}"


@pytest.mark.parametrize("part", LAYERS)
def test_each_part_opens_with_a_docstring_of_what_it_holds(part):
    docstring = ast.get_docstring(ast.parse((PACKAGE / part / "__init__.py").read_text()))
    assert docstring and len(docstring.splitlines()) >= 3, part


def _top_level_imports(path: pathlib.Path) -> set[str]:
    """The modules that the module at `path` imports when it is imported (not inside
    functions): the first name of each, `strategykit.<part>` for strategykit's."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return {".".join(name.split(".")[:2]) if name.startswith("strategykit.")
            else name.split(".")[0] for name in names}


def test_the_launcher_imports_only_the_standard_library_and_itself():
    for module in sorted((PACKAGE / "launcher").glob("*.py")):
        outside = {name for name in _top_level_imports(module)
                   if name not in sys.stdlib_module_names and name != "strategykit.launcher"}
        assert not outside, f"launcher/{module.name} imports {sorted(outside)}: the " \
            "launcher is standard library only (it must start without TensorFlow)"


def test_importing_every_launcher_module_imports_neither_tensorflow_nor_keras():
    # As `strategykit launch` runs: the package registered without its __init__ (which
    # makes `sk.*` and imports TensorFlow), every launcher module imported.
    modules = sorted(path.stem for path in (PACKAGE / "launcher").glob("*.py"))
    code = ("import importlib, sys, strategykit_console\n"
            "strategykit_console.import_package_without_tensorflow()\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module('strategykit.launcher.' + name)\n"
            "print(sorted(m for m in ('tensorflow', 'keras', 'numpy') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_no_part_holds_more_than_a_fifth_of_the_package():
    def lines(paths) -> int:
        return sum(len(path.read_text().splitlines()) for path in paths)

    total = lines(PACKAGE.rglob("*.py"))
    shares = {part: lines((PACKAGE / part).rglob("*.py")) / total for part in LAYERS}
    assert max(shares.values()) <= 0.2, {part: f"{share:.1%}" for part, share in shares.items()}


def test_no_two_modules_share_a_name():
    # Twins (cluster/slurm.py beside cluster/environments/slurm.py) split one concept in two.
    names = [path.name for path in PACKAGE.rglob("*.py")
             if path.name not in ("__init__.py", "__main__.py")]
    assert sorted(name for name in set(names) if names.count(name) > 1) == []
