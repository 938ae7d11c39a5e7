"""`Fix`: one replaced upstream attribute, pinned to the upstream code it relies on."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect

CHECKED_ON = "TensorFlow 2.21.0, Keras 3.15.1"


@dataclasses.dataclass(frozen=True, eq=False)
class Fix:
    """One upstream fix: `owner.attribute` replaced by `replacement`.

    Attributes:
        issue: the upstream issue, e.g. `"keras-team/keras#20582"`.
        checked_on: the versions the fix and its fingerprints were checked on.
        owner: `"module:Class"` whose attribute is replaced, or `"module"` for a
            function of a module (looked up by the module's own code at each call).
        attribute: the name of the replaced attribute.
        replacement: the new attribute; it calls `original(owner_class, attribute)`
            where the fix does not apply.
        relies_on: `{"module:Class.attribute": fingerprint}` of the private upstream code
            the fix reads or calls; `fingerprint(name)` must still give these values.
    """

    issue: str
    checked_on: str
    owner: str
    attribute: str
    replacement: object
    relies_on: dict

    def owner_class(self):
        """The class (or module) whose attribute is replaced."""
        return resolve(self.owner)

    def installed(self) -> bool:
        return self.owner_class().__dict__.get(self.attribute) is self.replacement

    def install(self) -> None:
        owner = self.owner_class()
        if not self.installed():
            _ORIGINALS.setdefault((owner, self.attribute), owner.__dict__.get(self.attribute))
            setattr(owner, self.attribute, self.replacement)

    def uninstall(self) -> None:
        owner = self.owner_class()
        if not self.installed():
            return
        original = _ORIGINALS.pop((owner, self.attribute))
        if original is None:
            delattr(owner, self.attribute)
        else:
            setattr(owner, self.attribute, original)


_ORIGINALS: dict = {}


def resolve(name: str):
    """The object `"package.module:Class.attribute"` names (attribute path optional)."""
    module, _, path = name.partition(":")
    target = importlib.import_module(module)
    for part in filter(None, path.split(".")):
        target = inspect.getattr_static(target, part) if inspect.isclass(target) else getattr(
            target, part)
    return target.fget if isinstance(target, property) else target


def fingerprint(name: str) -> str:
    """The first 16 hex digits of the SHA-256 of the upstream source code `name` names.

    A name that a fix replaced is fingerprinted as upstream wrote it, installed or not.
    """
    module, _, path = name.partition(":")
    owner_name, _, attribute = f"{module}:{path}".rpartition(".") if "." in path else (
        module, None, path)
    code, owner = resolve(name), resolve(owner_name)
    if (owner, attribute) in _ORIGINALS and code is vars(owner).get(attribute):
        code = original(owner, attribute)
    return hashlib.sha256(inspect.getsource(code).encode()).hexdigest()[:16]


def original(owner: type, attribute: str):
    """The attribute `owner` inherits or had before a fix replaced it (for the fixes)."""
    if (owner, attribute) in _ORIGINALS and _ORIGINALS[(owner, attribute)] is not None:
        return _ORIGINALS[(owner, attribute)]
    return getattr(super(owner, owner), attribute)
