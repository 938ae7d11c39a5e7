"""Running code when an optional package is imported (keras-hub, say).

A fix of an optional package's code (`Fix.package`) cannot be installed before the
package is imported, and importing it to install the fix would cost every program that
does not use it (keras-hub takes a second). `when_imported(name, callback)` calls
`callback()` at once when `name` is imported already, else right after its import
finishes, whenever the program imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable

_CALLBACKS: dict[str, list[Callable[[], None]]] = {}


def when_imported(name: str, callback: Callable[[], None]) -> None:
    """Calls `callback()` once `name` (a top-level package) is imported.

    Example:
        >>> calls = []
        >>> when_imported("json", lambda: calls.append("json"))
        >>> calls
        ['json']
    """
    if name in sys.modules:
        callback()
        return
    _CALLBACKS.setdefault(name, []).append(callback)
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the awaited packages as the other finders do, with a loader that runs the
    callbacks after the package's own code."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _CALLBACKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenCall(spec.loader, fullname)
                return spec
        return None


class _ThenCall(importlib.abc.Loader):
    def __init__(self, loader, name: str):
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        for callback in _CALLBACKS.pop(self._name, []):
            callback()

    def __getattr__(self, attribute):  # get_resource_reader, is_package, ...
        return getattr(self._loader, attribute)
