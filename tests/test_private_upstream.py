"""Private TensorFlow and Keras code is touched in `strategykit/upstream/` only.

There each access is pinned by fingerprint and checked at run time (`Fix`,
`PinnedAccess`); anywhere else it would break on an upgrade without a word. Read from
the source, as grep would: private modules imported (`tensorflow.python`, `keras.src`,
...), private attributes read, set or called (`x._name`, `getattr(x, "_name")`) on
anything but strategykit's own objects: a private name strategykit defines is its own
only where Keras and TensorFlow do not define it too (`_compute_loss` is Keras's).
"""

import ast
import functools
import pathlib

import strategykit

PACKAGE = pathlib.Path(strategykit.__file__).parent
SOURCES = sorted(path for path in PACKAGE.rglob("*.py")
                 if path.relative_to(PACKAGE).parts[0] != "upstream")
SOURCES.append(PACKAGE.parent / "strategykit_console.py")
PRIVATE_MODULES = ("tensorflow.python", "tensorflow.core", "tensorflow.compiler",
                   "tensorflow.tsl", "keras.src", "tf_keras.src")
STANDARD_LIBRARY = {"_exit", "_fields", "_asdict", "_replace", "_getframe"}
"""Private-looking names that are the standard library's public API (`os._exit`, a
namedtuple's `_fields`)."""
OTHER_LIBRARIES = {"_original_stdstream_copy"}
"""Private names of libraries other than TensorFlow and Keras, each read with a default:
ipykernel's copy of the kernel's own stderr (`strategykit.launcher.tensorflow_log`)."""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_private_names() -> set[str]:
    """The private names strategykit itself defines: functions, classes, variables,
    and attributes it sets on `self` or `cls`."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
    return {name for name in names if _is_private(name)}


@functools.lru_cache(maxsize=1)
def _upstream_private_names() -> frozenset[str]:
    """The private names Keras and TensorFlow's distribution and tf.data code define or
    use (read from their source): a name strategykit also defines (`_compute_loss`,
    `_clip_gradients`, ...) is still theirs when it is read off their objects."""
    import keras
    import tensorflow

    roots = [pathlib.Path(keras.__file__).parent / "src"] + [
        pathlib.Path(tensorflow.__file__).parent / "python" / part
        for part in ("distribute", "data", "eager")]
    names = set()
    for root in roots:
        for path in root.rglob("*.py"):
            if path.name.endswith("_test.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute):
                    names.add(node.attr)
    return frozenset(name for name in names if _is_private(name))


def _private_accesses(path: pathlib.Path, own: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names]
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            found += [f"{where}: imports {module}" for module in modules
                      if module.startswith(PRIVATE_MODULES)]
        attribute = None
        if isinstance(node, ast.Attribute) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            attribute = node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
            attribute = node.args[1].value
        if (isinstance(attribute, str) and _is_private(attribute) and attribute not in own
                and attribute not in STANDARD_LIBRARY | OTHER_LIBRARIES
                and not attribute.startswith("_strategykit")):
            found.append(f"{where}: .{attribute}")
    return found


def test_private_tensorflow_and_keras_code_is_touched_only_in_upstream():
    own = _own_private_names() - _upstream_private_names()
    found = [access for path in SOURCES for access in _private_accesses(path, own)]
    assert not found, (
        f"private upstream code touched outside strategykit/upstream/: {found}. Move the "
        "access into strategykit/upstream/ as a Fix or PinnedAccess, pinned by fingerprint.")


def test_the_check_sees_a_private_attribute_a_private_import_and_a_getattr(tmp_path):
    source = tmp_path / "example.py"
    source.write_text("from tensorflow.python.eager import context\n"
                      "def f(strategy, dataset):\n"
                      "    strategy._collective_key_base = 1\n"
                      "    return getattr(strategy.extended, '_cross_device_ops'), "
                      "dataset._inputs()\n")
    assert _private_accesses(source, own=set()) == [
        "example.py:1: imports tensorflow.python.eager", "example.py:3: ._collective_key_base",
        "example.py:4: ._cross_device_ops", "example.py:4: ._inputs"]


def test_a_private_keras_name_that_strategykit_also_defines_is_still_caught(tmp_path):
    own = _own_private_names()
    assert {"_compute_loss", "_clip_gradients"} <= own  # strategykit defines both
    source = tmp_path / "example.py"
    source.write_text("def f(model, optimizer, helper):\n"
                      "    model._compute_loss(None)\n"
                      "    optimizer._clip_gradients([])\n"
                      "    return helper._reading_position\n")
    guarded = own - _upstream_private_names()
    assert sorted(_private_accesses(source, guarded)) == [
        "example.py:2: ._compute_loss", "example.py:3: ._clip_gradients",
        "example.py:4: ._reading_position"]
    assert sorted(_private_accesses(source, guarded | {"_reading_position"})) == [
        "example.py:2: ._compute_loss", "example.py:3: ._clip_gradients"]
