"""The documentation site builds without a warning, documents every public name, and every
docstring example runs.

The site is built once per test session (`mkdocs build --strict`, the build that
.github/workflows/docs.yml publishes), in a fresh process, into a temporary folder; the
docstring examples run in one more process (`pytest --doctest-modules strategykit`, forked
from the test process's fork server).
"""

import fcntl
import json
import os
import pathlib
import re
import subprocess
import sys
import zlib

import pytest

import strategykit
from strategykit import callbacks

from workers import run_processes

ROOT = pathlib.Path(__file__).parents[2]
BUILD_TIMEOUT = 600


def _environment() -> dict:
    env = dict(os.environ)
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's banner about its successor, not ours
    env.pop("PYTEST_ADDOPTS", None)
    return env


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built with --strict: ({"returncode", "stderr"} of the build, its folder).

    Built once per session: under pytest-xdist the first worker that needs it builds it
    into the session's shared temporary folder, and the others wait for it and read it.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        site_dir = tmp_path_factory.mktemp("site")
        return _build(site_dir), site_dir
    shared = tmp_path_factory.getbasetemp().parent  # one per session, shared by workers
    site_dir, result = shared / "docs-site", shared / "docs-site.json"
    with open(shared / "docs-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            site_dir.mkdir(exist_ok=True)
            result.write_text(json.dumps(_build(site_dir)))
        return json.loads(result.read_text()), site_dir


def _build(site_dir: pathlib.Path) -> dict:
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site_dir)],
        cwd=ROOT, env=_environment(), capture_output=True, text=True,
        timeout=BUILD_TIMEOUT,
    )
    return {"returncode": build.returncode, "stderr": build.stderr}


def _inventory(site_dir: pathlib.Path) -> dict[str, str]:
    """{object name: its page and anchor} of the objects.inv mkdocstrings writes."""
    path = site_dir / "objects.inv"
    assert path.is_file(), f"the build wrote no {path.name}"
    data = path.read_bytes()
    for _ in range(4):  # a Sphinx inventory: 4 lines of header, then zlib
        data = data[data.index(b"\n") + 1:]
    entries = {}
    for line in zlib.decompress(data).decode().splitlines():
        name, _domain_role, _priority, uri, _shown = line.split(" ", 4)
        entries[name] = uri.replace("$", name)
    return entries


def test_the_site_builds_strictly(site):
    build, site_dir = site
    warnings = [line for line in build["stderr"].splitlines() if line.startswith("WARNING")]
    assert build["returncode"] == 0 and not warnings, (
        "mkdocs build --strict failed:\n"
        + ("\n".join(warnings) if warnings else build["stderr"][-3000:]))
    assert (site_dir / "index.html").is_file()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert (site_dir / "notebooks" / notebook.stem / "index.html").is_file(), notebook.name


def test_every_public_name_has_a_reference_entry(site):
    _, site_dir = site
    inventory = _inventory(site_dir)
    public = [f"strategykit.{name}" for name in strategykit.__all__]
    public += [f"strategykit.callbacks.{name}" for name in callbacks.__all__]
    missing = [name for name in public if name not in inventory]
    assert not missing, (
        f"no API reference entry for {', '.join(missing)}: add `::: <name>` to a page "
        "of docs/reference/")
    elsewhere = [name for name in public if not inventory[name].startswith("reference/")]
    assert not elsewhere, f"documented outside docs/reference/: {elsewhere}"


def test_every_docstring_example_runs(tmp_path):
    # Forked from the fork server (TensorFlow imported, its runtime not started), as a
    # fresh `python -m pytest --doctest-modules strategykit` would run them.
    script = tmp_path / "doctests.py"
    script.write_text(f"""import os, sys, pytest
os.chdir({str(ROOT)!r})
sys.exit(pytest.main(["--doctest-modules", "strategykit", "strategykit_console.py", "-q",
                      "-p", "no:xdist", "-p", "no:benchmark", "-p", "no:cacheprovider",
                      "-o", "addopts="]))
""")
    [run] = run_processes(str(script), [_environment()], timeout=BUILD_TIMEOUT, check=False)
    failed = run.returncode != 0
    assert not failed, "a docstring example failed:\n" + run.stdout[-6000:]
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed and int(passed.group(1)) >= 50, run.stdout[-2000:]
