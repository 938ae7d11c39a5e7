"""Every file and module that the code and the docs name exists.

Docstrings, comments and pages name files (`tests/upstream/test_upstream.py`,
`examples/kubernetes/indexed-job.yaml`) and modules (`strategykit.cluster.roles`);
when a file moves, what named it must move with it, or a reader is sent nowhere.
"""

import importlib
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[2]
TEXTS = sorted([*ROOT.glob("*.py"), *ROOT.glob("*.md"), *ROOT.glob("*.toml"),
                *(path for folder in ("strategykit", "tests", "benchmarks", "examples", "docs",
                                      "notebooks", ".ci")
                  for path in (ROOT / folder).rglob("*")
                  if path.suffix in (".py", ".md", ".ipynb", ".toml", ".yml", ".yaml", "")
                  and path.is_file() and ".ipynb_checkpoints" not in path.parts)])
PATH = re.compile(r"(?<![\w/.-])((?:strategykit|tests|benchmarks|examples|docs|notebooks)"
                  r"/[\w/.-]*\w/?)(?![\w{])")
"""A path in the repository: a file (`tests/cli/test_cli.py`) or a folder (`examples/`)."""
MODULE = re.compile(r"(?<![\w./-])(strategykit(?:\.\w+)+)")
"""A module of strategykit, or an attribute of one (`strategykit.cluster.roles.is_chief`)."""
FILE_SUFFIXES = {".py", ".md", ".ipynb", ".yaml", ".yml", ".toml", ".json", ".sh", ".txt",
                 ".png", ".cfg"}


def _exists(path: str) -> bool:
    return (ROOT / path).exists()


def _resolves(name: str) -> bool:
    """Whether `strategykit.a.b.c` is a module, or an attribute of one."""
    parts = name.split(".")
    if "__main__" in parts:  # importing it would run it
        return importlib.util.find_spec(name) is not None
    for end in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for attribute in parts[end:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def _named_paths(text: str) -> set[str]:
    """The files and folders `text` names: a name with a file's suffix, or ending in `/`
    (`strategykit/preemption` alone may be a key, `376 examples/s` a unit)."""
    return {name for name in PATH.findall(text)
            if name.endswith("/") or pathlib.PurePath(name).suffix in FILE_SUFFIXES}


def _named_modules(text: str) -> set[str]:
    """The modules `text` names (not files such as `strategykit.json`)."""
    return {name for name in MODULE.findall(text)
            if "." + name.rpartition(".")[2] not in FILE_SUFFIXES}


@pytest.mark.parametrize("path", [path for path in TEXTS if path != pathlib.Path(__file__)],
                         ids=lambda path: str(path.relative_to(ROOT)))
def test_every_file_and_module_named_exists(path):
    text = path.read_text(errors="replace")
    missing = sorted(name for name in _named_paths(text) if not _exists(name))
    missing += sorted(name for name in _named_modules(text) if not _resolves(name))
    assert not missing, f"{path.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_check_sees_a_moved_file_and_a_moved_module():
    text = ("see tests/test_describe.py, examples/gone/ and "
            "`strategykit.cluster.slurm.resolver` (writes strategykit.json, 376 examples/s)")
    assert _named_paths(text) == {"tests/test_describe.py", "examples/gone/"}
    assert not _exists("tests/test_describe.py") and not _exists("examples/gone/")
    assert _named_modules(text) == {"strategykit.cluster.slurm.resolver"}
    assert not _resolves("strategykit.cluster.slurm.resolver")
