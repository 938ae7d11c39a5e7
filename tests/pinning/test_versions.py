"""The supported versions are said once (strategykit/pinning/versions.py) and the same
everywhere: pyproject.toml's bounds, the matrix (noxfile.py), the Compatibility page,
the README, and the installed TensorFlow and Keras are inside them."""

import ast
import pathlib
import re

import keras
import tensorflow as tf
import tomllib

from strategykit.pinning import versions

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _dependencies() -> dict:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *project["optional-dependencies"]["keras-hub"]]
    return {re.split(r"[<>=!~ ]", spec)[0]: spec for spec in specs}


def test_pyproject_bounds_are_the_supported_ranges():
    dependencies = _dependencies()
    assert dependencies["tensorflow"] == "tensorflow" + ",".join(versions.TENSORFLOW_RANGE)
    assert dependencies["keras"] == "keras" + ",".join(versions.KERAS_RANGE)
    assert dependencies["keras-hub"] == "keras-hub" + ",".join(versions.KERAS_HUB_RANGE)


def test_every_checked_pair_and_fingerprinted_release_is_inside_the_range():
    def inside(version, bounds):
        number = tuple(int(part) for part in version.split(".")[:3])
        for bound in bounds:
            operator, limit = re.fullmatch(r"([<>]=?)([\d.]+)", bound).groups()
            limit = tuple(int(part) for part in limit.split("."))
            if not {"<": number < limit, "<=": number <= limit, ">": number > limit,
                    ">=": number >= limit}[operator]:
                return False
        return True

    for tensorflow, keras_version in versions.CHECKED_ON:
        assert inside(tensorflow, versions.TENSORFLOW_RANGE)
        assert inside(keras_version, versions.KERAS_RANGE)
    assert all(inside(release, versions.KERAS_RANGE)
               for release in versions.KERAS_FINGERPRINTED)
    assert versions.CHECKED_ON[-1][1] == versions.KERAS_FINGERPRINTED[-1]
    assert all(inside(release, versions.KERAS_HUB_RANGE)
               for release in versions.KERAS_HUB_FINGERPRINTED)
    assert versions.KERAS_HUB_RANGE[-1] == "<=" + versions.KERAS_HUB_FINGERPRINTED[-1]
    assert inside(tf.__version__, versions.TENSORFLOW_RANGE)
    assert inside(keras.__version__, versions.KERAS_RANGE)


def test_the_matrix_runs_every_checked_pair():
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    reads = [node for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value == "CHECKED_ON"]
    assert reads, "noxfile.py reads CHECKED_ON from strategykit/pinning/versions.py"
    assert "nox\n" in (ROOT / ".ci" / "run").read_text()


def test_the_compatibility_page_and_readme_name_every_checked_pair():
    page = (ROOT / "docs" / "compatibility.md").read_text()
    for tensorflow, keras_version in versions.CHECKED_ON:
        assert re.search(rf"^\| {re.escape(tensorflow)} \| {re.escape(keras_version)} \|",
                         page, re.MULTILINE), (tensorflow, keras_version)
    first, last = versions.KERAS_FINGERPRINTED[0], versions.KERAS_FINGERPRINTED[-1]
    assert f"every Keras release from {first} to {last}" in page.replace("**", "")
    readme = (ROOT / "README.md").read_text()
    assert "TensorFlow 2.18 to 2.21 with Keras 3.8 to 3.15.1" in readme
    assert "TensorFlow 2.18 to 2.21 with Keras 3.8 to 3.15.1" in page.replace("**", "")
    assert 'nox -s "matrix(' in readme
